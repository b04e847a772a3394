"""A sink's endpoint: its driver's config (Flow's config_json) and its binding's resource path, from the catalog.

Secrets are resolved here, when the sink starts, and only into the config that travels to the driver (which never
echoes it): ALTER SECRET takes effect at the sink's next start. Per driver:
    POSTGRES  {"url": <connection's URL>, "document_column"?}; resource (schema, table) from TABLE, default
              ("public", <sink name>)
    REDIS     {"url": <connection's URL>, "key_prefix": KEY PREFIX, default "<sink name>:"}; resource (<sink name>,)
    PARQUET   {"path": <parent of PATH>, "buckets"?}; resource (<last part of PATH>,): the dataset is PATH itself,
              absolute, resolved (symlinks, `..`) and inside a directory of the server's --allow-directory list
              (catalog/host_access.py; without `access`, as outside a server, a relative PATH is under
              `<data>/sinks/`).
    HTTP      {"url", "headers", "batch_size"?, "max_attempts"?, "timeout_seconds"?}; resource (<sink name>,)
    EXTERNAL  CONFIG's JSON object; resource (RESOURCE, default <sink name>,)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.catalog.host_access import HostAccess
from headrace.catalog.sinks import Connection, OptionValue, SecretRef, Sink
from headrace.errors import InvalidParameterValue, UndefinedObject

SecretLookup = Callable[[str], bytes | None]
ConnectionLookup = Callable[[str, str], Connection | None]


@dataclass(frozen=True)
class Endpoint:
    driver: str
    config: dict[str, Any] = field(repr=False)  # resolved secrets: never logged
    resource_path: tuple[str, ...]


def endpoint_of(sink: Sink, find_connection: ConnectionLookup, secret: SecretLookup, data_dir: Path,
                access: HostAccess | None = None) -> Endpoint:
    options = sink.options

    def value(name: str) -> Any:
        return _resolved(options.get(name), secret)

    if sink.driver in ("postgres", "redis"):
        connection = _connection(sink, find_connection)
        url = _resolved(connection.url, secret)
        if sink.driver == "postgres":
            config: dict[str, Any] = {"url": url}
            if "document_column" in options:
                config["document_column"] = value("document_column")
            return Endpoint("postgres", config, _postgres_table(str(value("table") or sink.name)))
        return Endpoint("redis", {"url": url, "key_prefix": str(value("key_prefix") or f"{sink.name}:")},
                        (sink.name,))
    if sink.driver == "parquet":
        path = Path(str(value("path")))
        if access is not None:
            path = access.confine_directory(path)
        elif not path.is_absolute():
            path = data_dir / "sinks" / path
        path = path.resolve()
        if not path.name:
            raise InvalidParameterValue("PARQUET sink: PATH names no directory")
        config = {"path": str(path.parent)}
        if "buckets" in options:
            config["buckets"] = value("buckets")
        return Endpoint("parquet", config, (path.name,))
    if sink.driver == "http":
        config = {"url": value("url")}
        headers = options.get("headers")
        if isinstance(headers, tuple):
            config["headers"] = {name: _resolved(item, secret) for name, item in headers}
        for option, key in (("batch_size", "batch_size"), ("max_attempts", "max_attempts"),
                            ("timeout", "timeout_seconds")):
            if option in options:
                config[key] = value(option)
        return Endpoint("http", config, (sink.name,))
    if sink.driver == "external":
        config = json.loads(str(value("config"))) if "config" in options else {}
        return Endpoint("external", config, (str(value("resource") or sink.name),))
    raise InvalidParameterValue(f"unknown sink driver {sink.driver!r}")


def _connection(sink: Sink, find_connection: ConnectionLookup) -> Connection:
    name = sink.connection or ""
    schema, _, bare = name.rpartition(".")
    connection = find_connection(schema or sink.schema, bare)
    if connection is None:
        raise UndefinedObject(f'unknown connection "{name}"', sqlstate="42704")
    if connection.driver != sink.driver:
        raise InvalidParameterValue(f'connection "{name}" is a {connection.driver.upper()} connection, '
                                    f"not {sink.driver.upper()}")
    return connection


def _postgres_table(name: str) -> tuple[str, str]:
    schema, _, table = name.rpartition(".")
    if not table:
        raise InvalidParameterValue("POSTGRES sink: TABLE names no table")
    return (schema or "public", table)


def _resolved(value: OptionValue | None, secret: SecretLookup) -> Any:
    if isinstance(value, SecretRef):
        resolved = secret(value.name)
        if resolved is None:
            raise UndefinedObject(f'unknown secret "{value.name}"', sqlstate="42704")
        try:
            return resolved.decode()
        except UnicodeDecodeError:
            raise InvalidParameterValue(f'secret "{value.name}" is not UTF-8 text') from None
    return value
