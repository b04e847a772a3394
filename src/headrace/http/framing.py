"""HTTP/1.1 request framing for the webhook fast path, sans-I/O: bytes in, parsed pieces out.

httptools (llhttp) parses and validates each request head; the body's extent (Content-Length, or
chunked framing decoded here) is computed here rather than by llhttp, because the fast path must
know exactly where every request starts in the byte stream: a request it does not handle is
handed to aiohttp as the raw bytes from that request's first byte on.
"""

from __future__ import annotations

import email.utils
import re
import time
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from headrace.http.webhook_endpoint import Reply

MAX_HEAD_BYTES = 16 << 10  # beyond it without the end of the head: not ours (aiohttp answers 431/400)
WEBHOOK_PREFIX = b"/api/webhook/"


class TooLarge(Exception):
    """The decoded body grew over the limit."""


class BadFraming(Exception):
    """Chunked framing that cannot be decoded."""


@dataclass(slots=True)
class RequestHead:
    method: str
    segments: tuple[str, str, str]  # (database, schema, name), percent-decoded
    headers: list[tuple[str, str]]
    content_length: int | None
    chunked: bool
    keep_alive: bool
    # Names lower-cased -> values, as the webhook handler reads headers, built while splitting them
    # (the handler need not build it again); None if the head is not ASCII or repeats a header.
    header_map: dict[str, str] | None = None


class _UrlCollector:
    """llhttp's callbacks: the URL only. Without on_header, llhttp still validates every header line
    but calls no Python per header; the lines are split here from the (validated) head instead."""

    __slots__ = ("url",)

    def __init__(self) -> None:
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url


def find_head_end(buffer: bytes | bytearray, start: int) -> int:
    """Index just past the blank line ending the head that starts at `start`; -1 if not there yet."""
    end = buffer.find(b"\r\n\r\n", start)
    return -1 if end < 0 else end + 4


def parse_head(head: bytes) -> RequestHead | None:
    """The head of a webhook request the fast path handles, or None: anything else (another path,
    Content-Encoding, Expect, Upgrade, other transfer codings, a malformed head) goes to aiohttp.
    `head` ends with the blank line (as find_head_end cuts it)."""
    collector = _UrlCollector()
    parser = httptools.HttpRequestParser(collector)
    try:
        parser.feed_data(head)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    url = collector.url
    if not url.startswith(WEBHOOK_PREFIX):
        return None
    segments = _SEGMENTS.get(url)
    if segments is None:
        segments = _path_segments(url)
        if segments is None:
            return None
        if len(_SEGMENTS) >= _SEGMENTS_CACHED:
            _SEGMENTS.clear()
        _SEGMENTS[url] = segments
    # As aiohttp decodes header bytes: UTF-8, undecodable bytes kept as surrogates (ASCII: one decode).
    ascii_only = head.isascii()
    text = head.decode("ascii") if ascii_only else head.decode("utf-8", "surrogateescape")
    lines = text.split("\r\n")
    content_length: int | None = None
    chunked = False
    connection = ""
    headers: list[tuple[str, str]] = []
    header_map: dict[str, str] | None = {} if ascii_only else None
    for line in lines[1:-2]:  # after the request line, before the blank line
        if not line or line[0] in " \t":
            return None  # obsolete line folding (or a bare LF llhttp let through): aiohttp decides
        name, _, value = line.partition(":")
        value = value.lstrip(" \t")  # as llhttp reports it: trailing whitespace kept
        headers.append((name, value))
        lowered = name.lower()
        if header_map is not None:
            if lowered in header_map:
                header_map = None  # repeated: the handler joins the values
            else:
                header_map[lowered] = value
        if lowered not in _FRAMING_HEADERS:
            continue
        if lowered == "content-length":
            if content_length is not None:
                return None
            content_length = int(value)  # llhttp accepted it: digits only
        elif lowered == "transfer-encoding":
            if chunked or value.strip().lower() != "chunked":
                return None
            chunked = True
        elif lowered == "content-encoding":
            if value.strip().lower() != "identity":
                return None  # gzip/deflate: aiohttp decodes, with the limit applied after decoding
        elif lowered == "expect":
            return None
        elif lowered == "connection":
            connection += "," + value.lower()
    if chunked and content_length is not None:
        return None
    major, minor = parser.get_http_version().split(".")
    if major != "1":
        return None
    # Decided here: llhttp's should_keep_alive() is only right once the message is complete.
    if connection:
        options = {option.strip() for option in connection.split(",")}
        keep_alive = "keep-alive" in options if minor == "0" else "close" not in options
    else:
        keep_alive = minor != "0"
    return RequestHead(parser.get_method().decode("ascii"), segments, headers, content_length, chunked, keep_alive,
                       header_map)


_FRAMING_HEADERS = frozenset(("content-length", "transfer-encoding", "content-encoding", "expect", "connection"))
_SEGMENTS_CACHED = 1024  # URLs -> decoded (database, schema, name): senders post to few URLs
_SEGMENTS: dict[bytes, tuple[str, str, str]] = {}


def _path_segments(url: bytes) -> tuple[str, str, str] | None:
    path = url.split(b"?", 1)[0]
    parts = path[len(WEBHOOK_PREFIX):].split(b"/")
    if len(parts) != 3:
        return None
    decoded = []
    for part in parts:
        if not part or part in (b".", b"..") or not part.isascii():
            return None
        text = part.decode("ascii")
        if "%" in text:
            try:
                text = unquote(text, errors="strict")
            except UnicodeDecodeError:
                return None
            if not text or "\x00" in text:
                return None
        decoded.append(text)
    return decoded[0], decoded[1], decoded[2]


