"""PARQUET sink driver. Commit pattern: recovery log with idempotent apply (exactly once, on one filesystem).

Config: `{"path": "/dir", "buckets": 16}`. A binding's dataset is `<path>/<resource_path joined by '/'>`, ONE
Parquet dataset equal to the materialized relation: Spark (`spark.read.parquet(dir)`), DuckDB
(`read_parquet('<dir>/*.parquet')`) and pyarrow (`pyarrow.dataset.dataset(dir)`) read its `part-*.parquet` files
and skip the rest, all named `_...` (Spark and pyarrow ignore `_` and `.` names; the glob matches none). In it:
  part-<b>.parquet        keyed bindings: bucket b of `buckets` holds the rows whose key hashes to b (blake2b-64 of
                          the key's canonical JSON text: decimals at their scale, timestamps in microseconds, dates
                          in days, bytes in hex), sorted by key. Apply creates every bucket empty, so the dataset
                          and its schema exist from the start.
  part-<txn>-<n>.parquet  delta-updates bindings: each transaction appends files (and part-init.parquet, empty).
  _manifest.json          owner materialization, key, column types, bucket count, fence, and the last
                          MANIFEST_TRANSACTIONS applied transaction ids (replaced atomically: temp, fsync, rename).
  _staging/<txn>/         files of a committed (or committing) transaction, not applied yet.
  _lock                   flock'd around Open's fence bump, staging and applying (across threads and processes).

A transaction: (1) Store / store_columns convert each handed-over batch to Arrow, kept in memory. (2) start_commit
writes, per touched bucket, its new version (the applied rows minus this transaction's keys plus its upserts;
copy-on-write: other buckets are not rewritten), or for delta updates the new files, to `_staging/<txn>/`, fsyncs
files and directories, and answers the merge patch `{"pending": {<txn>: [[staged, target], ...]}}` (absolute
paths), which the runtime's recovery log commits atomically with its checkpoint; readers see no change yet.
(3) acknowledge (the log holds the commit) applies every pending transaction: os.replace of each staged file onto
its target (atomic per file), fsync of the directory, the transaction id recorded in `_manifest.json`, the staging
directory removed; Acknowledged's merge patch drops it from pending. Idempotent: a transaction the manifest lists
is not applied again, and a staged file that is gone was renamed already (each is a whole new version of its
target, so renaming the rest completes a torn apply). Open takes the pending transactions from
`Open.driver_state` (the recovery log's), so a crash between StartedCommit and Acknowledged is applied by the
next runtime's first Acknowledge, exactly once; staging directories the log does not name (a crash before the log
committed them) are removed, never applied. Loads read the applied buckets of their keys (the connection loop
evaluates them after Acknowledged: they see the previous transaction applied).

Guarantee: each committed transaction's effects appear exactly once, atomically per file (a reader listing the
directory during an apply may see some buckets of a transaction before others). Fencing: Open bumps the
manifest's fence; staging and applying check it under `_lock`, so a zombie runtime gets FencedOff and changes
nothing. One materialization owns a directory. Apply creates or migrates: a new value column is added as NULLs to
every file; a column no longer selected stays (NULL from then on); a changed key, type, bucket count or
delta-updates setting is refused (remove the directory to rebuild).

Types: integers as such, HUGEINT decimal128(38,0), DOUBLE/FLOAT float64/float32, DECIMAL(p,s) decimal128(p,s),
VARCHAR/UUID/JSON string (JSON as its text), BOOLEAN, TIMESTAMPTZ timestamp[us, UTC], TIMESTAMP timestamp[us],
DATE date32, BLOB binary (arrow_values.py, the conversions the REDIS and HTTP drivers share).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace.catalog.host_access import HostAccess
from headrace.durable import replace_file_durably
from headrace.errors import DataError, FeatureNotSupported, InvalidParameterValue
from headrace.materialize.drivers.arrow_values import (
    array_from_values, arrow_type, conform_column, documents_from_table, normalized_type, required_arrow_type)
from headrace.materialize.protocol import (
    PROTOCOL_VERSION, Acknowledged, Applied, Apply, Binding, FencedOff, Load, LoadColumns, Loaded, LoadedColumns, Open,
    Opened, Spec, SpecResponse, StartedCommit, StateUpdate, Store, StoreColumns, Validate, Validated, ValidatedBinding,
    field_constraint)

DEFAULT_BUCKETS = 16
MAX_BUCKETS = 4096
MANIFEST_TRANSACTIONS = 1000  # applied transaction ids the manifest remembers (a re-apply comes right after a crash)
DELTA_FILE_ROWS = 1_000_000  # rows per appended file of a delta-updates transaction
_HASH = "blake2b-64 of canonical JSON key text, v1"
_DELETED = "__headrace_deleted"  # staged-change column: the row deletes its key

def key_texts(key_columns: list[pa.Array | pa.ChunkedArray]) -> list[bytes]:
    """Canonical text of each row's key (conformed columns): the identity hashed into buckets."""
    forms = []
    for column in key_columns:
        kind = column.type
        if pa.types.is_timestamp(kind):
            column = column.cast(pa.int64())
        elif pa.types.is_date(kind):
            column = column.cast(pa.int32())
        elif pa.types.is_decimal(kind):
            column = column.cast(pa.string())
        values = column.to_pylist()
        if pa.types.is_binary(kind):
            values = [None if v is None else v.hex() for v in values]
        forms.append(values)
    return [orjson.dumps(list(parts)) for parts in zip(*forms)]


