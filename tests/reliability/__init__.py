"""Reliability tests: the run lifecycle under load and faults, with real OS processes."""
