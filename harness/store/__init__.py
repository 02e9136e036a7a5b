"""The store: runs and cases in SQLite or PostgreSQL (SQLAlchemy), and its migrations."""
