"""Opening and closing a producer's connections (the seam's side of its lifecycle)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from producerkit._record import Record
from producerkit._urls import ParsedURL
from producerkit.backends.base import BackendSpec, Connection, Reports
from producerkit.errors import BrokerUnavailable, ProducerkitError

logger = logging.getLogger("producerkit.producer")


async def open_connections(
    spec: BackendSpec,
    url: ParsedURL,
    options: Mapping[str, Any],
    reports: Reports,
    *,
    timeout: float,
    count: int,
) -> list[Connection]:
    """``count`` connections, each connected within ``timeout``; BrokerUnavailable (or the
    backend's own ProducerkitError) if any cannot be, with every one closed again."""
    connections = [
        spec.connection(url, options, reports, timeout=timeout, index=index)
        for index in range(count)
    ]
    try:
        # Awaited here, not through wait_for: a cancelled gather's CancelledError is then
        # retrieved, not logged as "exception was never retrieved" when it is collected.
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(connection.connect() for connection in connections))
    except BaseException as exc:
        await close_connections(connections)
        where = describe_servers(url)
        if isinstance(exc, TimeoutError):
            awaiting = sorted({c.awaiting for c in connections if c.awaiting})
            still = f", still awaiting {' and '.join(awaiting)}" if awaiting else ""
            raise BrokerUnavailable(
                f"could not connect to {where} within {timeout}s{still}"
            ) from exc
        if isinstance(exc, ProducerkitError) or not isinstance(exc, Exception):
            raise
        raise BrokerUnavailable(f"could not connect to {where}: {exc}") from exc
    return connections


async def close_connections(connections: list[Connection]) -> None:
    """Close every connection, each within its timeout; what closing raises is logged."""
    await asyncio.gather(*(_close_quietly(connection) for connection in connections))


async def _close_quietly(connection: Connection) -> None:
    try:
        await asyncio.wait_for(connection.close(), connection.timeout)
    except Exception:
        logger.debug("error closing %r", connection, exc_info=True)


def unwritten(connections: list[Connection], records: list[Record]) -> set[int]:
    """The seqs of ``records`` their connections still hold unwritten."""
    found: set[int] = set()
    for index, connection in enumerate(connections):
        mine = [record for record in records if record.connection == index]
        if mine:
            found |= connection.unwritten(mine)
    return found


def describe_servers(url: ParsedURL) -> str:
    """``scheme://host:port,...`` (or ``scheme://name``): where a producer connects."""
    servers = ",".join(url.server_strings())
    return f"{url.scheme}://{servers or url.name}"
