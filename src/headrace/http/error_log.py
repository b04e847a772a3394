"""What aiohttp logs about requests it cannot parse: one line, never the request's bytes.

aiohttp logs a malformed request head with a traceback whose exception message quotes the raw
client bytes (a fuzz run wrote 1.7 MB of log that way, and a client controls what lands in it).
`RequestErrorLogger` is given to aiohttp's request handlers as their logger: a parse error
(HttpProcessingError) becomes one line with the peer, the status and the error's kind; anything
else (a bug of ours) keeps its traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger("headrace.http")


def _exception_of(exc_info: object) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and isinstance(exc_info[1], BaseException):
        return exc_info[1]
    return None


class RequestErrorLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    def __init__(self, logger: logging.Logger = log) -> None:
        super().__init__(logger, {})

    def log(self, level: int, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        error = sys.exc_info()[1] if exc_info is True else _exception_of(exc_info)
        if isinstance(error, HttpProcessingError):
            peer = args[0] if args and "%s" in str(msg) else "a client"
            # A client's mistake, not a server error: at most a warning.
            self.logger.log(min(level, logging.WARNING),
                            "malformed HTTP request from %s refused with %s (%s)", peer, error.code,
                            type(error).__name__)
            return
        super().log(level, msg, *args, exc_info=exc_info, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        return msg, kwargs
