"""The coordinator's durable state: studies, devices, contributions, results and the audit log,
in SQLite (WAL); every acknowledged message is committed before the reply."""
