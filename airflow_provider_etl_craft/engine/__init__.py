"""The Engine DB: URLs, dialects, locks, schema, migrations."""
