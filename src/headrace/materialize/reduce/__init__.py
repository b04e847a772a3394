"""headrace.materialize.reduce: Flow's reduction strategies, combining documents of one key."""

from headrace.materialize.reduce.schema import SchemaReducer, Strategy, parse_strategy, reducer_for_schema
from headrace.materialize.reduce.strategies import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Document,
    Reducer,
    combine_lww,
    reducer_for,
)
from headrace.materialize.reduce.values import NotAssociativeError, ReductionError, compare

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "Document", "NotAssociativeError", "Reducer", "ReductionError",
           "SchemaReducer", "Strategy", "combine_lww", "compare", "parse_strategy", "reducer_for",
           "reducer_for_schema"]
