"""The `headrace` command."""

from __future__ import annotations

import argparse
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
    up.add_argument("--spark-master", default="local[*]")
    args = parser.parse_args(argv)

    if args.command == "up":
        from headrace.server import DataDirLocked, ServerConfig, run

        try:
            run(ServerConfig(data_dir=args.data_dir, host=args.host, pg_port=args.pg_port,
                             http_port=args.http_port, spark_master=args.spark_master))
        except DataDirLocked as exc:
            print(f"headrace: {exc}", file=sys.stderr)
            sys.exit(1)
        except OSError as exc:
            print(f"headrace: {exc}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
