"""headrace: streaming SQL over idempotent webhooks, materialized exactly once through a Spark pipeline."""

__version__ = "0.1.0"
