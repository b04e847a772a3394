"""log/read_service.py: the protocol on a real log, without sockets (authentication, ranges, the end of the complete
records, offset lookups, errors), then once through the aiohttp transport and the client (log/read_client.py), which
the pipeline's data sources read through on a cluster."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.log.access import FileLogAccess
from headrace.log.read_client import LogReadError, RemoteLogAccess, log_access_from_options
from headrace.log.read_service import (
    ARROW_STREAM_TYPE,
    TOKEN_FILE,
    LogReadService,
    LogReply,
    decode_records,
    start_log_read_service,
    write_token,
)
from headrace.log.segments import SegmentedLog
from headrace.pipeline.log_source import LogStreamReader
from headrace.pipeline.view_changes import read_replaced
from headrace.webhook.record import WebhookRecord, encode

TOKEN = "t" * 43


def _log(directory: Path, records: int, start: int = 0) -> list[int]:
    """Append `records` webhook records; their offsets."""
    log = SegmentedLog(directory)
    offsets = log.append_offsets([encode(WebhookRecord(1_700_000_000_000_000, f"k{n}", None, b'{"n":%d}' % n))
                          for n in range(start, start + records)])
    log.sync()
    log.close()
    return list(offsets)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    root = tmp_path / "logs"
    (root / "u1").mkdir(parents=True)
    _log(root / "u1", 20_000)
    return root


def _body(reply: LogReply) -> bytes:
    return reply.body if isinstance(reply.body, bytes) else b"".join(reply.body)


def _get(service: LogReadService, path: str, **query: object) -> LogReply:
    return service.respond("GET", path, {k: str(v) for k, v in query.items()}, f"Bearer {TOKEN}")


def test_ranges_come_back_as_the_records_the_files_hold(logs: Path) -> None:
    service = LogReadService(logs, TOKEN)
    files = FileLogAccess(logs / "u1")
    end = json.loads(_body(_get(service, "/log/v1/u1/end", start=0)))["end"]
    assert end == files.scan_end(0) > 0
    middle = [offset for offset, _ in files.records(0, end)][12_345]
    reply = _get(service, "/log/v1/u1/records", start=middle, end=end)
    assert reply.status == 200 and reply.content_type == ARROW_STREAM_TYPE
    assert list(decode_records(_body(reply))) == list(files.records(middle, end))
    empty = _get(service, "/log/v1/u1/records", start=end, end=end)
    assert list(decode_records(_body(empty))) == []


def test_capped_scan_gives_the_end_and_boundaries_the_files_give(logs: Path) -> None:
    service = LogReadService(logs, TOKEN)
    answer = json.loads(_body(_get(service, "/log/v1/u1/end", start=0, max_records=5_000)))
    assert (answer["end"], answer["boundaries"]) == FileLogAccess(logs / "u1").scan_capped(0, 5_000)
    assert len(answer["boundaries"]) == 2


def test_a_record_being_written_is_not_offered(logs: Path) -> None:
    """The end is that of the complete records: a torn tail (a record half written) is not part of it."""
    service = LogReadService(logs, TOKEN)
    end = json.loads(_body(_get(service, "/log/v1/u1/end", start=0)))["end"]
    segment = sorted((logs / "u1").glob("*.log"))[-1]
    with open(segment, "r+b") as file:  # a header claiming 100 bytes, 3 of them written
        base = int(segment.stem)
        file.seek(end - base)
        file.write((100).to_bytes(4, "big") + (12345).to_bytes(4, "big") + b"abc")
    assert json.loads(_body(_get(service, "/log/v1/u1/end", start=0)))["end"] == end


def test_offset_lookups_answer_in_request_order_and_a_miss_is_404(logs: Path) -> None:
    service = LogReadService(logs, TOKEN)
    offsets = [offset for offset, _ in FileLogAccess(logs / "u1").records(0, FileLogAccess(logs / "u1").scan_end(0))]
    wanted = [offsets[7], offsets[3], offsets[19_999]]
    reply = service.respond("POST", "/log/v1/u1/records-at", {}, f"Bearer {TOKEN}",
                            json.dumps({"offsets": wanted}).encode())
    assert [offset for offset, _ in decode_records(_body(reply))] == wanted
    miss = service.respond("POST", "/log/v1/u1/records-at", {}, f"Bearer {TOKEN}",
                           json.dumps({"offsets": [offsets[7] + 1]}).encode())
    assert miss.status == 404 and b"no record at offset" in _body(miss)


def test_authentication(logs: Path) -> None:
    service = LogReadService(logs, TOKEN)
    missing = service.respond("GET", "/log/v1/u1/end", {"start": "0"}, None)
    assert missing.status == 401 and missing.headers["WWW-Authenticate"].startswith("Bearer")
    assert service.respond("GET", "/log/v1/u1/end", {"start": "0"}, "Basic dTpw").status == 401
    assert service.respond("GET", "/log/v1/u1/end", {"start": "0"}, "Bearer " + "x" * 43).status == 403
    assert service.respond("GET", "/log/v1/u1/end", {"start": "0"}, "Bearer " + TOKEN[:-1]).status == 403
    # Nothing is told to a client without the token, not even whether a log exists.
    assert service.respond("GET", "/log/v1/nope/end", {"start": "0"}, None).status == 401
    with pytest.raises(ValueError):
        LogReadService(logs, "short")


@pytest.mark.parametrize(("method", "path", "query", "status"), [
    ("GET", "/log/v1/u1/end", {}, 400),  # no start
    ("GET", "/log/v1/u1/end", {"start": "-1"}, 400),
    ("GET", "/log/v1/u1/end", {"start": "0", "max_records": "0"}, 400),
    ("GET", "/log/v1/u1/records", {"start": "10", "end": "5"}, 400),
    ("GET", "/log/v1/..%2F..%2Fetc/end", {"start": "0"}, 400),  # never a path outside the logs
    ("GET", "/log/v1/../end", {"start": "0"}, 400),
    ("GET", "/log/v1/u9/records", {"start": "0", "end": "0"}, 404),
    ("POST", "/log/v1/u9/records-at", {}, 404),
    ("GET", "/log/v1/u1/delete", {}, 404),
    ("GET", "/elsewhere", {}, 404),
    ("POST", "/log/v1/u1/end", {"start": "0"}, 405),
    ("GET", "/log/v1/u1/records-at", {}, 405),
])
def test_bad_requests(logs: Path, method: str, path: str, query: dict[str, str], status: int) -> None:
    reply = LogReadService(logs, TOKEN).respond(method, path, query, f"Bearer {TOKEN}")
    assert reply.status == status, _body(reply)
    assert _body(reply).strip()  # a message says what is wrong


def test_a_log_not_made_yet_ends_where_it_starts(logs: Path) -> None:
    """As reading the files: the pipeline may ask before the log's directory exists, and must not fail for it."""
    reply = _get(LogReadService(logs, TOKEN), "/log/v1/u9/end", start=0, max_records=10)
    assert json.loads(_body(reply)) == {"end": 0, "boundaries": []}


