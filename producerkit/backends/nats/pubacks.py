"""Reading a JetStream PubAck: the stream sequence it reports, or the refusal it carries."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from producerkit.errors import AuthorizationError, DeliveryError, MessageTooLarge, ProducerError

_PUBACK_SEQUENCE = re.compile(rb'"seq":\s*(\d+)')


def puback_sequence(data: bytes) -> int | None:
    """The stream sequence of a PubAck (``{"stream":"s","seq":12}``), by one regex search rather
    than a JSON parse per message; None if it has none."""
    match = _PUBACK_SEQUENCE.search(data)
    if match is not None:
        return int(match[1])
    try:
        return int(json.loads(data)["seq"])
    except (ValueError, KeyError, TypeError):
        return None


def puback_error(
    subject: str, data: bytes, headers: Mapping[str, str] | None
) -> ProducerError | None:
    """The failure a PubAck reports (an empty one, with its status, or one with an error), or
    None for a PubAck that only looked like one (a stream named "error")."""
    if not data:
        status = (headers or {}).get("Status", "")
        if status == "503":
            return DeliveryError(
                f"no JetStream stream stores subject {subject!r} (503 no responders); create "
                "one or pass create_stream=True"
            )
        return DeliveryError(f"empty PubAck (status {status or 'none'})")
    try:
        error = json.loads(data).get("error")
        if error is None:
            return None
        code, description = error.get("err_code") or error.get("code"), error.get("description")
    except (ValueError, TypeError, AttributeError):
        return DeliveryError(f"JetStream rejected the message: {data[:200]!r}")
    text = f"JetStream rejected the message: {description} (code {code})"
    if "permission" in str(description).lower():
        return AuthorizationError(text)
    if "too large" in str(description).lower() or "maximum" in str(description).lower():
        return MessageTooLarge(text)
    return DeliveryError(text)