def bucket_of(text: bytes, buckets: int) -> int:
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") % buckets


# ---------------------------------------------------------------------------------------------- files


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_parquet(table: pa.Table, path: Path) -> None:
    """Write and fsync one Parquet file (a staged file must be durable before the log names it)."""
    with open(path, "wb") as handle:
        pq.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())


def _conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, in order (absent ones as NULLs)."""
    return pa.table([table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
                     for f in schema], schema=schema)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive flock on `<directory>/_lock`: between runtimes of this process and of others."""
    descriptor = os.open(directory / "_lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _config_root(config: dict[str, Any]) -> tuple[Path, int | None]:
    path = config.get("path")
    if not isinstance(path, str) or not os.path.isabs(path):
        raise InvalidParameterValue("PARQUET sink: option PATH must be an absolute directory path")
    buckets = config.get("buckets")
    if buckets is not None and (type(buckets) is not int or not 1 <= buckets <= MAX_BUCKETS):
        raise InvalidParameterValue(f"PARQUET sink: option BUCKETS must be an integer from 1 to {MAX_BUCKETS}")
    return Path(path), buckets


def dataset_directory(root: Path, resource_path: tuple[str, ...]) -> Path:
    for part in resource_path:
        if not part or part in (".", "..") or "/" in part or "\0" in part or part[0] in "._":
            raise InvalidParameterValue(f"PARQUET sink: {part!r} cannot name a dataset directory (empty, '.', '..', "
                                        "a '/', or a leading '.' or '_', which readers skip)")
    if not resource_path:
        raise InvalidParameterValue("PARQUET sink: a binding needs a resource path")
    return root.joinpath(*resource_path)


def confined_dataset_directory(root: Path, resource_path: tuple[str, ...], access: HostAccess | None) -> Path:
    """The dataset directory, checked against the server's allow-list (catalog/host_access.py) when the driver
    runs inside a server; `access` None (driver-test, the conformance kit) leaves it unconfined."""
    directory = dataset_directory(root, resource_path)
    return directory if access is None else access.confine_directory(directory)


def _read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / "_manifest.json").read_bytes())
    except FileNotFoundError:
        return None


def _write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    replace_file_durably(directory / "_manifest.json", json.dumps(manifest, indent=1).encode(),
                         temporary=directory / "_manifest.json.tmp")


def _schema(columns: dict[str, str]) -> pa.Schema:
    return pa.schema([pa.field(name, required_arrow_type(name, type_name)) for name, type_name in columns.items()])


# ---------------------------------------------------------------------------------------------- apply


