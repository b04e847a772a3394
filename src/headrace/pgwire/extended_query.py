"""The extended query protocol: Parse, Bind, Describe, Execute and Close.

Each handler writes its response into `out` or raises (HeadraceError or a bug); the connection
turns a raise into ErrorResponse and then skips messages until Sync."""

from __future__ import annotations

import asyncio

from headrace.coordinator.responses import SendingRows, Subscribing
from headrace.errors import ProtocolViolation
from headrace.pgwire import messages
from headrace.pgwire.copy import CopyIn, Flush, is_copy_response, start_copy
from headrace.pgwire.interfaces import SessionClient
from headrace.pgwire.results import WatchPeer, resolve_formats, row_description, send_rows, stream_subscription
from headrace.pgwire.types import TEXT_FORMAT, decode_parameter

UNNAMED = ""


class ExtendedQueryHandler:
    """Per-connection extended-protocol bookkeeping the coordinator does not need: each portal's
    result format codes, as Bind gave them (Describe P and Execute encode with them)."""

    def __init__(self, session: SessionClient) -> None:
        self._session = session
        self._result_formats: dict[str, tuple[int, ...]] = {}

    async def parse(self, message: messages.Parse, out: bytearray) -> None:
        await self._session.prepare(message.statement, message.sql, message.param_types)
        out += messages.parse_complete()

    def bind(self, message: messages.Bind, out: bytearray) -> None:
        parameter_count = len(message.params)
        format_codes = message.param_formats
        if len(format_codes) > 1 and len(format_codes) != parameter_count:
            raise ProtocolViolation(f"bind message has {len(format_codes)} parameter formats but "
                                    f"{parameter_count} parameters")
        description = self._session.describe_statement(message.statement)
        if parameter_count != len(description.param_types):
            raise ProtocolViolation(
                f'bind message supplies {parameter_count} parameters, but prepared statement '
                f'"{message.statement}" requires {len(description.param_types)}')
        formats = resolve_formats(format_codes, parameter_count)
        values: list[object]
        if description.raw_parameters:  # the store PostgreSQL decodes them (and reports their errors)
            values = list(zip(formats, message.params, strict=True))
        else:
            values = [decode_parameter(type_oid, format_code, data) for type_oid, format_code, data
                      in zip(description.param_types, formats, message.params, strict=True)]
        # Validate the result formats now, as PostgreSQL does, rather than at the first Execute.
        resolve_formats(message.result_formats, len(description.columns or ()))
        self._session.bind(message.portal, message.statement, values, message.result_formats)
        self._result_formats[message.portal] = message.result_formats
        out += messages.bind_complete()

    def describe(self, message: messages.Describe, out: bytearray) -> None:
        if message.kind == "S":
            description = self._session.describe_statement(message.name)
            out += messages.parameter_description(description.param_types)
            columns = description.columns
            formats = (TEXT_FORMAT,) * len(columns or ())  # unknown until Bind: PostgreSQL says text
        else:
            columns = self._session.describe_portal(message.name)
            formats = resolve_formats(self._result_formats.get(message.name, ()), len(columns or ()))
        out += messages.no_data() if columns is None else row_description(columns, formats)

    async def execute(self, message: messages.Execute, out: bytearray, cancel: asyncio.Event,
                      flush: Flush | None = None, watch_peer: WatchPeer | None = None) -> CopyIn | None:
        """A COPY FROM returns its CopyIn: the connection then collects the client's data."""
        result = await self._session.execute(message.portal, max(message.max_rows, 0), cancel,
                                             stream=flush is not None)
        if is_copy_response(result):
            return await start_copy(out, result, cancel, flush, None)  # type: ignore[arg-type]
        if isinstance(result, Subscribing):  # streams (max_rows does not apply) until UP TO or a cancel
            formats = resolve_formats(self._result_formats.get(message.portal, ()), len(result.columns))
            await stream_subscription(out, result, formats, with_row_description=False, cancel=cancel, flush=flush,
                                      watch_peer=watch_peer)
            return None
        column_count = len(result.columns) if isinstance(result, SendingRows) else 0
        formats = resolve_formats(self._result_formats.get(message.portal, ()), column_count)
        await send_rows(out, result, formats, with_row_description=False, flush=flush,
                        next_piece=lambda: self._session.execute(message.portal, 0, cancel, stream=True))
        return None

    def close(self, message: messages.Close, out: bytearray) -> None:
        if message.kind == "S":
            self._session.close_statement(message.name)
        else:
            self._session.close_portal(message.name)
            self._result_formats.pop(message.name, None)
        out += messages.close_complete()

    def on_sync(self) -> None:
        """Sync (and the end of a simple query) drops the unnamed portal, so its formats go too."""
        self._result_formats.pop(UNNAMED, None)
