"""JetStream's PubAck reader against nats-py's own parser, on the same bytes cut anywhere.

The reader takes the PubAck frames off the head of each read and gives everything else to
nats-py's parser. Whatever the socket's cuts, the result must be what the parser alone makes of
the whole stream: the same messages, in the same order, with nothing lost or seen twice. The
integration tests (test_fast_paths, test_producer) run it against nats-server.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.protocol.parser import Parser

from producerkit.backends.nats._natspy_compat import _PubAckReader
from producerkit.backends.nats.pubacks import puback_error as _puback_error
from producerkit.errors import DeliveryError, MessageTooLarge

pytestmark = pytest.mark.anyio

INBOX = "_INBOX.k3Jd9"
SID = 7


class RecordingClient:
    """What nats-py's parser calls on its client, recorded as events."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        self.events.append(("msg", sid, subject, reply, data, headers))

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.events.append(("info", info))

    async def _process_err(self, message: str) -> None:
        self.events.append(("err", message))


def ack(token: int, seq: int) -> bytes:
    data = b'{"stream":"s","seq":%d}' % seq
    return b"MSG %s.%d %d %d\r\n%s\r\n" % (INBOX.encode(), token, SID, len(data), data)


STATUS = b"NATS/1.0 503\r\nStatus: 503\r\n\r\n"
STREAM = b"".join(
    [
        ack(1, 10),
        ack(2, 11),
        b"PING\r\n",
        ack(3, 12),
        # A 503 has headers: nats-py's parser takes it.
        b"HMSG %s.4 %d %d %d\r\n%s\r\n" % (INBOX.encode(), SID, len(STATUS), len(STATUS), STATUS),
        ack(5, 13),
        b"MSG other.subject 3 5\r\nhello\r\n",  # another subscription
        ack(6, 14),
        b"MSG %s.7 %d reply.to 2\r\nhi\r\n" % (INBOX.encode(), SID),  # has a reply subject
        b"+OK\r\n",
        *(ack(token, 100 + token) for token in range(8, 40)),
        b"-ERR 'Stale Connection'\r\nINFO {\"max_payload\":1048576}\r\n",
        ack(40, 140),
        b"PONG\r\n",
        ack(41, 141),
    ]
)


def as_acks(events: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """PubAck frames as ("ack", token, payload) whoever read them; other events as they are."""
    prefix = INBOX.encode() + b"."

    def is_puback(event: tuple[Any, ...]) -> bool:
        if event[:2] != ("msg", SID) or not event[2].startswith(prefix):
            return False
        _, _, _, reply, _, headers = event
        return not reply and headers is None  # with a status header it is the parser's

    return [("ack", e[2][len(prefix) :], e[4]) if is_puback(e) else e for e in events]


async def read(stream: bytes, cuts: list[int]) -> tuple[list[tuple[Any, ...]], int]:
    """Feed the stream to a reader in pieces cut at ``cuts``: its events, and how many PubAcks
    it read itself."""
    client = RecordingClient()

    def settle(acks: list[tuple[bytes, bytes]]) -> None:
        client.events.extend(("ack", token, data) for token, data in acks)

    reader = _PubAckReader(Parser(client), client, SID, INBOX, settle)  # type: ignore[arg-type]

    start = 0
    for cut in [*sorted(set(cuts)), len(stream)]:
        await reader.parse(stream[start:cut])
        start = cut
    return client.events, client.stats["in_msgs"]


async def expected(stream: bytes) -> list[tuple[Any, ...]]:
    client = RecordingClient()
    await Parser(client).parse(stream)
    return as_acks(client.events)


async def test_whole_stream_in_one_read() -> None:
    events, read_itself = await read(STREAM, [])
    assert as_acks(events) == await expected(STREAM)
    assert read_itself == 2  # the two before the PING; the parser read everything after it


async def test_a_read_of_acks_only_is_read_without_the_parser() -> None:
    stream = b"".join(ack(token, token) for token in range(1, 500))
    events, read_itself = await read(stream, [len(stream) // 3, len(stream) // 2])
    assert [event[1] for event in events] == [b"%d" % token for token in range(1, 500)]
    assert read_itself == 499


async def test_every_single_cut() -> None:
    want = await expected(STREAM)
    for cut in range(len(STREAM) + 1):
        events, _ = await read(STREAM, [cut])
        assert as_acks(events) == want, f"cut at {cut}: {STREAM[cut - 10 : cut + 10]!r}"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
async def test_any_cuts(cuts: list[int]) -> None:
    events, _ = await read(STREAM, cuts)
    assert as_acks(events) == await expected(STREAM)


async def test_reset_drops_a_partial_frame() -> None:
    """nats-py resets its parser on reconnect: a frame half read from the old connection must
    not be glued to the new connection's bytes."""
    client = RecordingClient()
    settled: list[tuple[bytes, bytes]] = []
    reader = _PubAckReader(Parser(client), client, SID, INBOX, settled.extend)  # type: ignore[arg-type]

    await reader.parse(ack(1, 1)[:20])
    reader.reset()
    await reader.parse(ack(2, 2))
    assert settled == [(b"2", b'{"stream":"s","seq":2}')]
    assert client.events == []


def test_puback_errors() -> None:
    assert _puback_error("orders.3", b'{"stream":"error","seq":3}', None) is None
    refused = _puback_error("orders.3", b"", {"Status": "503"})
    assert isinstance(refused, DeliveryError) and "'orders.3'" in str(refused)
    too_large = _puback_error(
        "orders", b'{"error":{"code":400,"err_code":10054,"description":"maximum bytes"}}', None
    )
    assert isinstance(too_large, MessageTooLarge) and "10054" in str(too_large)
    assert isinstance(_puback_error("orders", b'{"error"', None), DeliveryError)
