"""`headrace up`: one process that serves pgwire, HTTP webhooks and the serving-store driver, and
supervises the Spark pipeline process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import gc
import logging
import os
import shutil
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from headrace.catalog.catalog import Catalog
from headrace.catalog.host_access import HostAccess
from headrace.catalog.roles import RoleCatalog
from headrace.coordinator.client import AdapterClient
from headrace.coordinator.coordinator import Coordinator
from headrace.coordinator.fast_path import FastPathCollector
from headrace.coordinator.sources import DataLayout, SourceResources
from headrace.coordinator.subscribe_postgres import close_reader_pool
from headrace.http.app import ServerState, make_app, register_metrics, run_http
from headrace.http.settings import HttpSettings
from headrace.http.sql_api import set_sql_adapter
from headrace.materialize.driver import Connector, TransactorFactory, start_driver_server
from headrace.materialize.drivers.postgres_serving import PostgresServingConnector, PostgresServingTransactor
from headrace.materialize.drivers.serving import ServingConnector, ServingTransactor
from headrace.pgwire.auth import insecure_trust_rules, parse_auth_rules
from headrace.pgwire.limits import PgLimits, raise_open_file_limit
from headrace.pgwire.security import SecurityConfig, make_tls_context
from headrace.pgwire.server import start_pgwire_server
from headrace.metrics.setup import install as install_observability
from headrace.log.read_service import LogReadCollector, LogReadService, start_log_read_service, write_token
from headrace.pipeline.spark_master import BadSparkMaster, check_reachable, parse_master
from headrace.pipeline.status import PipelineCollector
from headrace.pipeline.supervisor import PipelineSupervisor
from headrace.sql import limits as sql_limits
from headrace.sql.ddl import item_from_create_sql
from headrace.sql.limits import DEFAULT_MAX_STATEMENT_BYTES
from headrace.store.postgres_server import PostgresStore
from headrace.store.serving_choice import ServingStoreMismatch, choose_serving_store
from headrace.store.query import STATIC_SETTINGS
from headrace.store.postgres_serving import PostgresServingStore
from headrace.store.serving import ServingStore
from headrace.store.system_tables import SystemTables
from headrace.webhook.ingest import IngestRegistry, IngestSettings

log = logging.getLogger("headrace")


@dataclass(frozen=True)
class ServerConfig:
    data_dir: Path = Path("headrace-data")
    host: str = "127.0.0.1"
    pg_port: int = 6875
    http_port: int = 6876
    spark_master: str = "local[*]"
    # The address Spark (executors, a remote driver, a Spark Connect server) reaches this server at: its log read
    # service and materialization driver listen there (docs/deploy.md). Loopback: Spark runs on this host.
    advertise_host: str = "127.0.0.1"
    log_service_port: int = 0  # the log read service's port (0: a free one); started for non-local masters only
    tls_cert: Path | None = None  # with tls_key: SSLRequest is answered 'S'
    tls_key: Path | None = None
    auth: str = "loopback=trust,all=scram-sha-256"  # pgwire authentication rules (pgwire/auth.py)
    webhook: IngestSettings = IngestSettings()  # limits, group commit, request log (docs/webhooks.md)
    http: HttpSettings = HttpSettings()  # the HTTP port's timeouts and allowed Origins (docs/settings.md)
    store_threads: int | None = None  # DuckDB's threads; None: one per core but one (store/serving.py)
    pg_limits: PgLimits = PgLimits()  # pgwire message size, connection count and timeouts (pgwire/limits.py)
    max_statement_bytes: int = DEFAULT_MAX_STATEMENT_BYTES  # SQL text per statement, pgwire and HTTP (sql/limits.py)
    insecure: bool = False  # allow trust rules that reach beyond loopback on a non-loopback address
    # What sinks may run and write on this host (catalog/host_access.py); empty: no EXTERNAL COMMAND, no PARQUET.
    allow_commands: tuple[str, ...] = ()
    allow_directories: tuple[str, ...] = ()
    # The store PostgreSQL (docs/store.md): None runs a private cluster under <data_dir>/postgres; a URL uses that server.
    store_url: str | None = None
    # Where sources', tables' and views' rows live: "postgres" (the store PostgreSQL) or "duckdb" (<data_dir>/store.duckdb);
    # None: what the data directory chose at its first start, else postgres (store/serving_choice.py).
    serving_store: str | None = None


class DataDirLocked(Exception):
    pass


def lock_data_dir(data_dir: Path) -> int:
    """One server per data directory: a second one would corrupt the logs and the store."""
    data_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(data_dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise DataDirLocked(f"another headrace server is using {data_dir}") from None
    return descriptor


CHANGELOG_RETENTION_MS = 600_000  # SUBSCRIBE ... AS OF may reach 10 minutes back
CHANGELOG_COMPACTION_INTERVAL_S = 60.0


async def _compact_changelogs_periodically(store: ServingStore | PostgresServingStore, executor: ThreadPoolExecutor,
                                          holds: Callable[[], dict[str, int]]) -> None:
    """Keep the changelogs SUBSCRIBE reads bounded: drop changes older than the retention, except those a sink
    has yet to send (`holds`)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(CHANGELOG_COMPACTION_INTERVAL_S)
        try:
            await loop.run_in_executor(executor, store.compact_changelogs, CHANGELOG_RETENTION_MS, None, holds())
        except Exception:  # noqa: BLE001 - compaction is retried next round; serving goes on
            log.exception("changelog compaction failed")


