"""Seeded generators of hostile input for the fuzz suite: pgwire message sequences, webhook HTTP requests and
SQL text. Everything is drawn from one `random.Random`, so a failing run is replayed by its seed.

Every generated request and statement carries MARK somewhere a careless log line would copy it from (a
header name, a path, an identifier): the suite checks the server's log never contains it."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

MARK = "FZMARK"

# --- SQL text ----------------------------------------------------------------------------------------------------

# Valid statements over the suite's own objects (fz_t, a table; fz_v, a view over the canary source); mutations
# of these reach deeper into the planner than token soup does. No statement names the canary source's rows for
# writing, none blocks (SUBSCRIBE, COPY FROM STDIN, pg_sleep) and none drops anything but the suite's scratch items.
SEED_STATEMENTS = (
    "SELECT 1 + 2 * 3",
    "SELECT a, b FROM fz_t WHERE a > 1 ORDER BY a LIMIT 5",
    "SELECT count(*), sum(a), avg(a), min(b), max(b) FROM fz_t GROUP BY b HAVING count(*) > 0",
    "SELECT x.a, y.b FROM fz_t x JOIN fz_t y ON x.a = y.a",
    "SELECT * FROM fz_v",
    "SELECT body->>'k', received_at FROM canary WHERE body->>'k' IS NOT NULL LIMIT 3",
    "INSERT INTO fz_t VALUES (1, 'one'), (2, 'two')",
    "UPDATE fz_t SET b = upper(b) WHERE a = 1",
    "DELETE FROM fz_t WHERE a = 2",
    "SELECT CAST('12' AS int) + '3'::int8, 7 / 2, 7.0 / 2, '{\"a\": [1, 2]}'::jsonb -> 'a' ->> 1",
    "SELECT CASE WHEN a IS NULL THEN 'n' ELSE b END FROM fz_t",
    "SELECT string_agg(b, ',' ORDER BY b) FROM fz_t",
    "SELECT a FROM fz_t UNION ALL SELECT 3 EXCEPT SELECT 4",
    "WITH w AS (SELECT a FROM fz_t) SELECT * FROM w WHERE a IN (SELECT a FROM fz_t)",
    "SELECT row_number() OVER (ORDER BY a), a FROM fz_t",
    "SELECT now(), current_date, interval '1 day' + timestamp '2020-01-01'",
    "SELECT $1::int + 1",
    "SHOW ALL",
    "SET application_name = 'fz'",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SELECT * FROM pg_catalog.pg_class WHERE relname = 'fz_t'",
    "SELECT * FROM information_schema.columns WHERE table_name = 'fz_t'",
    "EXPLAIN SELECT 1",
    "PREPARE fz_p AS SELECT $1::text",
    "EXECUTE fz_p('x')",
    "DEALLOCATE fz_p",
    "DECLARE fz_c CURSOR FOR SELECT * FROM fz_t",
    "FETCH 2 fz_c",
    "CLOSE fz_c",
    "CREATE TABLE fz_scratch (a int, b text)",
    "DROP TABLE IF EXISTS fz_scratch",
    "CREATE MATERIALIZED VIEW fz_scratch_v AS SELECT b, count(*) FROM fz_t GROUP BY b",
    "DROP MATERIALIZED VIEW IF EXISTS fz_scratch_v",
    "COPY (SELECT * FROM fz_t) TO STDOUT",
    "SELECT pg_typeof(1), version(), current_user, has_table_privilege('fz_t', 'SELECT')",
)

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "ORDER", "HAVING", "LIMIT", "OFFSET", "JOIN", "LEFT", "ON", "USING",
    "AS", "AND", "OR", "NOT", "IS", "NULL", "IN", "EXISTS", "BETWEEN", "LIKE", "ILIKE", "CASE", "WHEN", "THEN",
    "ELSE", "END", "CAST", "UNION", "ALL", "DISTINCT", "WITH", "RECURSIVE", "OVER", "PARTITION", "VALUES",
    "INSERT", "INTO", "UPDATE", "SET", "CREATE", "TABLE", "VIEW", "MATERIALIZED", "INDEX", "SOURCE", "SINK",
    "SECRET", "CONNECTION", "WEBHOOK", "BODY", "FORMAT", "JSON", "TEXT", "BYTES", "CHECK", "IDEMPOTENT",
    "ROLE", "GRANT", "SHOW", "EXPLAIN", "DECLARE", "CURSOR", "FETCH", "PREPARE", "EXECUTE", "BEGIN", "COMMIT",
    "ROLLBACK", "ARRAY", "ROW", "LATERAL", "FILTER", "WITHIN", "INTERVAL", "TIMESTAMP", "DATE", "NUMERIC",
    "int", "int8", "float4", "text", "jsonb", "json", "bytea", "boolean", "uuid", "record", "regclass",
)
OPERATORS = ("+", "-", "*", "/", "%", "^", "||", "=", "<>", "<", ">=", "::", "->", "->>", "#>", "@>", "?",
             "(", ")", "[", "]", ",", ";", ".", "$1", "$0", "$99999", "*", "~", "!~*", "&&")
IDENTIFIERS = ("fz_t", "fz_v", "a", "b", "canary", "body", "received_at", "pg_class", "pg_catalog", "x", "y",
               f"{MARK}_col", f'"{MARK} q"', "generate_series", "count", "sum", "lower", "jsonb_build_object",
               "read_text", "read_csv", "read_parquet", "glob", "pg_read_file", "headrace_internal")
LITERALS = ("0", "1", "-1", "2147483648", "9223372036854775808", "1e308", "1e-400", "'NaN'", "'infinity'",
            "''", "'x'", "'{\"a\": 1}'", "E'\\\\x00'", "E'\\\\ud800'", "'\\u0000'", "U&'\\D800'", "B'101'",
            "X'ff'", "$$dollar$$", "NULL", "TRUE", "'2020-02-30'", "'-infinity'::timestamp", "'1 year'",
            "'🦀'", "'ä'", f"'{MARK}'")
BLOCKING = ("SUBSCRIBE", "TAIL", "PG_SLEEP", "FROM STDIN", "DROP SOURCE", "DROP OWNED", "ALTER SYSTEM")


def _tokens(statement: str) -> list[str]:
    return statement.replace("(", " ( ").replace(")", " ) ").replace(",", " , ").split()


def _random_token(rng: random.Random) -> str:
    pool = rng.choice((KEYWORDS, OPERATORS, IDENTIFIERS, LITERALS))
    return rng.choice(pool)


def sql_statement(rng: random.Random) -> str:
    """One statement: a seed statement, mutated (tokens dropped, repeated, swapped, replaced, inserted), token
    soup, or a deeply nested expression. Never one the suite refuses to send (BLOCKING)."""
    while True:
        kind = rng.random()
        if kind < 0.15:
            statement = rng.choice(SEED_STATEMENTS)
        elif kind < 0.7:
            tokens = _tokens(rng.choice(SEED_STATEMENTS))
            for _ in range(rng.randint(1, 4)):
                position = rng.randrange(len(tokens) + 1)
                action = rng.random()
                if action < 0.3 and tokens:
                    del tokens[min(position, len(tokens) - 1)]
                elif action < 0.6:
                    tokens.insert(position, _random_token(rng))
                elif action < 0.8 and tokens:
                    tokens[min(position, len(tokens) - 1)] = _random_token(rng)
                elif len(tokens) > 1:
                    i, j = rng.randrange(len(tokens)), rng.randrange(len(tokens))
                    tokens[i], tokens[j] = tokens[j], tokens[i]
            statement = " ".join(tokens)
        elif kind < 0.9:
            statement = " ".join(_random_token(rng) for _ in range(rng.randint(1, 25)))
        else:
            depth = rng.choice((10, 100, 200, 1000))
            opener, closer = rng.choice((("(", ")"), ("ARRAY[", "]"), ("abs(", ")"), ("-(", ")")))
            statement = "SELECT " + opener * depth + "1" + closer * depth
        if not any(word in statement.upper() for word in BLOCKING):
            return statement


# --- pgwire ------------------------------------------------------------------------------------------------------

PROTOCOL_VERSION = 196608


def _frame(type_byte: bytes, body: bytes, rng: random.Random) -> bytes:
    length = len(body) + 4
    if rng.random() < 0.05:
        length = rng.choice((0, 3, 4, length - 1, length + 1, 0x7FFFFFFF, 1 << 20, -1 & 0x7FFFFFFF))
    return type_byte + struct.pack("!I", length & 0xFFFFFFFF) + body


def _cstr(text: str | bytes) -> bytes:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return data + b"\0"


def _random_bytes(rng: random.Random, most: int = 64) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, most)))


def _oid(rng: random.Random) -> int:
    return rng.choice((0, 16, 17, 20, 21, 23, 25, 114, 700, 701, 705, 1043, 1082, 1114, 1184, 1700, 2249, 2950,
                       3802, 4294967295, rng.getrandbits(32)))


def _parameter(rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.4:
        return rng.choice((b"1", b"-1", b"abc", b"2020-01-01", b"{}", b"\x00\x00\x00\x01", b"NaN", b"", b"\xff\xfe"))
    if choice < 0.7:
        return _random_bytes(rng, 16)
    return struct.pack("!q", rng.getrandbits(63))


def _parse(rng: random.Random) -> bytes:
    name = rng.choice(("", "s1", "s2", MARK))
    sql = sql_statement(rng)
    oids = [_oid(rng) for _ in range(rng.choice((0, 0, 1, 2, 5)))]
    body = _cstr(name) + _cstr(sql) + struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids)
    return _frame(b"P", body, rng)


def _bind(rng: random.Random) -> bytes:
    body = bytearray(_cstr(rng.choice(("", "p1", MARK))) + _cstr(rng.choice(("", "s1", "s2", "nope"))))
    formats = [rng.choice((0, 1, 2, -1)) for _ in range(rng.choice((0, 1, 2, 3)))]
    body += struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    params = [None if rng.random() < 0.1 else _parameter(rng) for _ in range(rng.choice((0, 1, 2, 3)))]
    declared = len(params) if rng.random() < 0.9 else rng.choice((-1, 0, 5, 32767))
    body += struct.pack("!h", declared)
    for param in params:
        if param is None:
            body += struct.pack("!i", -1)
        else:
            length = len(param) if rng.random() < 0.9 else rng.choice((-2, len(param) + 10, 1 << 30))
            body += struct.pack("!i", length) + param
    results = [rng.choice((0, 1, 7)) for _ in range(rng.choice((0, 1, 2)))]
    body += struct.pack("!h", len(results)) + b"".join(struct.pack("!h", f) for f in results)
    if rng.random() < 0.1:
        body = body[: rng.randrange(len(body) + 1)]
    return _frame(b"B", bytes(body), rng)


def _describe(rng: random.Random) -> bytes:
    return _frame(b"D", rng.choice((b"S", b"P", b"Z", b"")) + _cstr(rng.choice(("", "s1", "p1", MARK))), rng)


def _execute(rng: random.Random) -> bytes:
    return _frame(b"E", _cstr(rng.choice(("", "p1", "nope"))) + struct.pack("!i", rng.choice((0, 1, -1, 100))), rng)


def _close(rng: random.Random) -> bytes:
    return _frame(b"C", rng.choice((b"S", b"P", b"x")) + _cstr(rng.choice(("", "s1", "p1"))), rng)


def _query(rng: random.Random) -> bytes:
    sql = sql_statement(rng)
    if rng.random() < 0.2:
        sql = sql + ";" + sql_statement(rng)
    payload = _cstr(sql)
    if rng.random() < 0.05:
        payload = payload[:-1]  # no terminator
    elif rng.random() < 0.05:
        payload = sql.encode()[:3] + b"\x00" + payload  # a NUL inside
    return _frame(b"Q", payload, rng)


def _copy_messages(rng: random.Random) -> bytes:
    return rng.choice((_frame(b"d", _random_bytes(rng), rng), _frame(b"c", b"", rng),
                       _frame(b"f", _cstr(MARK), rng)))


def _function_call(rng: random.Random) -> bytes:
    return _frame(b"F", struct.pack("!I", _oid(rng)) + _random_bytes(rng, 24), rng)


def _garbage(rng: random.Random) -> bytes:
    return bytes([rng.getrandbits(8)]) + _random_bytes(rng, 32)


def _sync(rng: random.Random) -> bytes:
    return _frame(b"S", b"", rng)


def _flush(rng: random.Random) -> bytes:
    return _frame(b"H", b"", rng)


MESSAGE_MAKERS: tuple[tuple[Callable[[random.Random], bytes], float], ...] = (
    (_parse, 3), (_bind, 3), (_describe, 2), (_execute, 3), (_sync, 3), (_query, 4), (_close, 1), (_flush, 1),
    (_copy_messages, 1), (_function_call, 0.5), (_garbage, 0.5),
)


def message_sequence(rng: random.Random) -> bytes:
    """Frontend messages after a successful startup: mostly well-framed, sometimes not; ends with a Sync."""
    makers, weights = zip(*MESSAGE_MAKERS)
    chosen = rng.choices(makers, weights=weights, k=rng.randint(1, 8))
    return b"".join(maker(rng) for maker in chosen) + struct.pack("!cI", b"S", 4)


def startup_packet(rng: random.Random, user: str) -> bytes:
    """A startup-phase packet: the real one, or one with a bad version, bad parameters, bad length or noise."""
    choice = rng.random()
    parameters = [("user", user), ("database", "headrace")]
    if choice < 0.3:
        pass
    elif choice < 0.5:
        parameters.append((rng.choice(("options", "application_name", MARK, "client_encoding", "DateStyle")),
                           rng.choice(("-c statement_timeout=1", "x" * rng.randint(0, 20_000), "\u00e4", "UTF8",
                                       "garbage", MARK))))
    elif choice < 0.6:
        parameters = [("database", "headrace")]  # no user
    elif choice < 0.7:
        parameters = [("user", MARK + "_nobody"), ("database", "headrace")]
    body = b"".join(_cstr(k) + _cstr(v) for k, v in parameters) + b"\0"
    version = PROTOCOL_VERSION if rng.random() < 0.8 else rng.choice((196609, 131072, 80877103, 80877102,
                                                                       80877104, 0, rng.getrandbits(32)))
    payload = struct.pack("!I", version) + body
    length = len(payload) + 4
    if rng.random() < 0.15:
        length = rng.choice((0, 4, 7, 8, 10_001, 1 << 30, length + 3, length - 3))
    if rng.random() < 0.05:
        return _random_bytes(rng, 200)
    return struct.pack("!I", length & 0xFFFFFFFF) + payload


# --- webhook HTTP requests ------------------------------------------------------------------------------------------

def http_request(rng: random.Random, port: int, sources: tuple[str, ...]) -> bytes:
    """One raw HTTP/1.1 request to the webhook port: a valid POST, or one with a broken request line, headers,
    framing (Content-Length and chunked, conflicting or malformed), encoding or body."""
    source = rng.choice((*sources, f"{MARK}nosuch", "../" * rng.randint(1, 4) + "etc", "%00", "a" * 300))
    path = rng.choice((f"/api/webhook/headrace/public/{source}", f"/api/webhook/{MARK}", "/", "/metrics",
                       f"/api/sql?{MARK}", "*", "/api/webhook/headrace/public/" + source + "?x=" + MARK))
    method = rng.choice(("POST",) * 6 + ("GET", "PUT", "OPTIONS", "HEAD", MARK, "POST POST", ""))
    version = rng.choice(("HTTP/1.1",) * 8 + ("HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", ""))
    body = rng.choice((
        b'{"k": "fz"}', b"[1, 2, {}]", b"", b'{"k": "\\ud800"}', b'{"k": "\\u0000"}', b'"\xff\xfe"',
        b"{" * 500, b"\x00" * 10, ("{\"" + MARK + "\": 1}").encode(), _random_bytes(rng, 300),
        b'{"k": "' + b"x" * rng.randint(0, 70_000) + b'"}',
    ))
    headers = [("Host", f"127.0.0.1:{port}"), ("Content-Type", rng.choice(("application/json", "text/plain",
                                                                          "", MARK, "application/x-ndjson")))]
    framing = rng.random()
    if framing < 0.5:
        headers.append(("Content-Length", str(len(body))))
        payload = body
    elif framing < 0.65:
        headers.append(("Transfer-Encoding", "chunked"))
        payload = _chunked(rng, body)
    elif framing < 0.75:
        headers += [("Content-Length", str(len(body) + rng.choice((-1, 1, 5)))), ("Transfer-Encoding", "chunked")]
        payload = _chunked(rng, body)
    elif framing < 0.85:
        headers.append(("Content-Length", rng.choice(("-1", "abc", "99999999999999999999", "1, 2", " 3", "0x10"))))
        payload = body
    else:
        headers.append(("Content-Encoding", rng.choice(("gzip", "deflate", "br", MARK))))
        headers.append(("Content-Length", str(len(body))))
        payload = body
    if rng.random() < 0.3:
        headers.append(rng.choice(((MARK, "v"), ("X-" + MARK, "\x01\x7f"), ("", "empty"), ("Bad Name", "x"),
                                   ("Expect", "100-continue"), ("Connection", "close"), ("X-Long", "y" * 9000),
                                   ("Transfer-Encoding", "gzip, chunked"), ("Host", MARK))))
    head = f"{method} {path} {version}\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    if rng.random() < 0.05:
        head = head.replace("\r\n", "\n")
    if rng.random() < 0.03:
        head = head[: rng.randrange(len(head))]  # a torn head
        payload = b""
    return head.encode("latin-1", "replace") + payload


def _chunked(rng: random.Random, body: bytes) -> bytes:
    out = bytearray()
    position = 0
    while position < len(body):
        size = rng.choice((1, 2, 7, 64, 4096))
        chunk = body[position:position + size]
        position += size
        size_text = f"{len(chunk):x}"
        if rng.random() < 0.02:
            size_text = rng.choice(("zz", "-1", "ffffffffffffffffff", f"{len(chunk):x};ext=" + MARK, ""))
        out += size_text.encode() + b"\r\n" + chunk + b"\r\n"
    out += b"0\r\n" + (f"{MARK}: trailer\r\n".encode() if rng.random() < 0.1 else b"") + b"\r\n"
    return bytes(out)
