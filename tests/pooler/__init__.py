"""Pooler tests: the Engine DB through PgBouncer in transaction and session pool mode."""
