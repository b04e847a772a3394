"""The catalog: sources (and later tables, views, sinks, secrets), persisted by their CREATE statements."""