_CHUNK_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?\r\n")
# A run of 1-byte chunks, the costliest framing per body byte: sliced out in one step (data every 6th byte).
_ONE_BYTE_CHUNKS = re.compile(rb"(?:1\r\n.\r\n)+", re.DOTALL)


def _small_chunk_patterns(size: int) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """(a run of chunks of `size` bytes, in any spelling of the size and with extensions; one such
    chunk with its data as the group): a run is matched and its data collected in two C passes
    instead of a Python step per chunk."""
    digit = b"%x" % size
    unit = rb"0*[" + digit + digit.upper() + rb"][ \t]*(?:;[^\r\n]*)?\r\n"
    return (re.compile(rb"(?:" + unit + rb".{%d}\r\n)+" % size, re.DOTALL),
            re.compile(unit + rb"(.{%d})\r\n" % size, re.DOTALL))


_SMALL_CHUNKS = {size: _small_chunk_patterns(size) for size in range(1, 16)}  # 16 bytes on: few enough chunks
MAX_CHUNK_LINE_BYTES = 1024


class ChunkedDecoder:
    """Decodes one chunked body incrementally: each call resumes where the previous one stopped, so
    a body arriving in many reads (or made of many tiny chunks) costs time linear in its size. Offsets
    are relative to the body's first byte, so the caller may drop bytes before the body meanwhile."""

    __slots__ = ("_body", "_limit", "_position")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._body = bytearray()
        self._position = 0  # the next chunk-size line, from the body's start

    def feed(self, buffer: bytes | bytearray, body_start: int) -> tuple[bytes, int] | None:
        """The decoded body and the index in `buffer` just past the message, once complete; None
        while incomplete. Raises TooLarge past the limit, BadFraming."""
        body = self._body
        position = body_start + self._position
        end = len(buffer)
        match_line = _CHUNK_SIZE_LINE.match
        try:
            while True:
                if buffer.startswith(b"1\r\n", position):
                    run = _ONE_BYTE_CHUNKS.match(buffer, position)
                    if run is not None:
                        body += buffer[position + 3:run.end():6]
                        position = run.end()
                        if len(body) > self._limit:
                            raise TooLarge()
                        continue
                line = match_line(buffer, position)
                if line is None:
                    line_end = buffer.find(b"\r\n", position, position + MAX_CHUNK_LINE_BYTES)
                    if line_end >= 0:
                        raise BadFraming("invalid chunk size")
                    if end - position >= MAX_CHUNK_LINE_BYTES:
                        raise BadFraming("chunk size line too long")
                    return None
                size = int(line[1], 16)
                if 0 < size < 16:
                    run_pattern, data_pattern = _SMALL_CHUNKS[size]
                    run = run_pattern.match(buffer, position)
                    if run is not None:
                        body += b"".join(data_pattern.findall(buffer, position, run.end()))
                        position = run.end()
                        if len(body) > self._limit:
                            raise TooLarge()
                        continue
                data_start = line.end()
                if size == 0:
                    if end - data_start < 2:
                        return None
                    if buffer.startswith(b"\r\n", data_start):
                        return bytes(body), data_start + 2
                    trailers_end = buffer.find(b"\r\n\r\n", data_start)
                    if trailers_end < 0:
                        if end - data_start > MAX_HEAD_BYTES:
                            raise BadFraming("trailers too long")
                        return None
                    return bytes(body), trailers_end + 4
                if len(body) + size > self._limit:
                    raise TooLarge()
                data_end = data_start + size
                if end < data_end + 2:
                    return None
                if not buffer.startswith(b"\r\n", data_end):
                    raise BadFraming("chunk data not followed by CRLF")
                body += buffer[data_start:data_end]
                position = data_end + 2
        finally:
            self._position = position - body_start


def decode_chunked(buffer: bytes | bytearray, start: int, limit: int) -> tuple[bytes, int] | None:
    """The body of a chunked message whose body starts at `start`, and the index just past the
    message; None while incomplete. Raises TooLarge past `limit` decoded bytes, BadFraming."""
    return ChunkedDecoder(limit).feed(buffer, start)


class ResponseWriter:
    """Renders Replies as HTTP/1.1 responses; the Date header is cached for the current second."""

    def __init__(self) -> None:
        self._second = -1
        self._date = b""
        self._accepted = b""

    def _refresh(self) -> None:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._date = email.utils.formatdate(now, usegmt=True).encode("ascii")
            self._accepted = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: " + self._date + b"\r\n\r\n"

    def render(self, reply: Reply, *, close: bool = False) -> bytes:
        self._refresh()
        if reply.status == 200 and not reply.text and not close:
            return self._accepted
        body = reply.text.encode("utf-8")
        lines = [f"HTTP/1.1 {reply.status} {_reason(reply.status)}".encode("ascii"),
                 b"Content-Length: " + str(len(body)).encode("ascii"),
                 b"Date: " + self._date]
        if body:
            lines.append(b"Content-Type: text/plain; charset=utf-8")
        if reply.retry_after_s is not None:
            lines.append(f"Retry-After: {reply.retry_after_s}".encode("ascii"))
        if reply.allow is not None:
            lines.append(f"Allow: {reply.allow}".encode("ascii"))
        if close:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