def apply_binding(root: Path, buckets: int | None, name: str, binding: Binding) -> list[str]:
    """Create or migrate one binding's dataset (idempotent); returns the actions taken."""
    directory = dataset_directory(root, binding.resource_path)
    columns = {c: normalized_type(binding.column_types[c]) for c in binding.columns}
    schema = _schema(columns)  # refuses unsupported types
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        manifest = _read_manifest(directory)
        if manifest is None:
            manifest = {"format": 1, "materialization": name, "key": list(binding.key), "columns": columns,
                        "delta_updates": binding.delta_updates, "buckets": buckets or DEFAULT_BUCKETS,
                        "hash": _HASH, "fence": 0, "applied": []}
            empty = schema.empty_table()
            for target in ([directory / "part-init.parquet"] if binding.delta_updates else
                           [directory / f"part-{b}.parquet" for b in range(manifest["buckets"])]):
                if not target.exists():
                    _write_parquet(empty, target)
            _fsync_directory(directory)
            _write_manifest(directory, manifest)
            return [f"created dataset {directory}"]
        _check_compatible(directory, manifest, name, binding, columns, buckets)
        added = {c: t for c, t in columns.items() if c not in manifest["columns"]}
        if not added:
            return []
        manifest["columns"] = {**manifest["columns"], **added}
        full = _schema(manifest["columns"])
        for path in sorted(directory.glob("part-*.parquet")):  # a file rewritten by an earlier, torn Apply is skipped
            if not set(added) <= set(pq.read_schema(path).names):
                temporary = path.with_name(f"_{path.name}.tmp")
                _write_parquet(_conform_table(pq.read_table(path), full), temporary)
                os.replace(temporary, path)
        _fsync_directory(directory)
        _write_manifest(directory, manifest)
        return [f"added column {c} ({t}) to dataset {directory}" for c, t in added.items()]


def _check_compatible(directory: Path, manifest: dict[str, Any], name: str, binding: Binding,
                      columns: dict[str, str], buckets: int | None) -> None:
    problems = []
    if manifest.get("materialization") != name:
        problems.append(f"it belongs to materialization {manifest.get('materialization')}")
    if manifest["key"] != list(binding.key):
        problems.append(f"its key is {manifest['key']}, not {list(binding.key)}")
    if manifest["delta_updates"] != binding.delta_updates:
        problems.append(f"its delta updates setting is {manifest['delta_updates']}")
    if buckets is not None and not binding.delta_updates and buckets != manifest["buckets"]:
        problems.append(f"it has {manifest['buckets']} buckets, not {buckets}")
    problems += [f"column {c} has type {manifest['columns'][c]}, not {t}"
                 for c, t in columns.items() if c in manifest["columns"] and manifest["columns"][c] != t]
    if problems:
        raise FeatureNotSupported(f"PARQUET sink {name}: the dataset {directory} cannot take this binding: "
                                  + "; ".join(problems), hint="remove the directory to rebuild it")


class ParquetConnector:
    """Spec, Validate and Apply of the PARQUET sink (confined to `access`'s directories when given)."""

    def __init__(self, access: HostAccess | None = None) -> None:
        self._access = access

    def spec(self, spec: Spec) -> SpecResponse:
        return SpecResponse(PROTOCOL_VERSION, {
            "type": "object", "required": ["path"],
            "properties": {"path": {"type": "string"}, "buckets": {"type": "integer", "minimum": 1,
                                                                    "maximum": MAX_BUCKETS,
                                                                    "default": DEFAULT_BUCKETS}}},
            {"type": "object", "properties": {"path": {"type": "array", "items": {"type": "string"}}}})

    def validate(self, validate: Validate) -> Validated:
        root, _ = _config_root(validate.config)
        answers = []
        for proposal in validate.bindings:
            directory = confined_dataset_directory(root, proposal.resource_path, self._access)
            manifest = _read_manifest(directory) or {"columns": {}}
            constraints = {}
            for name, type_name in proposal.fields.items():
                type_name = normalized_type(type_name)
                existing = manifest["columns"].get(name)
                constraints[name] = field_constraint(
                    name, proposal.key,
                    incompatible=f"type {type_name} cannot be written to Parquet" if arrow_type(type_name) is None
                    else f"the dataset's column has type {existing}" if existing not in (None, type_name) else None)
            answers.append(ValidatedBinding(proposal.resource_path, constraints, proposal.delta_updates))
        return Validated(tuple(answers))

    def apply(self, apply: Apply) -> Applied:
        root, buckets = _config_root(apply.materialization.config)
        for binding in apply.materialization.bindings:
            confined_dataset_directory(root, binding.resource_path, self._access)
        actions = [action for binding in apply.materialization.bindings
                   for action in apply_binding(root, buckets, apply.materialization.name, binding)]
        return Applied("; ".join(actions) if actions else "no changes")


# ---------------------------------------------------------------------------------------------- transactions


