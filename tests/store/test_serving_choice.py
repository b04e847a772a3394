"""A data directory's serving store is chosen at its first start and kept (store/serving_choice.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.store.serving_choice import ServingStoreMismatch, choose_serving_store, recorded_serving_store


def test_a_new_data_directory_takes_postgres_and_keeps_it(tmp_path: Path) -> None:
    assert recorded_serving_store(tmp_path) is None
    assert choose_serving_store(tmp_path, None) == "postgres"
    assert (tmp_path / "serving-store").read_text() == "postgres\n"
    assert choose_serving_store(tmp_path, None) == "postgres"
    assert choose_serving_store(tmp_path, "postgres") == "postgres"


def test_an_explicit_choice_is_recorded_and_followed_by_later_starts(tmp_path: Path) -> None:
    assert choose_serving_store(tmp_path, "duckdb") == "duckdb"
    assert choose_serving_store(tmp_path, None) == "duckdb"


def test_the_other_store_is_refused_once_chosen(tmp_path: Path) -> None:
    choose_serving_store(tmp_path, "postgres")
    with pytest.raises(ServingStoreMismatch, match="store PostgreSQL; --serving-store duckdb would start on an empty"):
        choose_serving_store(tmp_path, "duckdb")


def test_a_data_directory_from_before_the_record_with_a_duckdb_file_is_duckdb(tmp_path: Path) -> None:
    (tmp_path / "store.duckdb").write_bytes(b"")
    assert recorded_serving_store(tmp_path) == "duckdb"
    assert choose_serving_store(tmp_path, None) == "duckdb"
    with pytest.raises(ServingStoreMismatch):
        choose_serving_store(tmp_path, "postgres")


def test_a_damaged_record_is_an_error_not_a_guess(tmp_path: Path) -> None:
    (tmp_path / "serving-store").write_text("oracle\n")
    with pytest.raises(ServingStoreMismatch, match="expected one of postgres, duckdb"):
        choose_serving_store(tmp_path, None)
