"""What the conformance kit tests: a driver reached through the protocol, its claims, and a reader of its target.

`resolve_target(spec, config)` turns a driver spec into a `DriverUnderTest`:
  * a built-in name (`postgres`, `redis`, `parquet`, `http`): its Connector and transactor factory served in process
    by the real connection loop (materialize/hosting.py: 127.0.0.1:<free port>, its event loop on a thread), so the
    kit speaks the same framed protocol to it as the runtime does; its claims (commit pattern, exactly or at least
    once, fencing, delta only) come from `drivers/builtin.py`;
  * `command:<shell command>`: an ExternalDriver process (gRPC); `address:host:port`: a RemoteDriver. The kit cannot
    know what such a driver promises: it assumes exactly once with fencing unless told otherwise (`guarantee`,
    `fencing`), and detects the remote-authoritative pattern from the checkpoints Open returns. The JSON Lines
    example (a command running examples/drivers/jsonl/driver.py) is recognised: it gets a directory and a reader,
    and its documented claims (exactly once, no fence: its recovery log has one owner).

Provisioning, when no config is given: PARQUET writes into a temporary directory, HTTP posts to the kit's own
idempotent receiver (receiver.py), the JSON Lines example writes into a temporary directory; POSTGRES and REDIS need
a server, so a missing config is a usage error (`UsageError`, exit code 2).

Readers (`TargetReader.appended`) are the oracle for delta-updates bindings, whose documents are never Loaded: the
rows of a PostgreSQL table (psycopg), a Parquet dataset (pyarrow), a Redis stream (redis-py), the receiver's
recorded batches, the example's JSON Lines files. Keyed bindings are checked through Load, the protocol itself."""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from headrace.materialize.drivers.builtin import BUILTIN_DRIVERS
from headrace.materialize.hosting import ThreadedDriverServer
from headrace.materialize.runtime import DriverConnection

JSONL_EXAMPLE = "examples/drivers/jsonl/driver.py"


class UsageError(Exception):
    """The driver spec or its config cannot be used (exit code 2)."""


class TargetReader(Protocol):
    """Reads a target's append stream (a delta-updates binding) outside the protocol."""

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]: ...


@dataclass
class DriverUnderTest:
    """A driver the kit can connect to any number of times (each connection a new runtime), with its claims."""

    spec: str  # as given: "parquet", "command:...", "address:..."
    connect: Callable[[], DriverConnection]
    config: dict[str, Any]
    pattern: str
    exactly_once: bool
    fences: bool
    delta_only: bool = False
    remote_authoritative: bool | None = None  # None: unknown, detected from Open's checkpoints
    schemaless: bool = False  # Apply holds no schema: a changed key has nothing to be refused by
    reader: TargetReader | None = None
    notes: list[str] = field(default_factory=list)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def guarantee(self) -> str:
        return "exactly once" if self.exactly_once else "at least once"

    def close(self) -> None:
        for closer in reversed(self._closers):
            try:
                closer()
            except Exception:  # closing is best effort: the report is already made
                pass
        self._closers.clear()


# ---------------------------------------------------------------------------------------------- hosting


# ---------------------------------------------------------------------------------------------- readers


def _typed(value: Any, type_name: str) -> Any:
    """A value read back as text (Redis) in the protocol's form for the simple types the kit's streams use."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else value
    upper = type_name.upper()
    if upper in ("BIGINT", "INTEGER", "SMALLINT", "HUGEINT"):
        return int(text)
    if upper in ("DOUBLE", "FLOAT"):
        return float(text)
    return text


class PostgresReader:
    def __init__(self, url: str) -> None:
        self._url = url

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        import psycopg
        from psycopg.rows import dict_row

        from headrace.materialize.drivers.postgres import resource
        from headrace.materialize.drivers.postgres_sql import ident

        schema, table = resource(resource_path)
        columns = ", ".join(ident(c) for c in column_types)
        with psycopg.connect(self._url, row_factory=dict_row) as conn:
            return list(conn.execute(f"SELECT {columns} FROM {ident(schema)}.{ident(table)}").fetchall())


class ParquetReader:
    def __init__(self, root: Path) -> None:
        self._root = root

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        import pyarrow.dataset as ds

        directory = self._root.joinpath(*resource_path)
        if not directory.exists():
            return []
        return ds.dataset(directory, format="parquet").to_table(columns=list(column_types)).to_pylist()


class RedisReader:
    def __init__(self, url: str, key_prefix: str | None) -> None:
        self._url = url
        self._key_prefix = key_prefix

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        import redis

        stream = self._key_prefix if self._key_prefix is not None else ":".join(resource_path)
        client = redis.Redis.from_url(self._url)
        try:
            entries = client.xrange(stream)
        finally:
            client.close()
        return [{name: _typed(fields.get(name.encode()), type_name) for name, type_name in column_types.items()}
                for _, fields in entries]


class ReceiverReader:
    def __init__(self, receiver: Any) -> None:
        self._receiver = receiver

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        return [{name: doc.get(name) for name in column_types}
                for doc in self._receiver.documents(f"{materialization}:")]


class JsonlReader:
    """The JSON Lines example's delta files: <directory>/<table>/<txn>.jsonl."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def appended(self, materialization: str, resource_path: tuple[str, ...],
                 column_types: dict[str, str]) -> list[dict[str, Any]]:
        table = self._directory / ".".join(resource_path)
        documents = [json.loads(line) for part in sorted(table.glob("*.jsonl"))
                     for line in part.read_text(encoding="utf-8").splitlines() if line]
        return [{name: doc.get(name) for name in column_types} for doc in documents]


