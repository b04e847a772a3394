"""From a validated request to a durable record: one log per webhook source, and their registry.

The coordinator fills the registry on CREATE/DROP SOURCE and at start; the HTTP layer looks
sources up by (database, schema, name) and awaits `ingest`, which returns once the record is
fsync'd. Log directories are named by the source's stable id, so DROP + CREATE starts afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from headrace.catalog.items import WebhookSource
from headrace.errors import DuplicateObject
from headrace.log.group_commit import GroupCommitter
from headrace.log.segments import SegmentedLog
from headrace.webhook.handler import WebhookHandler
from headrace.webhook.record import encode

SourceKey = tuple[str, str, str]  # (database, schema, name)


class SourceIngestor:
    """Validates requests for one source and appends them durably to its log."""

    def __init__(self, source: WebhookSource, log_dir: Path) -> None:
        self.source = source
        self.log_dir = log_dir
        self.handler = WebhookHandler(source)  # first: a bad expression must not leave a log open
        self._log = SegmentedLog(log_dir)
        self._committer = GroupCommitter(self._log)

    async def ingest(self, headers: Sequence[tuple[str, str]], body: bytes, received_at_us: int) -> int:
        """Validate (WebhookRejected) and append; returns the record's offset once it is durable.
        Raises ServiceUnavailable when the log cannot be written."""
        record = self.handler.validate(headers, body, received_at_us)
        return await self._committer.append(encode(record))

    @property
    def failure(self) -> str | None:
        """Why the log refuses writes (after an fsync error it needs reopening), or None."""
        return self._committer.failure

    async def close(self) -> None:
        """Finish the appends already queued, then close the log."""
        await self._committer.close()
        self._log.close()


class IngestRegistry:
    def __init__(self) -> None:
        self._ingestors: dict[SourceKey, SourceIngestor] = {}

    def add(self, source: WebhookSource, log_dir: Path) -> SourceIngestor:
        key = (source.database, source.schema, source.name)
        if key in self._ingestors:
            raise DuplicateObject(f'webhook source "{".".join(key)}" is already registered')
        ingestor = SourceIngestor(source, log_dir)
        self._ingestors[key] = ingestor
        return ingestor

    async def remove(self, database: str, schema: str, name: str) -> None:
        """Stop taking requests for the source (at once), then finish and close its log."""
        ingestor = self._ingestors.pop((database, schema, name), None)
        if ingestor is not None:
            await ingestor.close()

    def lookup(self, database: str, schema: str, name: str) -> SourceIngestor | None:
        return self._ingestors.get((database, schema, name))

    def __len__(self) -> int:
        return len(self._ingestors)

    async def close_all(self) -> None:
        ingestors = list(self._ingestors.values())
        self._ingestors.clear()
        for ingestor in ingestors:
            await ingestor.close()
