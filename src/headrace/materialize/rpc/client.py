"""The runtime side over gRPC: `GrpcDriverConnection`, a runtime.DriverConnection over one Materialize stream.

The runtime is blocking (it runs in Spark's foreachBatch and in sink runner threads), so this uses grpc's sync
API: `send` puts proto requests on a bounded queue that feeds the call's request iterator (consumed by grpc's own
thread, which waits for HTTP/2 flow control, so a full queue is back-pressure from the driver), and `recv` reads
the response iterator on the caller's thread.

Every failure of the channel or stream (driver unreachable, stream ended or reset, driver process gone) surfaces
as ConnectionError, which the runtime treats as a lost driver; responses the driver sent before ending the stream
(notably its Error) are still read first.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc

from headrace.materialize.protocol import REQUEST_TYPES, ProtocolOrderError, Request, Response
from headrace.materialize.rpc import driver_pb2 as pb
from headrace.materialize.rpc import driver_pb2_grpc as pb_grpc
from headrace.materialize.rpc.codec import request_to_proto, response_from_proto
from headrace.materialize.transport import MAX_FRAME_BYTES

QUEUE_MESSAGES = 4096  # requests buffered ahead of grpc's writer thread before send() blocks
_PUT_POLL_SECONDS = 0.5  # while blocked on a full queue, how often to check that the stream still lives
# Keepalive pings at gRPC servers' default minimum interval (5 min), so drivers on default settings accept them.
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.max_send_message_length", MAX_FRAME_BYTES),
    ("grpc.keepalive_time_ms", 300_000),
    ("grpc.keepalive_timeout_ms", 20_000),
]
_END = object()  # ends the request iterator: a half-close


class GrpcDriverConnection:
    """A DriverConnection over a gRPC Materialize stream to `address` ("host:port"). Blocking; one thread at a
    time. `timeout`: seconds to wait for the driver to accept the connection (ConnectionError after)."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise ConnectionError(f"driver at {address} did not accept a connection within {timeout} s") from None
        self._requests: queue.Queue[Any] = queue.Queue(QUEUE_MESSAGES)
        self._call = pb_grpc.DriverStub(self._channel).Materialize(self._request_iterator())
        self._closed = False

    def _request_iterator(self) -> Iterator[pb.Request]:
        while True:
            request = self._requests.get()
            if request is _END:
                return
            yield request

    def send(self, msgs: list[Request]) -> None:
        if self._closed:
            raise ConnectionError(f"connection to driver at {self.address} is closed")
        for msg in msgs:
            self._put(request_to_proto(msg))

    def _put(self, item: Any) -> None:
        while True:
            if self._call.done():  # nothing would ever take it
                raise ConnectionError(f"driver stream to {self.address} ended ({self._status()})")
            try:
                self._requests.put(item, timeout=_PUT_POLL_SECONDS)
                return
            except queue.Full:
                continue

    def recv(self) -> Response:
        try:
            response = next(self._call)
        except StopIteration:
            raise ConnectionError(f"driver at {self.address} ended the stream") from None
        except grpc.RpcError as exc:
            raise ConnectionError(f"driver stream to {self.address} failed ({self._status()})") from exc
        msg = response_from_proto(response)
        if isinstance(msg, REQUEST_TYPES):  # unreachable through the proto's types; kept for parity with TCP
            raise ProtocolOrderError(f"driver sent a request ({type(msg).__name__}) instead of a response")
        return msg

    def close(self) -> None:
        """End the stream (a half-close, then cancel: the driver abandons an open transaction) and the channel."""
        if self._closed:
            return
        self._closed = True
        while True:  # drop what was not sent, so the end marker fits and grpc's writer thread finishes
            try:
                self._requests.get_nowait()
            except queue.Empty:
                break
        self._requests.put_nowait(_END)
        self._call.cancel()
        self._channel.close()

    def _status(self) -> str:
        if not self._call.done():
            return "open"
        code = self._call.code()
        return f"{code.name if code is not None else 'UNKNOWN'}: {self._call.details() or 'no details'}"
