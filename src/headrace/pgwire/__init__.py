"""headrace.pgwire: the PostgreSQL wire protocol front end.

Layers (sans-I/O below the transport):
  messages      frontend decoder, backend encoders
  types         OIDs, text/binary value codecs
  connection    per-connection state machine (startup, simple_query, extended_query, results)
  server        the asyncio transport: start_pgwire_server(adapter, host, port)
"""

from headrace.pgwire.connection import CancelRequested, ConnectionState, PgConnection, Signal
from headrace.pgwire.server import start_pgwire_server

__all__ = ["CancelRequested", "ConnectionState", "PgConnection", "Signal", "start_pgwire_server"]