class _Dataset:
    """One binding's dataset: its directory, schema, and the open transaction's staged changes."""

    def __init__(self, directory: Path, binding: Binding, manifest: dict[str, Any]) -> None:
        self.directory = directory
        self.binding = binding
        self.columns: dict[str, str] = manifest["columns"]
        self.schema = _schema(self.columns)
        self.change_schema = self.schema.append(pa.field(_DELETED, pa.bool_()))
        self.key = list(binding.key)
        self.key_schema = pa.schema([self.schema.field(k) for k in self.key])
        self.buckets: int = manifest["buckets"]
        self.changes: list[pa.Table] = []
        self.cache: dict[int, pa.Table] = {}  # buckets read by this transaction's Loads

    def keys_table(self, keys: list[list[Any]]) -> pa.Table:
        return pa.table([array_from_values(k, self.columns[k], [key[i] for key in keys])
                         for i, k in enumerate(self.key)], schema=self.key_schema)

    def change_table(self, keys: list[list[Any]], values: dict[str, list[Any]], deleted: bool) -> pa.Table:
        count = len(keys)
        arrays = [array_from_values(k, self.columns[k], [key[i] for key in keys]) for i, k in enumerate(self.key)]
        arrays += [array_from_values(c, self.columns[c], values[c]) if c in values else pa.nulls(count, f.type)
                   for c, f in zip(self.columns, self.schema) if c not in self.key]
        return pa.table(arrays + [pa.array([deleted] * count, pa.bool_())], schema=self.change_schema)

    def conformed_changes(self, table: pa.Table, deleted: bool, keys_only: bool = False) -> pa.Table:
        arrays = []
        for field in self.schema:
            if field.name in table.column_names and (not keys_only or field.name in self.key):
                arrays.append(conform_column(field.name, self.columns[field.name], table[field.name]))
            elif field.name in self.key:
                raise DataError(f"a columnar Store for {self.directory} lacks key column {field.name!r}")
            else:
                arrays.append(pa.nulls(table.num_rows, field.type))
        arrays.append(pa.array([deleted] * table.num_rows, pa.bool_()))
        return pa.table(arrays, schema=self.change_schema)

    def bucket_path(self, bucket: int) -> Path:
        return self.directory / f"part-{bucket}.parquet"

    def applied(self, bucket: int) -> pa.Table:
        table = self.cache.get(bucket)
        if table is None:
            path = self.bucket_path(bucket)
            table = _conform_table(pq.read_table(path), self.schema) if path.exists() else self.schema.empty_table()
            self.cache[bucket] = table
        return table

    def rows_of(self, keys: pa.Table) -> pa.Table:
        """The applied rows of `keys` (a conformed key table), from the buckets they hash to."""
        texts = key_texts(keys.columns)
        buckets = sorted({bucket_of(text, self.buckets) for text in texts})
        found = [self.applied(b).join(keys, self.key, join_type="left semi") for b in buckets]
        return pa.concat_tables(found).select(self.schema.names) if found else self.schema.empty_table()


