"""Indexes as in-memory arrangements (Materialize's term): a dict from the indexed columns' values to the
relation's rows, kept in the server process and answered from without the serving store (coordinator/fast_path.py).

An arrangement is an in-process subscription: it starts from a snapshot of the relation (its public form,
as `SELECT *` shows it) and applies the relation's changelog after it, read exactly as SUBSCRIBE reads it
(coordinator/subscribe.py). Reads are consistent: `current()` first catches up to everything committed
when it was called, which costs one integer comparison when nothing was committed since
(ServingStore.commit_count, bumped after every data commit). A background task also tails the changelog,
so a read after a commit rarely waits.

Rows are tuples of Python values as SUBSCRIBE reads them from either serving store: on DuckDB as DuckDB returns
them for the public relation (jsonb normalized as run_query does), on PostgreSQL decoded from PostgreSQL's text by
headrace's type codecs (coordinator/subscribe_postgres.py: integers, booleans and text as psycopg gives them); each
key holds a list of rows (a multiset: a relation may repeat a row). Nothing here is dialect-specific: every read
goes through SubscriptionStream, one read-only transaction each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from headrace.coordinator.responses import Column
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ChangelogCompacted, ServingStore

if TYPE_CHECKING:
    from headrace.coordinator.subscribe import SubscribeTarget

log = logging.getLogger(__name__)

Row = tuple[Any, ...]
Key = tuple[Any, ...]
TAIL_INTERVAL_S = 0.05
Store = ServingStore | PostgresServingStore


class Arrangement:
    """One index's rows by key. Build with `start()`; read with `await current()`; `close()` stops tailing."""

    def __init__(self, store: Store, executor: ThreadPoolExecutor, target: SubscribeTarget,
                 columns: Sequence[Column], key_positions: Sequence[int],
                 alive: Callable[[], bool] = lambda: True) -> None:
        """`alive`: whether the indexed relation still exists; the tail stops (and closes) once it does not."""
        from headrace.coordinator.subscribe import SubscriptionStream

        self.store = store
        self.executor = executor
        self.columns = tuple(columns)
        self.key_positions = tuple(key_positions)
        self.rows: dict[Key, list[Row]] = {}
        self._reader = SubscriptionStream(store, executor, target, columns, snapshot=True, progress=False,
                                          as_of=None, up_to=None)
        self._position: int | None = None  # the commit timestamp the rows reflect
        self._seen_commits = -1  # store.commit_count before the last catch-up read
        self._lock = asyncio.Lock()
        self._tail: asyncio.Task[None] | None = None
        self._closed = False
        self._alive = alive
        self.row_count = 0

    def key_of(self, row: Row) -> Key:
        return tuple(row[i] for i in self.key_positions)

    @property
    def is_current(self) -> bool:
        return self._seen_commits == self.store.commit_count

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> None:
        await self.current()
        if self._tail is None:
            self._tail = asyncio.ensure_future(self._tail_changes())

    async def current(self) -> dict[Key, list[Row]]:
        """The rows by key, reflecting at least every commit made before this call."""
        if self._seen_commits != self.store.commit_count:
            async with self._lock:
                if self._seen_commits != self.store.commit_count:
                    await self._catch_up()
        return self.rows

    async def _catch_up(self) -> None:
        commits = self.store.commit_count  # before the read: the read sees at least these commits
        loop = asyncio.get_running_loop()
        if self._position is not None:
            try:
                position, changes, _ = await loop.run_in_executor(self.executor, self._reader._read_changes,
                                                                  self._position)
            except ChangelogCompacted:  # fell behind the retention: start again from a snapshot
                self._position = None
            else:
                self._apply(changes)
                self._position = position
        if self._position is None:
            position, rows, count = await loop.run_in_executor(self.executor, self._build_snapshot)
            self.rows, self._position, self.row_count = rows, position, count
        self._seen_commits = commits

    def _build_snapshot(self) -> tuple[int, dict[Key, list[Row]], int]:
        """(position, rows by key, row count), built in a worker thread into a fresh dict."""
        position = None
        while position is None:  # never None without AS OF
            position, output_rows = self._reader._read_snapshot()
        rows: dict[Key, list[Row]] = {}
        count = 0
        for output in output_rows:
            row = output[2:]
            key = self.key_of(row)
            if None in key:
                continue  # equality never matches NULL
            rows.setdefault(key, []).append(row)
            count += 1
        return position, rows, count

    def _apply(self, changes: Sequence[Row]) -> None:
        """Changes (hr_timestamp, hr_diff, *row) in timestamp order, retractions first within one."""
        rows = self.rows
        for change in changes:
            diff, row = change[1], change[2:]
            key = self.key_of(row)
            if None in key:
                continue
            if diff > 0:
                rows.setdefault(key, []).extend([row] * diff)
                self.row_count += diff
                continue
            held = rows.get(key)
            for _ in range(-diff):
                if held and row in held:
                    held.remove(row)
                    self.row_count -= 1
            if held is not None and not held:
                del rows[key]

    async def _tail_changes(self) -> None:
        while not self._closed:
            await asyncio.sleep(TAIL_INTERVAL_S)
            if not self._alive():  # its relation was dropped: no reader may see these rows any more
                self._closed = True
                return
            try:
                await self.current()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a read that fails now is retried at the next tick or read
                log.exception("index arrangement failed to catch up")
                await asyncio.sleep(1)

    def close(self) -> None:
        self._closed = True
        if self._tail is not None:
            self._tail.cancel()
            self._tail = None


class Arrangements:
    """The arrangements of every index, by index id."""

    def __init__(self, store: Store, executor: ThreadPoolExecutor) -> None:
        self.store = store
        self.executor = executor
        self._by_index: dict[str, Arrangement] = {}

    def get(self, index_id: str) -> Arrangement | None:
        return self._by_index.get(index_id)

    async def ensure(self, index_id: str, make: Callable[[], Arrangement]) -> Arrangement:
        arrangement = self._by_index.get(index_id)
        if arrangement is None:
            arrangement = make()
            self._by_index[index_id] = arrangement
            try:
                await arrangement.start()
            except BaseException:
                self._by_index.pop(index_id, None)
                arrangement.close()
                raise
        return arrangement

    def drop(self, index_id: str) -> None:
        arrangement = self._by_index.pop(index_id, None)
        if arrangement is not None:
            arrangement.close()

    def close(self) -> None:
        for index_id in list(self._by_index):
            self.drop(index_id)