def test_a_range_that_is_not_whole_records_fails(logs: Path) -> None:
    service = LogReadService(logs, TOKEN)
    reply = _get(service, "/log/v1/u1/records", start=3, end=100)  # 3 is inside the first record
    assert reply.status == 500
    bad_body = service.respond("POST", "/log/v1/u1/records-at", {}, f"Bearer {TOKEN}", b'{"offsets": ["x"]}')
    assert bad_body.status == 400


def test_the_token_file_is_private_and_new_at_each_start(tmp_path: Path) -> None:
    first, second = write_token(tmp_path), write_token(tmp_path)
    assert first != second and len(second) >= 40
    assert (tmp_path / TOKEN_FILE).read_text() == second
    assert (os.stat(tmp_path / TOKEN_FILE).st_mode & 0o777) == 0o600


@pytest.fixture
def served(logs: Path) -> Iterator[str]:
    """The service on a real socket (aiohttp, a loop in a thread); its base URL."""
    loop = asyncio.new_event_loop()
    started: dict[str, object] = {}
    ready = threading.Event()

    async def main() -> None:
        server = await start_log_read_service(LogReadService(logs, TOKEN), "127.0.0.1", 0)
        started.update(server=server, url=f"http://{server.address[0]}:{server.address[1]}")
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(main()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield str(started["url"])
    asyncio.run_coroutine_threadsafe(started["server"].close(), loop).result(10)  # type: ignore[attr-defined]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_the_client_over_the_network_reads_what_the_files_hold(logs: Path, served: str) -> None:
    remote = RemoteLogAccess(served, TOKEN, "u1")
    files = FileLogAccess(logs / "u1")
    remote = pickle.loads(pickle.dumps(remote))  # as Spark ships it to an executor
    end = remote.scan_end(0)
    assert end == files.scan_end(0)
    assert remote.scan_capped(0, 3_000) == files.scan_capped(0, 3_000)
    assert list(remote.records(0, end)) == list(files.records(0, end))
    offsets = [offset for offset, _ in files.records(0, end)]
    assert remote.records_at([offsets[5], offsets[1]]) == files.records_at([offsets[5], offsets[1]])
    with pytest.raises(LogReadError) as refused:
        RemoteLogAccess(served, "w" * 43, "u1").scan_end(0)
    assert refused.value.status == 403
    with pytest.raises(LogReadError) as missing:
        remote.records_at([offsets[5] + 1])
    assert missing.value.status == 404


def test_the_pipeline_reads_the_same_through_either_path(logs: Path, served: str) -> None:
    """The data source's reader (latestOffset, partitions, read, getCache) and read_replaced, over the files and
    over the service: the same rows."""
    local = LogStreamReader(log_access_from_options({"path": str(logs / "u1")}), 0, max_records=50_000)
    network = LogStreamReader(log_access_from_options({"service": served, "token": TOKEN, "log": "u1"}), 0,
                              max_records=50_000)
    end = local.latestOffset()
    assert network.latestOffset() == end
    for reader in (local, network):
        assert [p.__dict__ for p in reader.partitions({"offset": 0}, end)] == \
            [p.__dict__ for p in local.partitions({"offset": 0}, end)]
    rows = [[b.to_pylist() for p in r.partitions({"offset": 0}, end) for b in r.read(p)] for r in (local, network)]
    assert rows[0] == rows[1]
    cached = [list(r.getCache({"offset": 0}, {"offset": 4_096}) or []) for r in (local, network)]
    assert cached[0] == cached[1]
    offsets = [offset for offset, _ in FileLogAccess(logs / "u1").records(0, end["offset"])][100:103]
    assert read_replaced(logs / "u1", offsets, [1, 2, 3]).equals(
        read_replaced(RemoteLogAccess(served, TOKEN, "u1"), offsets, [1, 2, 3]))
