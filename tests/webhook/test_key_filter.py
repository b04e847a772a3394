"""The Bloom filter in front of the idempotency index: it may say "maybe" for an unknown key, never
"absent" for a recorded one, whether the key was recorded before start-up (loaded in the
background) or after; the index answers the same with and without it."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.webhook.dedupe import INDEX_FILE, DedupeIndex, KeyEntry, body_hash, key_hash
from headrace.webhook.key_filter import KeyFilter


@given(recorded=st.sets(st.text(max_size=20), max_size=300), probes=st.lists(st.text(max_size=20), max_size=50))
def test_a_recorded_key_is_never_reported_absent(recorded: set[str], probes: list[str]) -> None:
    key_filter = KeyFilter(1 << 10)
    key_filter.add_all(key_hash(key) for key in recorded)
    key_filter.complete = True
    assert all(key_filter.might_contain(key_hash(key)) for key in recorded)
    for key in probes:
        if not key_filter.might_contain(key_hash(key)):
            assert key not in recorded


def test_an_incomplete_filter_says_maybe_and_a_roomy_one_rejects_most_unknown_keys() -> None:
    key_filter = KeyFilter(1 << 20)
    key_filter.add_all(key_hash(str(n)) for n in range(10_000))
    assert key_filter.might_contain(key_hash("unknown"))  # not loaded yet: everything is "maybe"
    key_filter.complete = True
    false_positives = sum(key_filter.might_contain(key_hash(f"x{n}")) for n in range(10_000))
    assert false_positives < 50
    key_filter.clear()
    assert not key_filter.might_contain(key_hash("0"))


def wait_complete(index: DedupeIndex) -> None:
    for _ in range(500):
        if index._filter is not None and index._filter.complete:  # noqa: SLF001 - the background load's end
            return
        time.sleep(0.01)
    raise AssertionError("the filter never finished loading")


@settings(max_examples=20, deadline=None)
@given(before=st.sets(st.integers(0, 500), max_size=60), after=st.sets(st.integers(0, 500), max_size=60),
       probes=st.sets(st.integers(0, 500), max_size=60), write_behind=st.booleans())
def test_lookups_answer_the_same_with_the_filter(tmp_path_factory: object, before: set[int], after: set[int],
                                                 probes: set[int], write_behind: bool) -> None:
    directory: Path = tmp_path_factory.mktemp("index")  # type: ignore[attr-defined]
    def entries(keys: set[int]) -> list[tuple[bytes, KeyEntry]]:
        return [(key_hash(str(key)), KeyEntry(key, body_hash(b"x"), key * 10)) for key in sorted(keys)]

    plain = DedupeIndex(directory / INDEX_FILE, write_behind=write_behind)
    plain.record(entries(before), covered_offset=1)
    plain.close()  # recorded before start-up: the filtered index loads these in the background
    filtered = DedupeIndex(directory / INDEX_FILE, write_behind=write_behind, filter_bytes=1 << 12)
    wait_complete(filtered)
    filtered.record(entries(after), covered_offset=2)
    reference = DedupeIndex(directory / "reference.rocksdb", write_behind=write_behind)
    reference.record(entries(before) + entries(after), covered_offset=2)
    asked = [key_hash(str(key)) for key in sorted(probes | before | after)]
    assert filtered.lookup(asked) == reference.lookup(asked)
    filtered.close()
    reference.close()
