"""Example DAGs a new user can run as they are (``make demo`` runs them with ``dag.test()``)."""
