"""headrace.pgwire: the PostgreSQL wire protocol front end.

Layers (sans-I/O below the transport):
  messages      frontend decoder, backend encoders
  types         OIDs, text/binary value codecs
  auth          authentication rules, cleartext and SCRAM-SHA-256 exchanges; security: + TLS
  connection    per-connection state machine (startup, simple_query, extended_query, results)
  server        the asyncio transport: start_pgwire_server(adapter, host, port, security)

Import the submodules directly (headrace.pgwire.server, ...): this package imports nothing
eagerly, so the coordinator can use pgwire.types without an import cycle.
"""
