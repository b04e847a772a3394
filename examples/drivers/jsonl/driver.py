"""A complete headrace materialization driver: JSON Lines files in a directory (docs/drivers.md walks through it).

Only grpcio and protobuf (grpcio-tools compiles driver.proto at start); it never imports headrace. headrace runs it
for `INTO EXTERNAL (COMMAND = ...)` with HEADRACE_DRIVER_ADDRESS set; by hand:
    HEADRACE_DRIVER_ADDRESS=127.0.0.1:7700 python examples/drivers/jsonl/driver.py

Endpoint config {"directory": "/path"}, holding <table>.jsonl (a binding: one line per key, its document),
<table>/<txn>.jsonl (a delta-updates binding: one file per transaction), <table>.schema.json (written by Apply)
and _staged/<materialization>@<txn>/ (staged transactions).

Pattern: recovery log with idempotent apply. StartCommit stages the transaction and answers the merge patch
{"pending": {txn: dir}}, which headrace's recovery log commits atomically with its checkpoint; Acknowledge applies
the pending transactions (rewrite a file from fully reduced documents, or rename a delta file in: both harmless to
repeat) and answers a patch removing them; Open gets the log's pending transactions back, to re-apply after a crash.
Guarantee: each committed transaction's effects land exactly once, with one runtime per materialization (no fence).
An example, not a product: each apply rewrites a binding's whole file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc_tools import protoc

PROTO = Path(os.environ.get("HEADRACE_DRIVER_PROTO", Path(__file__).resolve().parents[3] / "src" / "headrace"
                            / "materialize" / "rpc" / "driver.proto"))
PROTOCOL = 3032023
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")  # table and materialization names usable as file names
CONFIG_SCHEMA = {"type": "object", "required": ["directory"],
                 "properties": {"directory": {"type": "string", "description": "where the .jsonl files go"}}}


def compile_protocol() -> tuple[Any, Any]:
    """driver.proto -> driver_pb2 / driver_pb2_grpc, generated into a temporary directory and imported."""
    with tempfile.TemporaryDirectory(prefix="jsonl-driver-") as out:
        if protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}",
                        PROTO.name]):
            raise SystemExit(f"could not compile {PROTO}")
        sys.path.insert(0, out)
        import driver_pb2
        import driver_pb2_grpc
        sys.path.remove(out)
    return driver_pb2, driver_pb2_grpc


pb, pb_grpc = compile_protocol()
Response = pb.Response
Handled = Iterator[Any]  # a handler yields the responses to one request (often none)


def dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def table_name(resource_path: list[str]) -> str:
    name = ".".join(resource_path)
    if not NAME.match(name):
        raise ValueError(f"resource path {name!r} is not a usable file name")
    return name


def directory_of(config_json: bytes) -> Path:
    config = json.loads(config_json or b"{}")
    if not isinstance(config.get("directory"), str):
        raise ValueError("endpoint config needs \"directory\": a path")
    return Path(config["directory"])


def read_table(path: Path, key: list[str]) -> dict[str, dict[str, Any]]:
    """A standard binding's file as {canonical key JSON: document}."""
    if not path.exists():
        return {}
    docs = (json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
    return {dumps([doc[k] for k in key]): doc for doc in docs}


def apply_staged(root: Path, txn: str, staged: Path) -> None:
    """Apply one staged transaction, idempotently (see module docstring)."""
    if not staged.exists():
        return  # applied by an earlier Acknowledge whose Acknowledged never reached headrace
    for part in sorted(staged.iterdir()):
        kind, table = part.name.split(".", 1)
        table = table.removesuffix(".jsonl")
        if kind == "append":  # delta updates: move the transaction's rows in
            (root / table).mkdir(exist_ok=True)
            os.replace(part, root / table / f"{txn}.jsonl")
            fsync_directory(root / table)
            continue
        header, *lines = part.read_text(encoding="utf-8").splitlines()
        docs = read_table(root / f"{table}.jsonl", json.loads(header)["key"])
        for line in lines:
            change = json.loads(line)
            if change["doc"] is None:
                docs.pop(dumps(change["key"]), None)
            else:
                docs[dumps(change["key"])] = change["doc"]
        write_atomically(root / f"{table}.jsonl", "".join(dumps(doc) + "\n" for doc in docs.values()))
    shutil.rmtree(staged)


class Session:
    """One Materialize stream. Each handler takes its request message and yields the responses."""

    def __init__(self) -> None:
        self.root = Path()
        self.name = ""
        self.bindings: list[Any] = []
        self.pending: dict[str, str] = {}  # txn -> staged directory, committed by headrace, not yet applied
        self.loads: list[Any] = []
        self.changes: dict[int, dict[str, Any]] = {}  # binding -> canonical key JSON -> doc (None: delete)
        self.appends: dict[int, list[Any]] = {}  # delta-updates binding -> rows
        self.last_txn = 0

    def spec(self, request: Any) -> Handled:
        yield Response(spec=Response.Spec(protocol=PROTOCOL, config_schema_json=dumps(CONFIG_SCHEMA).encode(),
                                          resource_config_schema_json=b"{}"))

    def validate(self, request: Any) -> Handled:
        root = directory_of(request.config_json)
        Constraint = Response.Validated.Constraint
        bindings = []
        for binding in request.bindings:
            schema_file = root / f"{table_name(binding.resource_path)}.schema.json"
            existing = json.loads(schema_file.read_text())["types"] if schema_file.exists() else {}
            constraints = {}
            for field, type_ in binding.fields.items():
                if existing.get(field, type_) != type_:
                    constraints[field] = Constraint(type=Constraint.INCOMPATIBLE,
                                                    reason=f"stored as {existing[field]}, not {type_}")
                elif field in binding.key:
                    constraints[field] = Constraint(type=Constraint.LOCATION_REQUIRED, reason="a key column")
                else:
                    constraints[field] = Constraint(type=Constraint.LOCATION_RECOMMENDED, reason="any JSON value")
            bindings.append(Response.Validated.Binding(resource_path=binding.resource_path, constraints=constraints,
                                                       delta_updates=binding.delta_updates))
        yield Response(validated=Response.Validated(bindings=bindings))

    def apply(self, request: Any) -> Handled:
        root = directory_of(request.materialization.config_json)
        (root / "_staged").mkdir(parents=True, exist_ok=True)
        actions = []
        for binding in request.materialization.bindings:
            table = table_name(binding.resource_path)
            schema_file = root / f"{table}.schema.json"
            old = json.loads(schema_file.read_text()) if schema_file.exists() else None
            if old is not None and old["key"] != list(binding.key):
                raise ValueError(f"the key of {table} changed from {old['key']}: delete its files first")
            types = {**(old or {}).get("types", {}), **binding.column_types}
            if old is not None and types == old["types"]:
                continue
            if binding.delta_updates:
                (root / table).mkdir(exist_ok=True)
            write_atomically(schema_file, dumps({"key": list(binding.key), "types": types}))
            actions.append(f"created {table}" if old is None else f"added columns to {table}")
        yield Response(applied=Response.Applied(action_description="; ".join(actions) or "no changes"))

    def open(self, request: Any) -> Handled:
        self.root, self.name = directory_of(request.spec.config_json), request.spec.name
        if not NAME.match(self.name):
            raise ValueError(f"materialization name {self.name!r} is not a usable file name")
        self.bindings = list(request.spec.bindings)
        (self.root / "_staged").mkdir(parents=True, exist_ok=True)
        self.pending = dict(json.loads(request.driver_state_json or b"{}").get("pending", {}))
        for staged in (self.root / "_staged").glob(f"{self.name}@*"):
            if str(staged) not in self.pending.values():
                shutil.rmtree(staged)  # staged, never committed by headrace's log: that transaction is replayed
        yield Response(opened=Response.Opened())  # no checkpoint here: headrace's recovery log holds it

    def acknowledge(self, request: Any) -> Handled:
        applied, self.pending = self.pending, {}
        for txn in sorted(applied):  # txn ids sort in commit order
            apply_staged(self.root, txn, Path(applied[txn]))
        patch = {"pending": {txn: None for txn in applied}}
        state = pb.StateUpdate(updated_json=dumps(patch).encode(), merge_patch=True) if applied else None
        yield Response(acknowledged=Response.Acknowledged(state=state))

    def load(self, request: Any) -> Handled:
        self.loads.append(request)  # evaluated at Flush: after Acknowledged, so they read applied data
        yield from ()

    def flush(self, request: Any) -> Handled:
        tables: dict[int, dict[str, Any]] = {}
        for load in self.loads:
            binding = self.bindings[load.binding]
            if load.binding not in tables:
                tables[load.binding] = read_table(self.root / f"{table_name(binding.resource_path)}.jsonl",
                                                  list(binding.key))
            doc = tables[load.binding].get(dumps(json.loads(load.key_json)))
            if doc is not None:
                yield Response(loaded=Response.Loaded(binding=load.binding, key_json=load.key_json,
                                                      doc_json=dumps(doc).encode()))
        self.loads = []
        yield Response(flushed=Response.Flushed())

    def store(self, request: Any) -> Handled:
        binding = self.bindings[request.binding]
        key = json.loads(request.key_json)
        doc = {**dict(zip(binding.key, key)), **dict(zip(binding.values, json.loads(request.values_json)))}
        if binding.delta_updates:
            self.appends.setdefault(request.binding, []).append(doc)
        else:
            self.changes.setdefault(request.binding, {})[dumps(key)] = None if request.delete else doc
        yield from ()

    def start_commit(self, request: Any) -> Handled:
        self.last_txn = txn = max(self.last_txn + 1, time.time_ns())
        txn_id = f"{txn:020d}"
        staged = self.root / "_staged" / f"{self.name}@{txn_id}"
        staged.mkdir()
        for index, rows in self.appends.items():
            table = table_name(self.bindings[index].resource_path)
            write_atomically(staged / f"append.{table}.jsonl", "".join(dumps(row) + "\n" for row in rows))
        for index, changes in self.changes.items():
            binding = self.bindings[index]
            lines = [dumps({"key": list(binding.key)})]  # a header: applying needs no other file
            lines += [dumps({"key": json.loads(key), "doc": doc}) for key, doc in changes.items()]
            write_atomically(staged / f"upsert.{table_name(binding.resource_path)}.jsonl", "\n".join(lines) + "\n")
        self.appends, self.changes = {}, {}
        self.pending[txn_id] = str(staged)
        patch = pb.StateUpdate(updated_json=dumps({"pending": {txn_id: str(staged)}}).encode(), merge_patch=True)
        yield Response(started_commit=Response.StartedCommit(state=patch))


class JsonlDriver(pb_grpc.DriverServicer):
    def Materialize(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Handled:  # noqa: N802
        session = Session()
        try:
            for request in requests:
                kind = request.WhichOneof("message")
                handler = getattr(session, str(kind), None)
                if handler is None:  # e.g. the optional columnar messages
                    raise ValueError(f"this driver does not take {kind} requests")
                yield from handler(getattr(request, kind))
        except Exception as exc:  # the protocol's failure: one Error, then the stream ends
            yield Response(error=Response.Error(message=f"jsonl driver: {type(exc).__name__}: {exc}"))


def main() -> None:
    address = os.environ["HEADRACE_DRIVER_ADDRESS"]
    limit = 64 * 1024 * 1024
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),  # one thread per open stream
                         options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)])
    pb_grpc.add_DriverServicer_to_server(JsonlDriver(), server)
    server.add_insecure_port(address)
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=5))
    print(f"jsonl driver serving on {address}", file=sys.stderr, flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
