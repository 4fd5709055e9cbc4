"""Triggers of deferred waits."""
