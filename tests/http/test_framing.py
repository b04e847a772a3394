"""The fast path's request framing: which heads it keeps, chunked decoding, rendered responses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.http.framing import (
    BadFraming,
    ChunkedDecoder,
    ResponseWriter,
    TooLarge,
    decode_chunked,
    find_head_end,
    parse_head,
)
from headrace.http.webhook_endpoint import Reply
from headrace.webhook.handler import _header_map

HEAD = b"POST /api/webhook/headrace/public/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


def test_a_plain_webhook_post_is_kept() -> None:
    head = parse_head(HEAD)
    assert head is not None
    assert (head.method, head.segments, head.content_length, head.chunked, head.keep_alive) == (
        "POST", ("headrace", "public", "orders"), 2, False, True)
    assert head.headers == [("Host", "x"), ("Content-Length", "2")]
    assert head.header_map == {"host": "x", "content-length": "2"}


def test_path_segments_are_percent_decoded_and_the_query_ignored() -> None:
    head = parse_head(b"POST /api/webhook/head%20race/p%2Fq/%C3%A9?x=1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    assert head is not None and head.segments == ("head race", "p/q", "\u00e9")


@pytest.mark.parametrize("raw", [
    b"POST /api/sql HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"GET /metrics HTTP/1.1\r\n\r\n",
    b"POST /api/webhook/a/b HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"POST /api/webhook/a/b/c/d HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"POST /api/webhook/a/../c HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"POST /api/webhook/a/b/c HTTP/1.1\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\n",
    b"POST /api/webhook/a/b/c HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
    b"POST /api/webhook/a/b/c HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
    b"POST /api/webhook/a/b/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    b"GET /api/webhook/a/b/c HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"POST /api/webhook/a/b/%ff HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"NOT HTTP AT ALL\r\n\r\n",
])
def test_anything_else_is_left_to_aiohttp(raw: bytes) -> None:
    assert parse_head(raw) is None


def test_http_1_0_closes_unless_keep_alive() -> None:
    head = parse_head(b"POST /api/webhook/a/b/c HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
    assert head is not None and not head.keep_alive
    close = parse_head(b"POST /api/webhook/a/b/c HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert close is not None and not close.keep_alive


def test_find_head_end() -> None:
    data = b"xx" + HEAD + b"{}"
    assert find_head_end(data, 2) == 2 + len(HEAD)
    assert find_head_end(HEAD[:-1], 0) == -1


def chunked(body: bytes, sizes: list[int], trailers: bytes = b"") -> bytes:
    out, position = [], 0
    for size in sizes:
        piece = body[position:position + size]
        if not piece:
            break
        out.append(b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n")
        position += len(piece)
    if position < len(body):
        out.append(b"%X\r\n" % (len(body) - position) + body[position:] + b"\r\n")
    return b"".join(out) + b"0\r\n" + trailers + b"\r\n"


@given(st.binary(max_size=300), st.lists(st.integers(1, 50), max_size=10), st.booleans(), st.binary(max_size=20))
def test_chunked_bodies_decode_whole_and_wait_while_incomplete(body: bytes, sizes: list[int], with_trailer: bool,
                                                              after: bytes) -> None:
    framed = chunked(body, sizes, b"X-Trailer: 1\r\n" if with_trailer else b"")
    data = b"HEAD" + framed + after
    assert decode_chunked(data, 4, 1 << 20) == (body, 4 + len(framed))
    for cut in range(4, 4 + len(framed)):
        assert decode_chunked(data[:cut], 4, 1 << 20) is None


def test_chunked_limits_and_bad_framing() -> None:
    with pytest.raises(TooLarge):
        decode_chunked(b"5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n", 0, 8)
    with pytest.raises(BadFraming):
        decode_chunked(b"zz\r\nhello\r\n", 0, 100)
    with pytest.raises(BadFraming):
        decode_chunked(b"5\r\nhelloXX0\r\n\r\n", 0, 100)


def test_responses() -> None:
    writer = ResponseWriter()
    accepted = writer.render(Reply(200))
    assert accepted.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: ") and accepted.endswith(b"\r\n\r\n")
    busy = writer.render(Reply(429, "too many", retry_after_s=1), close=True)
    assert busy.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"\r\nRetry-After: 1\r\n" in busy and b"\r\nConnection: close\r\n" in busy
    assert busy.endswith(b"\r\n\r\ntoo many")
    assert b"\r\nAllow: POST\r\n" in writer.render(Reply(405, "no", allow="POST"))


class _CallbackHead:
    """The reference: headers as llhttp reports them through on_header callbacks."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


_HEADER_NAMES = st.sampled_from(["Host", "X-Key", "content-type", "Connection", "Idempotency-Key", "X-\u00e9"])
_HEADER_VALUES = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, blacklist_characters="\x7f"),
                         max_size=12)


@given(st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES, st.sampled_from(["", " ", "  ", "\t"])), max_size=6))
def test_headers_are_split_as_llhttp_reports_them(fields: list[tuple[str, str, str]]) -> None:
    lines = "".join(f"{name}:{space}{value}{space}\r\n" for name, value, space in fields)
    raw = f"POST /api/webhook/a/b/c HTTP/1.1\r\n{lines}Content-Length: 0\r\n\r\n".encode()
    import httptools

    reference = _CallbackHead()
    try:
        httptools.HttpRequestParser(reference).feed_data(raw)
    except httptools.HttpParserError:
        assert parse_head(raw) is None
        return
    head = parse_head(raw)
    if head is None:  # refused for another reason (a Connection: upgrade-like value): nothing to compare
        return
    expected = [(name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
                for name, value in reference.headers]
    assert head.headers == expected
    # The map handed to the handler is the one it would build itself from the pairs.
    repeated = len({name.lower() for name, _ in expected}) < len(expected)
    if raw.isascii() and not repeated:
        assert head.header_map == _header_map(head.headers)
    else:
        assert head.header_map is None


def _chunk(data: bytes, spelling: int) -> bytes:
    size = b"%x" % len(data)
    size = (size, size.upper(), b"00" + size, size + b";ext=1", size + b" ;a")[spelling % 5]
    return size + b"\r\n" + data + b"\r\n"


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=40), st.integers(0, 4)), max_size=60),
       st.lists(st.integers(1, 64), min_size=1, max_size=8))
def test_incremental_chunked_decoding_equals_the_body_however_the_bytes_arrive(
        chunks: list[tuple[bytes, int]], read_sizes: list[int]) -> None:
    framed = b"".join(_chunk(data, spelling) for data, spelling in chunks) + b"0\r\n\r\nNEXT"
    decoder = ChunkedDecoder(1 << 20)
    buffer = bytearray(b"HEAD")
    offset, turn, result = 0, 0, None
    while result is None:
        assert offset < len(framed), "never complete"
        step = read_sizes[turn % len(read_sizes)]
        buffer += framed[offset:offset + step]
        offset, turn = offset + step, turn + 1
        result = decoder.feed(buffer, 4)
    body, end = result
    assert body == b"".join(data for data, _ in chunks)
    assert bytes(buffer[end:]) + framed[offset:] == b"NEXT"
