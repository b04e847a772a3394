"""Which serving store a data directory keeps its rows in, chosen once (docs/store.md).

Sources', tables' and views' rows live either in the store PostgreSQL (the default) or in the DuckDB file
`<data>/store.duckdb`. The two hold different rows, so a data directory keeps the choice made at its first start in
`<data>/serving-store` and later starts follow it: `headrace up` without `--serving-store` reopens what is there,
and a `--serving-store` naming the other one is refused rather than starting on an empty store beside the rows.
A data directory made before the choice was recorded, holding `store.duckdb`, is a DuckDB one.
"""

from __future__ import annotations

from pathlib import Path

SERVING_STORES = ("postgres", "duckdb")
DEFAULT_SERVING_STORE = "postgres"
CHOICE_FILE = "serving-store"
DUCKDB_FILE = "store.duckdb"


class ServingStoreMismatch(Exception):
    """`--serving-store` names another store than the one the data directory's rows are in."""


def recorded_serving_store(data_dir: Path) -> str | None:
    """The data directory's serving store, if it has one yet."""
    try:
        recorded = (data_dir / CHOICE_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return "duckdb" if (data_dir / DUCKDB_FILE).exists() else None
    if recorded not in SERVING_STORES:
        raise ServingStoreMismatch(f"{data_dir / CHOICE_FILE} says {recorded!r}: expected one of "
                                   f"{', '.join(SERVING_STORES)}")
    return recorded


def choose_serving_store(data_dir: Path, requested: str | None) -> str:
    """The serving store to open (`requested`: --serving-store, None when not given), recorded in the data
    directory for the next start."""
    recorded = recorded_serving_store(data_dir)
    if requested is not None and recorded is not None and requested != recorded:
        raise ServingStoreMismatch(
            f"{data_dir} keeps its sources', tables' and views' rows in the {_describe(recorded)}; "
            f"--serving-store {requested} would start on an empty store beside them. Start without --serving-store "
            f"(or with --serving-store {recorded}), or use a new --data-dir")
    chosen = requested or recorded or DEFAULT_SERVING_STORE
    choice_file = data_dir / CHOICE_FILE
    if not choice_file.exists():
        temporary = choice_file.with_name(CHOICE_FILE + ".tmp")
        temporary.write_text(chosen + "\n", encoding="utf-8")
        temporary.replace(choice_file)
    return chosen


def _describe(store: str) -> str:
    return "store PostgreSQL" if store == "postgres" else f"DuckDB file {DUCKDB_FILE}"
