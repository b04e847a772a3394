"""Materialization drivers over gRPC (docs/drivers.md).

  driver.proto        the Driver service and its messages: the contract for drivers in any language
  driver_pb2*.py[i]   generated from it by scripts/gen_driver_proto.sh (committed; do not edit)
  codec.py            protocol.py's dataclasses <-> the proto messages, lossless
  server.py           serve_grpc_driver: a Transactor (+ Connector) served with driver.py's connection loop
  client.py           GrpcDriverConnection: the runtime's DriverConnection over a Materialize stream
  external.py         ExternalDriver / RemoteDriver: `INTO EXTERNAL (COMMAND = ...)` / `(ADDRESS = ...)`

Names are imported lazily, so importing this package does not load grpc.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "GrpcDriverConnection": "client",
    "GrpcDriverServer": "server",
    "serve_grpc_driver": "server",
    "run_grpc_driver": "server",
    "ExternalDriver": "external",
    "RemoteDriver": "external",
    "driver_for": "external",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
