"""headrace.materialize.reduce: Flow's reduction strategies, combining documents of one key."""

from headrace.materialize.reduce.strategies import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Document,
    Reducer,
    combine_lww,
    reducer_for,
)

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "Document", "Reducer", "combine_lww", "reducer_for"]