WARM_UP_S = 30.0
# Niceness of the threads that apply the pipeline's commits to DuckDB: a little below the event loop, so a webhook
# does not wait for a core behind a commit, but not so far that the commits starve behind the store's queries.
# Measured on 2 cores: at 5,000 webhooks/s ack p99 8.8-15.7 ms at nice 4 against 9.7-23 ms at nice 0 (6 runs each);
# view freshness p50 0.38-0.43 s at nice 4, and 2.4 s at nice 10 (the commits starved behind 400 SELECTs/s).
APPLY_NICENESS = 4


def lower_apply_thread_priority() -> None:
    """ThreadPoolExecutor initializer (a Linux thread has its own niceness)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), APPLY_NICENESS)


async def _freeze_after_warm_up(delay_s: float = WARM_UP_S) -> None:
    """Freeze once more after the first requests: what they built once and keep (modules imported on first use,
    SQL dialect tables, caches) is most of what the collector would rescan at every full collection. Those objects
    lie scattered over a large heap, so a full pass over ~35k of them cost 17-22 ms of the event loop every ~9 s
    at 5,000 webhooks/s. Once only: an object frozen while alive that later dies in a reference cycle is never
    collected, a bounded cost once and an unbounded one if repeated."""
    await asyncio.sleep(delay_s)
    gc.collect()
    gc.freeze()


class InsecureConfiguration(Exception):
    pass


def check_listen_security(config: ServerConfig) -> None:
    """Refuse to serve a non-loopback address where a trust rule would let other machines in without a password,
    unless --insecure is given; then warn loudly, in the log, once."""
    trusted = insecure_trust_rules(parse_auth_rules(config.auth), config.host)
    if not trusted:
        return
    shown = ", ".join(f"{rule.hosts}" for rule in trusted)
    if not config.insecure:
        raise InsecureConfiguration(
            f"refusing to listen on {config.host} with --auth trusting {shown}: any client that reaches this address "
            "would be a superuser without a password. Trust loopback only (the default), or pass --insecure")
    log.warning("INSECURE: listening on %s with --auth trusting %s: anyone who reaches this address is a superuser "
                "without a password (--insecure)", config.host, shown)


async def serve(config: ServerConfig, stop: asyncio.Event) -> None:
    check_listen_security(config)
    # A bad or unreachable master fails `headrace up` now, before anything is served (BadSparkMaster).
    await asyncio.to_thread(check_reachable, parse_master(config.spark_master))
    sql_limits.configure(config.max_statement_bytes)
    # current_setting('max_connections') answers what this server enforces (pgwire/limits.py).
    STATIC_SETTINGS["max_connections"] = str(config.pg_limits.max_connections)
    lock = lock_data_dir(config.data_dir)
    layout = DataLayout(config.data_dir.resolve())
    try:
        config = dataclasses.replace(config, serving_store=choose_serving_store(layout.root, config.serving_store))
    except ServingStoreMismatch:
        os.close(lock)
        raise
    roles = RoleCatalog(layout.root)
    # Checked at once (binaries, URL), started in a thread while the rest of headrace and the pipeline start: initdb
    # and pg_ctl are ~1 s on a first start; stopped last, after everything that uses it.
    postgres = PostgresStore(layout.root, config.store_url, max_connections=config.pg_limits.max_connections)
    postgres_started = asyncio.ensure_future(asyncio.to_thread(_start_store, postgres, roles))
    try:
        await _serve(config, stop, layout, roles, postgres, postgres_started)
    finally:
        with contextlib.suppress(Exception):
            await postgres_started
        await asyncio.to_thread(postgres.stop)
        os.close(lock)


def _start_store(postgres: PostgresStore, roles: RoleCatalog) -> None:
    """Start the store and mirror every headrace role into it (sessions would mirror theirs on first use anyway;
    a role that cannot be mirrored is logged, its sessions get the error)."""
    postgres.start()
    for role in roles.list_roles():
        try:
            postgres.ensure_role(role.name, superuser=role.superuser)
        except Exception as exc:  # noqa: BLE001 - logged; serving goes on
            log.warning("role %s not mirrored into the store PostgreSQL: %s", role.name, exc)


async def _serve(config: ServerConfig, stop: asyncio.Event, layout: DataLayout, roles: RoleCatalog,
                 postgres: PostgresStore, postgres_started: asyncio.Future[None]) -> None:
    executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="headrace-store")
    registry = IngestRegistry(config.webhook)
    # HTTP first: webhooks get 503 + Retry-After while the store and the sources (and their indexes) open.
    web_state = ServerState()
    http_app = make_app(registry, ready=web_state, http=config.http)
    http_runner = await run_http(http_app, config.host, config.http_port)
    store: ServingStore | PostgresServingStore
    if config.serving_store == "postgres":
        await postgres_started  # the serving store's rows live in it
        store = await asyncio.to_thread(PostgresServingStore, postgres.admin_conninfo)
    else:
        store = ServingStore(layout.store_file, threads=config.store_threads)
    catalog = Catalog(layout.root, item_from_create_sql)
    resources = SourceResources(layout, store, registry, executor)
    for source in catalog.sources():
        await resources.ensure(source)
    web_state.ready = True
    _remove_orphans(layout, {item.id for item in [*catalog.sources(), *catalog.tables()]})

    # The pipeline's commits are applied in threads of their own, a little below the event loop (APPLY_NICENESS).
    apply_executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="headrace-apply",
                                        initializer=lower_apply_thread_priority)
    transactor_factory, connector = _serving_driver(store)
    master = parse_master(config.spark_master)
    driver_server = await start_driver_server(config.advertise_host, 0, transactor_factory, executor=apply_executor,
                                              connector=connector)
    driver_address = (config.advertise_host, driver_server.sockets[0].getsockname()[1])
    log_server = None  # Spark elsewhere reads the logs through it (log/read_service.py); local mode reads the files
    if not master.is_local:
        token = write_token(layout.root)
        log_service = LogReadService(layout.root / "logs", token)
        log_server = await start_log_read_service(log_service, config.advertise_host, config.log_service_port)
        register_metrics(http_app, LogReadCollector(log_service))  # type: ignore[arg-type]  # a duck-typed collector
    fatal: list[str] = []

    def pipeline_cannot_start(message: str) -> None:
        fatal.append(message)
        stop.set()

    supervisor = PipelineSupervisor(
        layout.root, config.spark_master, driver_address,
        log_service=(f"http://{config.advertise_host}:{log_server.address[1]}", token) if log_server else None,
        on_fatal=pipeline_cannot_start)
    register_metrics(http_app, PipelineCollector(supervisor.status))
    host_access = HostAccess.from_options(config.allow_commands, config.allow_directories, layout.root)
    coordinator = Coordinator(catalog, resources, executor, supervisor.update, roles=roles,
                              system_tables=SystemTables(registry, supervisor.status),
                              on_views_changed=supervisor.update_views, host_access=host_access, postgres=postgres)
    register_metrics(http_app, FastPathCollector(coordinator.fast_path))
    # Materialized views: restore what a crash left half-made (tables, public relations), inputs first.
    await asyncio.get_running_loop().run_in_executor(executor, coordinator.views.ensure_all)
    await coordinator.tables.open_all()  # tables: store tables, public relations, logs (coordinator/tables.py)
    await coordinator.sink_manager.start()  # built-in drivers, then a runner per sink (sink/manager.py)
    adapter = AdapterClient(coordinator)
    # headrace_internal.objects / materializations / sessions ..., /metrics families, /health/ready's parts
    await asyncio.to_thread(install_observability, http_app, coordinator, adapter, supervisor, store, registry)
    security = SecurityConfig(parse_auth_rules(config.auth), roles,
                              make_tls_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None)
    set_sql_adapter(http_app, adapter, security)  # the HTTP SQL API answers 503 until now
    pg_server = await start_pgwire_server(adapter, config.host, config.pg_port, security, config.pg_limits)
    await supervisor.start([*catalog.sources(), *catalog.tables()],  # type: ignore[list-item]
                           coordinator.views.in_dependency_order())

    compaction = asyncio.create_task(_compact_changelogs_periodically(store, executor,
                                                                      coordinator.sink_manager.holds))
    warm_freeze: asyncio.Task[None] | None = None
    try:
        await postgres_started
        _print_banner(config, layout, postgres)
        # Everything built at startup lives as long as the server: out of the collector's way, so full
        # collections stay short (a pause there is every connection's and every webhook's latency).
        gc.collect()
        gc.freeze()
        warm_freeze = asyncio.create_task(_freeze_after_warm_up())
        await stop.wait()
    finally:
        print("headrace: shutting down", flush=True)
        compaction.cancel()
        if warm_freeze is not None:
            warm_freeze.cancel()
        web_state.stopping = True  # 503 + Retry-After from now on
        await http_runner.cleanup()  # stop taking webhooks first: nothing acknowledged is lost
        pg_server.close()
        await supervisor.stop()
        await coordinator.sink_manager.close()  # each sink's commit in flight is awaited
        driver_server.close()
        if log_server is not None:
            await log_server.close()
        await registry.close_all()
        await coordinator.tables.close_all()
        executor.shutdown(wait=True)
        apply_executor.shutdown(wait=True)
        if isinstance(store, PostgresServingStore):
            close_reader_pool(store)  # SUBSCRIBE's reader connections (coordinator/subscribe_postgres.py)
        store.close()
    if fatal:
        raise BadSparkMaster(fatal[0])


def _serving_driver(store: ServingStore | PostgresServingStore) -> tuple[TransactorFactory, Connector]:
    """The transactor factory and connector of the serving store's driver (one driver per store kind)."""
    if isinstance(store, PostgresServingStore):
        postgres_store = store
        return (lambda _open: PostgresServingTransactor(postgres_store)), PostgresServingConnector(postgres_store)
    duckdb_store = store
    return (lambda _open: ServingTransactor(duckdb_store)), ServingConnector(duckdb_store)