# ---------------------------------------------------------------------------------------------- resolving


def _temporary_directory(target: DriverUnderTest, prefix: str) -> Path:
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    target._closers.append(lambda: shutil.rmtree(directory, ignore_errors=True))
    return directory


def _builtin(name: str, config: dict[str, Any] | None) -> DriverUnderTest:
    driver = BUILTIN_DRIVERS[name]
    if name in ("postgres", "redis") and config is None:
        example = '{"url": "postgresql://user@host:5432/db"}' if name == "postgres" else \
            '{"url": "redis://localhost:6379/0"}'
        raise UsageError(f"the {name} driver needs a server: pass --config '{example}'")
    server = ThreadedDriverServer(driver.transactor_factory, driver.connector(), thread_name="kit-driver")
    target = DriverUnderTest(name, server.connect, dict(config or {}), driver.pattern, driver.exactly_once,
                             fences=name != "http", delta_only=driver.delta_only,
                             remote_authoritative=driver.remote_authoritative,
                             schemaless=name in ("redis", "http"))
    target._closers.append(server.stop)
    if name == "postgres":
        target.reader = PostgresReader(str(target.config.get("url")))
    elif name == "redis":
        target.reader = RedisReader(str(target.config.get("url")), target.config.get("key_prefix"))
    elif name == "parquet":
        if config is None:
            target.config = {"path": str(_temporary_directory(target, "headrace-kit-parquet-"))}
            target.notes.append(f"parquet datasets in {target.config['path']} (removed afterwards)")
        target.reader = ParquetReader(Path(str(target.config.get("path"))))
    elif name == "http":
        if config is None:
            from headrace.materialize.conformance.receiver import IdempotentReceiver

            receiver = IdempotentReceiver()
            target._closers.append(receiver.stop)
            target.config = {"url": receiver.url, "initial_backoff_seconds": 0.01}
            target.reader = ReceiverReader(receiver)
            target.notes.append(f"POSTs into the kit's receiver at {receiver.url} (deduplicates on Idempotency-Key)")
        else:
            target.notes.append("your endpoint: the kit cannot read what it received (delta checks are skipped)")
    return target


def _is_jsonl_example(command: str) -> bool:
    try:
        words = shlex.split(command)
    except ValueError:
        return False
    return any(word.replace("\\", "/").endswith(JSONL_EXAMPLE) for word in words)


def _external(spec: str, config: dict[str, Any] | None) -> DriverUnderTest:
    from headrace.materialize.rpc.external import ExternalDriver, RemoteDriver

    kind, _, rest = spec.partition(":")
    if not rest.strip():
        raise UsageError(f"{kind}: needs a {'shell command' if kind == 'command' else 'host:port'} after the colon")
    if kind == "command":
        process = ExternalDriver(rest, name="driver under test")
        connect: Callable[[], DriverConnection] = process.connection
        jsonl = _is_jsonl_example(rest)
        target = DriverUnderTest(spec, connect, dict(config or {}),
                                 "recovery log, idempotent apply (the JSON Lines example)" if jsonl
                                 else "external (pattern detected from Open)", exactly_once=True, fences=not jsonl)
        target._closers.append(process.stop)
        if jsonl:
            if config is None:
                target.config = {"directory": str(_temporary_directory(target, "headrace-kit-jsonl-"))}
                target.notes.append(f"JSON Lines files in {target.config['directory']} (removed afterwards)")
            target.reader = JsonlReader(Path(str(target.config.get("directory"))))
            target.remote_authoritative = False
            target.notes.append("the JSON Lines example has no fence: its recovery log has one owner")
        try:
            process.start()  # a driver that does not start is reported before any scenario runs
        except BaseException:
            target.close()
            raise
        return target
    try:
        remote = RemoteDriver(rest)
    except Exception as exc:
        raise UsageError(str(exc)) from None
    return DriverUnderTest(spec, remote.connection, dict(config or {}), "external (pattern detected from Open)",
                           exactly_once=True, fences=True)


def resolve_target(spec: str, config: dict[str, Any] | None = None, *, guarantee: str | None = None,
                   fencing: bool | None = None) -> DriverUnderTest:
    """The driver a spec names, started or reachable, provisioned where the kit can (see module docstring).
    `guarantee` ("exactly-once" / "at-least-once") and `fencing` override what the kit assumes or knows."""
    if config is not None and not isinstance(config, dict):
        raise UsageError("--config must be a JSON object")
    name = spec.strip()
    if name.lower() in BUILTIN_DRIVERS:
        target = _builtin(name.lower(), config)
    elif name.startswith(("command:", "address:")):
        target = _external(name, config)
    else:
        raise UsageError(f"unknown driver {spec!r}: a built-in ({', '.join(BUILTIN_DRIVERS)}), "
                         "command:<shell command> or address:<host:port>")
    if guarantee is not None:
        if guarantee not in ("exactly-once", "at-least-once"):
            target.close()
            raise UsageError("--guarantee is exactly-once or at-least-once")
        target.exactly_once = guarantee == "exactly-once"
    if fencing is not None:
        target.fences = fencing
    return target