class ParquetTransactor:
    """Transactor of one runtime connection writing Parquet datasets (see the module docstring)."""

    def __init__(self, access: HostAccess | None = None) -> None:
        self._access = access
        self._datasets: list[_Dataset] = []
        self._name = ""
        self._fences: dict[Path, int] = {}  # dataset directory -> the fence this runtime's Open set
        self._pending: dict[str, list[list[str]]] = {}

    def open(self, open: Open) -> Opened:
        root, buckets = _config_root(open.spec.config)
        self._name = open.spec.name
        pending = open.driver_state.get("pending")
        self._pending = dict(pending) if isinstance(pending, dict) else {}
        self._datasets = []
        for binding in open.spec.bindings:
            confined_dataset_directory(root, binding.resource_path, self._access)
            apply_binding(root, buckets, self._name, binding)  # idempotent: a no-op once Apply ran
            directory = dataset_directory(root, binding.resource_path)
            with _locked(directory):
                manifest = _read_manifest(directory)
                assert manifest is not None
                manifest["fence"] += 1  # fences off every earlier runtime of this dataset
                _write_manifest(directory, manifest)
                # Staged by a transaction the recovery log never committed: discard, never apply.
                for staged in (directory / "_staging").glob("*"):
                    if staged.name not in self._pending:
                        shutil.rmtree(staged, ignore_errors=True)
            self._fences[directory] = manifest["fence"]
            self._datasets.append(_Dataset(directory, binding, manifest))
        return Opened(runtime_checkpoint=None)  # the runtime's recovery log holds the checkpoint

    def _check_fence(self, directory: Path) -> dict[str, Any]:
        """The dataset's manifest, if no newer runtime opened it (call under its lock)."""
        manifest = _read_manifest(directory)
        if manifest is None:
            raise FencedOff(f"materialization {self._name}: the manifest of dataset {directory} is gone")
        fence = self._fences.get(directory)  # None: a pending transaction of a dataset no longer in the spec
        if fence is not None and manifest["fence"] != fence:
            raise FencedOff(f"materialization {self._name} fenced off by another runtime (dataset {directory})")
        return manifest

    # ------------------------------------------------------------------------------------------ loads

    def load(self, loads: list[Load]) -> Iterable[Loaded]:
        by_binding: dict[int, list[list[Any]]] = {}
        for load in loads:
            by_binding.setdefault(load.binding, []).append(load.key)
        loaded: list[Loaded] = []
        for index, keys in by_binding.items():
            dataset = self._datasets[index]
            requested = dataset.keys_table(keys)
            original = dict(zip(key_texts(requested.columns), keys))  # Loaded must echo the key as sent
            rows = dataset.rows_of(requested)
            names = list(dataset.binding.columns)
            documents = documents_from_table([(c, dataset.columns[c]) for c in names], rows)
            for text, document in zip(key_texts(rows.select(dataset.key).columns), documents):
                loaded.append(Loaded(index, original[text], document))
        return loaded

    def load_columns(self, request: LoadColumns) -> LoadedColumns:
        """The stored rows of the requested keys, in StoreColumns' conventions (TIMESTAMPTZ as int64 microseconds,
        JSON as text, other columns as Parquet holds them)."""
        dataset = self._datasets[request.binding]
        keys = pa.table([conform_column(k, dataset.columns[k], request.keys[k]) for k in dataset.key],
                        schema=dataset.key_schema)
        rows = dataset.rows_of(keys).select(list(dataset.binding.columns))
        for i, field in enumerate(rows.schema):
            if dataset.columns[field.name] == "TIMESTAMPTZ":
                rows = rows.set_column(i, field.name, rows[field.name].cast(pa.int64()))
        return LoadedColumns(request.binding, rows)

    # ------------------------------------------------------------------------------------------ stores

    def store(self, stores: list[Store]) -> None:
        by_binding: dict[int, list[Store]] = {}
        for store in stores:
            by_binding.setdefault(store.binding, []).append(store)
        for index, group in by_binding.items():
            dataset = self._datasets[index]
            deleted = [s.key for s in group if s.delete]
            if deleted and dataset.binding.delta_updates:
                raise FeatureNotSupported("deletions cannot be stored in a delta-updates (append-only) dataset")
            if deleted:
                dataset.changes.append(dataset.change_table(deleted, {}, True))
            upserts = [s for s in group if not s.delete]
            if upserts:
                values = {c: [s.values[i] for s in upserts] for i, c in enumerate(dataset.binding.values)}
                dataset.changes.append(dataset.change_table([s.key for s in upserts], values, False))

    def store_columns(self, message: StoreColumns) -> None:
        dataset = self._datasets[message.binding]
        if dataset.binding.delta_updates and message.deleted is not None and message.deleted.num_rows:
            raise FeatureNotSupported("deletions cannot be stored in a delta-updates (append-only) dataset")
        for table, deleted in ((message.deleted, True), (message.rows, False), (message.updated, False)):
            if table is not None and table.num_rows:
                dataset.changes.append(dataset.conformed_changes(table, deleted, keys_only=deleted))

    # ------------------------------------------------------------------------------------------ commit

    def start_commit(self, runtime_checkpoint: dict[str, Any]) -> StartedCommit:
        """Stage this transaction's new files and name them in the driver state the recovery log commits."""
        txn = f"{time.time_ns():016x}{os.urandom(4).hex()}"  # sorts by time: pending ones apply in order
        pairs: list[list[str]] = []
        for dataset in self._datasets:
            changes, dataset.changes = dataset.changes, []
            if not changes:
                dataset.cache = {}
                continue
            staging = dataset.directory / "_staging" / txn
            with _locked(dataset.directory):
                self._check_fence(dataset.directory)
                staging.mkdir(parents=True)
                table = pa.concat_tables(changes)
                if dataset.binding.delta_updates:
                    files = self._stage_appends(dataset, table, staging, txn)
                else:
                    files = self._stage_buckets(dataset, table, staging)
                _fsync_directory(staging)
                _fsync_directory(staging.parent)
            dataset.cache = {}
            pairs += [[str(staging / target.name), str(target)] for target in files]
        if not pairs:
            return StartedCommit(state=None)
        self._pending[txn] = pairs
        return StartedCommit(StateUpdate({"pending": {txn: pairs}}, merge_patch=True))

    @staticmethod
    def _stage_appends(dataset: _Dataset, table: pa.Table, staging: Path, txn: str) -> list[Path]:
        rows = table.drop_columns([_DELETED])
        targets = []
        for n, start in enumerate(range(0, rows.num_rows, DELTA_FILE_ROWS)):
            target = dataset.directory / f"part-{txn}-{n}.parquet"
            _write_parquet(rows.slice(start, DELTA_FILE_ROWS), staging / target.name)
            targets.append(target)
        return targets

    @staticmethod
    def _stage_buckets(dataset: _Dataset, table: pa.Table, staging: Path) -> list[Path]:
        """Per touched bucket: its applied rows minus this transaction's keys, plus its upserts, sorted by key."""
        if any(table[k].null_count for k in dataset.key):
            raise DataError(f"a key column of {dataset.directory} is NULL")
        texts = key_texts(table.select(dataset.key).columns)
        last = {text: i for i, text in enumerate(texts)}  # a key stored twice: the later Store wins
        if len(last) < len(texts):
            keep = sorted(last.values())
            table, texts = table.take(keep), [texts[i] for i in keep]
        buckets = pa.array([bucket_of(text, dataset.buckets) for text in texts], pa.int32())
        targets = []
        for bucket in pc.unique(buckets).to_pylist():
            part = table.filter(pc.equal(buckets, bucket))
            applied = dataset.applied(bucket)
            kept = applied.join(part.select(dataset.key), dataset.key, join_type="left anti")
            upserts = part.filter(pc.invert(part[_DELETED])).drop_columns([_DELETED])
            if upserts.num_rows == 0 and kept.num_rows == applied.num_rows:
                continue  # only deletions of keys the bucket does not hold: nothing changes
            merged = pa.concat_tables([kept.select(dataset.schema.names).cast(dataset.schema), upserts])
            target = dataset.bucket_path(bucket)
            _write_parquet(merged.sort_by([(k, "ascending") for k in dataset.key]), staging / target.name)
            targets.append(target)
        return targets

    def acknowledge(self) -> Acknowledged:
        """Apply every pending transaction (idempotently), then drop it from the driver state."""
        if not self._pending:
            return Acknowledged(state=None)
        applied = sorted(self._pending)
        for txn in applied:
            self._apply(txn, self._pending[txn])
        self._pending = {}
        return Acknowledged(StateUpdate({"pending": {txn: None for txn in applied}}, merge_patch=True))

    def _apply(self, txn: str, pairs: list[list[str]]) -> None:
        by_directory: dict[Path, list[tuple[Path, Path]]] = {}
        for staged, target in pairs:
            by_directory.setdefault(Path(target).parent, []).append((Path(staged), Path(target)))
        for directory, files in by_directory.items():
            # The recovery log names these paths: only the datasets this runtime opened (and confined) are written.
            if directory not in self._fences or any(Path(staged).parent.parent.parent != directory
                                                    for staged, _ in files):
                raise InvalidParameterValue(f"PARQUET sink: transaction {txn} names files outside its datasets")
            with _locked(directory):
                manifest = self._check_fence(directory)
                if txn not in manifest["applied"]:
                    schema = _schema(manifest["columns"])
                    for staged, target in files:
                        if not staged.exists():
                            continue  # renamed by an earlier apply of this transaction that was cut short
                        if pq.read_schema(staged).names != schema.names:  # staged before an Apply added columns
                            conformed = staged.with_name(f"_{staged.name}.tmp")
                            _write_parquet(_conform_table(pq.read_table(staged), schema), conformed)
                            os.replace(conformed, staged)
                        os.replace(staged, target)
                    _fsync_directory(directory)
                    manifest["applied"] = (manifest["applied"] + [txn])[-MANIFEST_TRANSACTIONS:]
                    _write_manifest(directory, manifest)
                shutil.rmtree(directory / "_staging" / txn, ignore_errors=True)

    def close(self) -> None:
        for dataset in self._datasets:
            dataset.changes = []  # uncommitted changes never reached a file
            dataset.cache = {}