def _print_banner(config: ServerConfig, layout: DataLayout, postgres: PostgresStore) -> None:
    print(f"headrace is up (data in {layout.root})", flush=True)
    print(f"  SQL:      psql -h {config.host} -p {config.pg_port} -U headrace headrace", flush=True)
    print(f"  webhooks: POST http://{config.host}:{config.http_port}/api/webhook/headrace/public/<source>",
          flush=True)
    where = f"15, embedded (log: {postgres.log_file})" if postgres.embedded else f"at {postgres.display_location}"
    print(f"  store:    PostgreSQL {where}; ready in {postgres.started_in_s or 0:.2f} s", flush=True)


def _remove_orphans(layout: DataLayout, live_ids: set[str]) -> None:
    """A crash during DROP SOURCE can leave its files behind; the catalog says what is live."""
    logs = layout.root / "logs"
    if logs.exists():
        for entry in logs.iterdir():
            if entry.name not in live_ids:
                shutil.rmtree(entry, ignore_errors=True)
    checkpoints = layout.root / "pipeline" / "checkpoints"
    if checkpoints.exists():
        for entry in checkpoints.iterdir():
            if entry.name.removeprefix("source_").removeprefix("table_") not in live_ids:
                shutil.rmtree(entry, ignore_errors=True)


def run(config: ServerConfig) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise_open_file_limit()  # a descriptor per client: the soft limit (often 1,024) would refuse them silently

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await serve(config, stop)

    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(main())


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop unless HEADRACE_EVENT_LOOP=asyncio: its transports cost about half of asyncio's per
    read and write, which is most of a point query's or a webhook request's time outside headrace."""
    choice = os.environ.get("HEADRACE_EVENT_LOOP", "uvloop")
    if choice == "asyncio":
        return None
    if choice != "uvloop":
        raise ValueError(f"HEADRACE_EVENT_LOOP must be uvloop or asyncio, not {choice!r}")
    import uvloop

    return uvloop.new_event_loop
