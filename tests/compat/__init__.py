"""Differential harness: headrace against a real PostgreSQL 15 (docs/compat.md)."""
