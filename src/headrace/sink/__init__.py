"""Sinks: a relation's committed changes materialized into an external system through a driver (seed 001)."""
