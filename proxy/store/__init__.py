"""The detection log: SQLAlchemy models, the batched writer, shared queries."""
