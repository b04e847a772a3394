"""The `headrace` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from headrace import __version__


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headrace", description="Streaming SQL over idempotent webhooks.")
    parser.add_argument("--version", action="version", version=f"headrace {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run the server in the foreground")
    up.add_argument("--data-dir", type=Path, default=Path("headrace-data"))
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--pg-port", type=int, default=6875)
    up.add_argument("--http-port", type=int, default=6876)
    up.add_argument("--spark-master", default=None,
                    help="where the pipeline runs: local[N] (default local[*]), spark://host:port (a standalone "
                         "cluster), sc://host:port (a Spark Connect server; also env SPARK_REMOTE), yarn, k8s://...; "
                         "checked at start (docs/deploy.md)")
    up.add_argument("--advertise-host", default="127.0.0.1",
                    help="the address Spark executors, a remote driver or a Spark Connect server reach this server "
                         "at (its log read service and materialization driver listen there; default 127.0.0.1: Spark "
                         "runs on this host)")
    up.add_argument("--log-service-port", type=int, default=0,
                    help="port of the log read service Spark reads the logs through when the master is not local "
                         "(default: a free one)")
    up.add_argument("--tls-cert", type=Path, help="PEM certificate (chain) for pgwire TLS; needs --tls-key")
    up.add_argument("--tls-key", type=Path, help="PEM private key for --tls-cert")
    up.add_argument("--auth", default="loopback=trust,all=scram-sha-256",
                    help="pgwire authentication: trust | password | scram-sha-256, or first-match rules "
                         "[USER@]HOSTS=METHOD,... with HOSTS all, loopback or a CIDR "
                         "(default: loopback=trust,all=scram-sha-256)")
    up.add_argument("--store", default=os.environ.get("HEADRACE_STORE") or None, metavar="URL",
                    help="the store PostgreSQL: a postgresql:// URL of an existing server (its role needs CREATEROLE "
                         "and to own the URL's database; docs/store.md), or by default (also env HEADRACE_STORE) a "
                         "private PostgreSQL 15 cluster run by headrace under <data-dir>/postgres")
    up.add_argument("--serving-store", choices=("postgres", "duckdb"),
                    default=os.environ.get("HEADRACE_SERVING_STORE") or None,
                    help="where sources', tables' and views' rows are kept: the store PostgreSQL, where SELECTs over "
                         "them run (the default for a new data directory), or the DuckDB file <data-dir>/store.duckdb; "
                         "a data directory keeps the choice of its first start (also env HEADRACE_SERVING_STORE; "
                         "docs/store.md)")
    up.add_argument("--store-threads", type=int, default=None,
                    help="DuckDB worker threads of the serving store (default: one per core but one, which is left "
                         "to the server's event loop)")
    up.add_argument("--insecure", action="store_true",
                    help="allow --auth trust rules that reach beyond loopback while --host is not a loopback address "
                         "(refused otherwise; logged as a warning)")
    pg_limits = up.add_argument_group("connection and statement limits (docs/settings.md)")
    pg_limits.add_argument("--max-connections", type=int, default=100,
                           help="pgwire connections at once; one more gets 53300 (default 100, as PostgreSQL)")
    pg_limits.add_argument("--max-message-bytes", type=int, default=64 << 20,
                           help="longest pgwire message once authenticated; longer gets 54000 and a close "
                                "(default 64 MiB)")
    pg_limits.add_argument("--auth-timeout", type=float, default=60.0,
                           help="seconds a pgwire connection has to complete authentication (default 60, as "
                                "PostgreSQL's authentication_timeout)")
    pg_limits.add_argument("--idle-session-timeout", type=float, default=0.0,
                           help="close pgwire sessions idle outside a transaction this many seconds (default 0: "
                                "never, as PostgreSQL)")
    pg_limits.add_argument("--max-statement-bytes", type=int, default=1 << 20,
                           help="longest SQL text per request, pgwire and HTTP; longer gets 54000 (default 1 MiB)")
    host = up.add_argument_group("what sinks may do on this host (docs/settings.md); default: nothing")
    host.add_argument("--allow-command", action="append", dest="allow_commands", default=[], metavar="CMD",
                      help="an exact command line superusers may run as INTO EXTERNAL (COMMAND '...') (repeatable)")
    host.add_argument("--allow-directory", action="append", dest="allow_directories", default=[], metavar="DIR",
                      help="a directory under which superusers may write PARQUET sinks (repeatable; never the "
                           "data directory)")
    webhook = up.add_argument_group("webhook settings (docs/webhooks.md#settings)")
    webhook.add_argument("--webhook-max-body-bytes", type=int, default=5 << 20,
                         help="larger request bodies (after gzip/deflate decoding) get 413 (default 5 MiB)")
    webhook.add_argument("--webhook-max-concurrent-requests", type=int, default=500,
                         help="requests in flight at once, all sources; beyond it 429 (default 500)")
    webhook.add_argument("--webhook-max-concurrent-requests-per-source", type=int, default=500,
                         help="requests in flight at once for one source; beyond it 429 (default 500)")
    webhook.add_argument("--webhook-group-commit-max-batch", type=int, default=1024,
                         help="rows per fsync at most (default 1024)")
    webhook.add_argument("--webhook-group-commit-max-wait-ms", type=float, default=0.0,
                         help="wait up to this long for a batch to fill: fewer fsyncs, slower 200s (default 0)")
    webhook.add_argument("--webhook-request-log-size", type=int, default=100,
                         help="requests kept per source in headrace_internal.webhook_requests (default 100)")
    webhook.add_argument("--webhook-eviction-interval-s", type=float, default=1.0,
                         help="how often idempotency keys older than the window are forgotten (default 1)")
    http = up.add_argument_group("HTTP port settings (docs/settings.md#http-port)")
    http.add_argument("--http-allowed-origin", action="append", default=[], metavar="ORIGIN",
                      help="a web origin (scheme://host[:port]) whose pages may use /api/sql and the WebSocket, "
                           "authenticating by password (repeatable; default: same-origin only)")
    http.add_argument("--http-header-timeout-s", type=float, default=60.0,
                      help="a request head must arrive within this, else 408 and close (default 60, as nginx)")
    http.add_argument("--http-body-timeout-s", type=float, default=60.0,
                      help="longest wait between two reads of a request body, else 408 and close (default 60)")
    http.add_argument("--http-keepalive-timeout-s", type=float, default=75.0,
                      help="an idle keep-alive connection is closed after this (default 75, as nginx)")
    driver_test = commands.add_parser(
        "driver-test", help="run the driver conformance kit against a sink driver (docs/drivers.md)",
        description="Drive a sink driver through scripted transactions, restarts at every phase boundary, a zombie "
                    "Open, delta updates and schema changes; print which guarantees held. Exit 0: every scenario "
                    "that ran passed; 1: one failed; 2: usage error.")
    driver_test.add_argument("driver", help="postgres | redis | parquet | http | command:<shell command> | "
                                            "address:<host:port>")
    driver_test.add_argument("--config", help="the endpoint config as a JSON object (required for postgres and "
                                              "redis; parquet, http and the JSON Lines example are provisioned)")
    driver_test.add_argument("--json", action="store_true", help="print the report as JSON")
    driver_test.add_argument("--scenario", action="append", dest="scenarios",
                             help="run only this scenario (repeatable): spec, transactions, restarts, zombie, delta, "
                                  "schema-added-column, schema-changed-key")
    driver_test.add_argument("--guarantee", choices=("exactly-once", "at-least-once"),
                             help="what an external driver promises (default: exactly-once)")
    driver_test.add_argument("--fencing", choices=("yes", "no"),
                             help="whether an external driver fences zombie runtimes (default: yes)")
    args = parser.parse_args(argv)

    if args.command == "driver-test":
        from headrace.materialize.conformance.cli import driver_test_main

        sys.exit(driver_test_main(args))

    if args.command == "up":
        from headrace.http.origin import OriginPolicy
        from headrace.http.settings import HttpSettings
        from headrace.pgwire.auth import parse_auth_rules
        from headrace.pgwire.limits import PgLimits
        from headrace.server import DataDirLocked, InsecureConfiguration, ServerConfig, run
        from headrace.store.postgres_server import StoreUnavailable
        from headrace.store.serving_choice import ServingStoreMismatch
        from headrace.webhook.ingest import IngestSettings

        webhook_settings = IngestSettings(
            max_body_bytes=args.webhook_max_body_bytes,
            max_concurrent_requests=args.webhook_max_concurrent_requests,
            max_concurrent_requests_per_source=args.webhook_max_concurrent_requests_per_source,
            group_commit_max_batch=args.webhook_group_commit_max_batch,
            group_commit_max_wait_ms=args.webhook_group_commit_max_wait_ms,
            request_log_size=args.webhook_request_log_size,
            eviction_interval_s=args.webhook_eviction_interval_s)

        try:
            OriginPolicy(args.http_allowed_origin)
        except ValueError as exc:
            parser.error(str(exc))
        for name in ("http_header_timeout_s", "http_body_timeout_s", "http_keepalive_timeout_s"):
            if not getattr(args, name) > 0:
                parser.error(f"--{name.replace('_', '-')} must be positive")
        http_settings = HttpSettings(header_timeout_s=args.http_header_timeout_s,
                                     body_timeout_s=args.http_body_timeout_s,
                                     keepalive_timeout_s=args.http_keepalive_timeout_s,
                                     allowed_origins=tuple(args.http_allowed_origin))

        if (args.tls_cert is None) != (args.tls_key is None):
            parser.error("--tls-cert and --tls-key go together")
        try:
            parse_auth_rules(args.auth)
        except ValueError as exc:
            parser.error(str(exc))
        if args.max_connections < 1 or args.max_message_bytes < 65_536 or args.auth_timeout <= 0 \
                or args.idle_session_timeout < 0 or args.max_statement_bytes < 1024:
            parser.error("--max-connections >= 1, --max-message-bytes >= 65536, --auth-timeout > 0, "
                         "--idle-session-timeout >= 0 and --max-statement-bytes >= 1024")
        from headrace.pipeline.spark_master import BadSparkMaster, choose_master, parse_master

        spark_master = choose_master(args.spark_master, os.environ.get("SPARK_REMOTE"))
        try:
            parse_master(spark_master)
        except BadSparkMaster as exc:
            parser.error(str(exc))
        if not 0 <= args.log_service_port < 65536:
            parser.error("--log-service-port must be a port number (0: a free one)")
        pg_limits_config = PgLimits(max_message_bytes=args.max_message_bytes, max_connections=args.max_connections,
                                    auth_timeout_s=args.auth_timeout, idle_session_timeout_s=args.idle_session_timeout)

        from headrace.cli_progress import watch_startup

        watch_startup(args.host, args.http_port)  # on a terminal: a progress bar until /health/ready says ready
        try:
            run(ServerConfig(data_dir=args.data_dir, host=args.host, pg_port=args.pg_port,
                             http_port=args.http_port, spark_master=spark_master,
                             advertise_host=args.advertise_host, log_service_port=args.log_service_port,
                             tls_cert=args.tls_cert, tls_key=args.tls_key, auth=args.auth,
                             webhook=webhook_settings, http=http_settings, store_threads=args.store_threads,
                             pg_limits=pg_limits_config, max_statement_bytes=args.max_statement_bytes,
                             insecure=args.insecure, allow_commands=tuple(args.allow_commands),
                             allow_directories=tuple(args.allow_directories), store_url=args.store,
                             serving_store=args.serving_store))
        except (DataDirLocked, InsecureConfiguration, StoreUnavailable, BadSparkMaster, ServingStoreMismatch) as exc:
            print(f"headrace: {exc}", file=sys.stderr)
            sys.exit(1)
        except OSError as exc:
            print(f"headrace: {exc}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
