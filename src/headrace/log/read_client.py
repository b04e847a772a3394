"""The client of the log read service (log/read_service.py): a LogAccess (log/access.py) over the network, used by
the pipeline's Spark data sources on executors and remote drivers, and by read_replaced.

Stdlib HTTP (one keep-alive connection per process and server) and pyarrow only: it runs inside Spark Python
workers. Picklable: Spark ships the stream reader (and this with it) to executors; the connection is not shipped."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

from headrace.log.read_service import API_PREFIX, ARROW_STREAM_TYPE, decode_records

TIMEOUT_S = 60.0
_local = threading.local()  # per thread: {(host, port): HTTPConnection}


class LogReadError(Exception):
    """The log read service refused or failed a request (its status and message), or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RemoteLogAccess:
    """One log (`log_id`) of the headrace server at `base_url` (http://host:port), read with `token`."""

    def __init__(self, base_url: str, token: str, log_id: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"the log read service address must be http://host:port, not {base_url!r}")
        self.base_url = base_url
        self.token = token
        self.log_id = log_id
        self._address = (parts.hostname, parts.port)

    def scan_end(self, start: int) -> int:
        return int(self._json("end", {"start": start})["end"])

    def scan_capped(self, start: int, max_records: int) -> tuple[int, list[int]]:
        answer = self._json("end", {"start": start, "max_records": max_records})
        return int(answer["end"]), [int(b) for b in answer["boundaries"]]

    def records(self, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        if end <= start:
            return iter(())
        return iter(list(decode_records(self._request("GET", "records", {"start": start, "end": end},
                                                      expect=ARROW_STREAM_TYPE))))

    def records_at(self, offsets: Sequence[int]) -> list[tuple[int, bytes]]:
        if not offsets:
            return []
        body = json.dumps({"offsets": list(offsets)}).encode()
        return list(decode_records(self._request("POST", "records-at", {}, body, expect=ARROW_STREAM_TYPE)))

    def _json(self, action: str, query: dict[str, int]) -> dict[str, Any]:
        return json.loads(self._request("GET", action, query, expect="application/json"))  # type: ignore[no-any-return]

    def _request(self, method: str, action: str, query: dict[str, int], body: bytes | None = None, *,
                 expect: str) -> bytes:
        path = f"{API_PREFIX}{self.log_id}/{action}" + (f"?{urlencode(query)}" if query else "")
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):  # a kept-alive connection the server has closed meanwhile fails once: reconnect
            connection = self._connection(fresh=attempt == 2)
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()  # a cut stream raises here (IncompleteRead), never passes as whole
            except (ConnectionError, http.client.HTTPException, OSError) as error:
                connection.close()
                if attempt == 2:
                    raise LogReadError(f"log read service at {self.base_url} unreachable: {error}") from error
                continue
            if response.status != 200:
                raise LogReadError(f"log read service: {response.status} {data.decode(errors='replace').strip()}"
                                   f" ({method} {path.split('?')[0]})", response.status)
            if not (response.getheader("Content-Type") or "").startswith(expect):
                raise LogReadError(f"log read service: unexpected content type {response.getheader('Content-Type')}")
            return data
        raise AssertionError("unreachable")

    def _connection(self, fresh: bool) -> http.client.HTTPConnection:
        connections: dict[tuple[str, int], http.client.HTTPConnection] = _local.__dict__.setdefault("connections", {})
        connection = connections.get(self._address)
        if connection is None or fresh:
            if connection is not None:
                connection.close()
            connection = http.client.HTTPConnection(*self._address, timeout=TIMEOUT_S)
            connections[self._address] = connection
        return connection

    def __repr__(self) -> str:
        return f"the log {self.log_id} at {self.base_url}"


def log_access_from_options(options: Any) -> Any:
    """The LogAccess a pipeline data source's options name: `service` + `token` + `log` (the network; any master
    but local[...]) or `path` (the log's directory on this host)."""
    from pathlib import Path

    from headrace.log.access import FileLogAccess

    if options.get("service"):
        return RemoteLogAccess(options["service"], options.get("token", ""), options["log"])
    return FileLogAccess(Path(options["path"]))
