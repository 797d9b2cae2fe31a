"""What a JetStream stream keeps, asked of the server without a producer: its duplicate window
(the ``duplicate_window`` of the ``jetstream://`` spec)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import nats
import nats.js.errors

from producerkit import _security
from producerkit._urls import parse_url
from producerkit.backends.nats.connection import security_settings

__all__ = ["DEFAULT_DUPLICATE_WINDOW", "duplicate_window"]

#: The server's default duplicate window, in seconds, for a stream a producer will create.
DEFAULT_DUPLICATE_WINDOW: Final = 120.0


async def duplicate_window(url: str, topic: str, options: Mapping[str, Any]) -> float | None:
    """The duplicate window (seconds) of the stream ``topic`` goes to (its partition 0's
    subject with ``partitions``): the server's default for one ``create_stream`` will create,
    None where there is none and none will be."""
    parsed = parse_url(url)
    given = {**parsed.options, **options}
    merged = _security.merge_credentials(parsed.username, parsed.password, given, {"username": str})
    _, security = _security.check_options("nats", merged)
    # with TLS asked for, tls:// makes nats-py upgrade whatever the server says: the
    # credentials never go out in clear text
    scheme = "tls" if _security.tls_enabled(security) else "nats"
    client = await nats.connect(
        servers=[f"{scheme}://{host}:{port}" for host, port in parsed.servers],
        connect_timeout=5,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        **security_settings(security, secure=lambda: True),
    )
    try:
        stream = client.jetstream(timeout=10)
        subject = topic if given.get("partitions") is None else f"{topic}.0"
        try:
            name = await stream.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            create = _security.parse_bool(given.get("create_stream")) is True
            return DEFAULT_DUPLICATE_WINDOW if create else None
        info = await stream.stream_info(name)
        return float(info.config.duplicate_window or 0)
    finally:
        await client.close()
