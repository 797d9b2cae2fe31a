"""Reading a JetStream PubAck: the stream sequence it reports, whether it was a duplicate, or the
refusal it carries; and the replies to a fast batch's messages (ADR-50): a flow-control ack, a gap
or an error notice, and the PubAck that ends the batch."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

from producerkit.backends.nats.errors import EXPECTATION_CODES, jetstream_refusal
from producerkit.errors import (
    AtomicBatchError,
    AuthorizationError,
    DeliveryError,
    MessageTooLarge,
    ProducerkitError,
)

_PUBACK_SEQUENCE = re.compile(rb'"seq":\s*(\d+)')
_FLOW_ACK = re.compile(rb'^\{"type":\s*"ack",\s*"seq":\s*(\d+),\s*"msgs":\s*(\d+)\s*\}$')


def is_plain(data: bytes) -> bool:
    """Whether a PubAck is certainly a plain one (a sequence, no refusal, no duplicate): the
    test that spares the common PubAck any further reading."""
    return bool(data) and b'"error"' not in data and b'"duplicate"' not in data


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


def puback_duplicate(data: bytes) -> bool:
    """Whether the PubAck says ``"duplicate": true``: the server already stored a message with
    this ``msg_id`` (at the sequence it reports) and did not store this one."""
    if b'"duplicate"' not in data:
        return False
    try:
        return json.loads(data).get("duplicate") is True
    except (ValueError, AttributeError):
        return False


#: What to do about an atomic batch's refusal, by the server's error code (docs/jetstream.md's
#: table says the same).
#: The stream does not allow atomic batches.
ATOMIC_NOT_ALLOWED: Final = 10174

ATOMIC_BATCH_HINTS: Final[Mapping[int, str]] = {
    10174: (
        "the stream does not allow atomic batches: create it with allow_atomic=True "
        "(Producer(..., create_stream=True, allow_atomic=True) does), or set allow_atomic on "
        "the existing stream's configuration"
    ),
}


def puback_error(
    subject: str, data: bytes, headers: Mapping[str, str] | None
) -> ProducerkitError | None:
    """The failure a PubAck reports (an empty one, with its status, or one with an error), or
    None for a PubAck that only looked like one (a stream named "error"). A refusal's JetStream
    error code is the error's ``code`` (see ``errors.jetstream_refusal``)."""
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
        code, description = error.get("err_code"), error.get("description")
    except (ValueError, TypeError, AttributeError):
        return DeliveryError(f"JetStream rejected the message: {data[:200]!r}")
    code = code if type(code) is int else None
    text = f"JetStream rejected the message: {description} (error code {code})"
    if code in EXPECTATION_CODES:  # before the words: the description quotes a msg id
        return jetstream_refusal(text, code)
    if "permission" in str(description).lower():
        return AuthorizationError(text)
    if "too large" in str(description).lower() or "maximum" in str(description).lower():
        return MessageTooLarge(text)
    return jetstream_refusal(text, code)


def flow_ack(data: bytes) -> tuple[int, int] | None:
    """A fast batch's flow-control ack, ``{"type":"ack","seq":N,"msgs":M}``, as ``(N, M)``:
    the batch's messages up to N are stored, and the server acks every M messages from now on.
    None for any other reply."""
    if not data.startswith(b'{"type":'):
        return None
    match = _FLOW_ACK.match(data)
    if match is not None:
        return int(match[1]), int(match[2])
    try:
        reply = json.loads(data)
        if reply.get("type") == "ack":
            return int(reply["seq"]), int(reply["msgs"])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def flow_notice(data: bytes) -> tuple[str, int] | None:
    """A fast batch's gap or error notice (``{"type":"gap",...}``, ``{"type":"err",...}``) as
    ``(type, seq)``: the batch message it is about. The PubAck that ends the batch follows it."""
    if not data.startswith(b'{"type":'):
        return None
    try:
        reply = json.loads(data)
        kind, sequence = reply["type"], reply["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    if kind not in ("gap", "err") or type(sequence) is not int:
        return None
    return kind, sequence


def batch_puback(data: bytes) -> tuple[int, int] | None:
    """The PubAck ending a fast batch, ``{"stream":"s","seq":S,"batch":"id","count":N}``, as
    ``(S, N)``: the batch's first N messages are stored, the N-th at stream sequence S. None for
    anything else (a refusal, a notice)."""
    if b'"count"' not in data or b'"error"' in data:
        return None
    try:
        reply = json.loads(data)
        sequence, count = reply["seq"], reply["count"]
    except (ValueError, KeyError, TypeError):
        return None
    if type(sequence) is not int or type(count) is not int:
        return None
    return sequence, count


def atomic_refusal(data: bytes, headers: Mapping[str, str] | None, batch: str) -> AtomicBatchError:
    """An atomic batch's refusal (the answer to its first message or its commit), with the
    server's code and, where there is one, what to do about it."""
    error = puback_error(f"atomic batch {batch}", data, headers)
    if error is None:
        return AtomicBatchError(
            f"atomic batch {batch}: an unexpected answer {data[:200]!r}", kind="refused"
        )
    code = getattr(error, "code", None)
    kind = "unsupported" if code == ATOMIC_NOT_ALLOWED else "refused"
    hint = ATOMIC_BATCH_HINTS.get(code) if code is not None else None
    text = f"atomic batch {batch}: {error}" + (f"; {hint}" if hint else "")
    return AtomicBatchError(text, code=code, kind=kind)


def atomic_committed(
    data: bytes, headers: Mapping[str, str] | None, batch: str, count: int
) -> int | AtomicBatchError:
    """The stream sequence of the last message an atomic batch's commit stored
    (``{"seq": S, "batch": id, "count": N}``), or why it was not."""
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "error" in answer:
        return atomic_refusal(data, headers, batch)
    if answer.get("batch") != batch or answer.get("count") != count:
        return AtomicBatchError(
            f"atomic batch {batch}: the commit answered for batch {answer.get('batch')!r} with "
            f"{answer.get('count')!r} message(s), not {count}",
            kind="refused",
        )
    sequence = answer.get("seq")
    if type(sequence) is not int:
        return AtomicBatchError(
            f"atomic batch {batch}: the commit gave no sequence: {answer!r}", kind="refused"
        )
    return sequence
