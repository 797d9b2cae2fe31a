"""What one Kafka node's metadata says about a topic, asked of that node alone: a Metadata
request (API 3, v4: the oldest Apache Kafka 4 serves) on a socket of its own. A client such as
librdkafka sends its metadata requests to whichever node it is connected to, so it cannot tell
whether a given node has applied a change yet."""

from __future__ import annotations

import socket
import struct
from typing import Final

from ._kafka_rewrite import _Reader

_METADATA: Final = 3
_VERSION: Final = 4
_CLIENT_ID: Final = b"producerkit-testing"


def node_leaders(host: str, port: int, topic: str, timeout: float) -> dict[int, int] | None:
    """Each partition of ``topic`` to its leader's node id (-1: none) in the metadata of the
    node at ``host:port``; None if that node does not know the topic (yet). An ``OSError``
    if the node cannot be reached within ``timeout`` seconds."""
    name = topic.encode("utf-8")
    body = (
        struct.pack(">hhih", _METADATA, _VERSION, 1, len(_CLIENT_ID))
        + _CLIENT_ID
        + struct.pack(">ih", 1, len(name))
        + name
        + b"\x00"  # allow_auto_topic_creation: false
    )
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _receive(conn, 4))
        reader = _Reader(_receive(conn, size))
    reader.take(8)  # correlation_id, throttle_time_ms
    for _ in range(reader.int32()):  # brokers
        reader.take(4)
        reader.string(False)
        reader.take(4)
        reader.string(False)
    reader.string(False)  # cluster_id
    reader.take(4)  # controller_id
    for _ in range(reader.int32()):  # topics
        error = reader.int16()
        found = reader.string(False)
        reader.take(1)  # is_internal
        leaders = {}
        for _ in range(reader.int32()):
            reader.take(2)  # the partition's error code: its leader says as much
            partition, leader = reader.int32(), reader.int32()
            reader.take(4 * reader.int32())  # replicas
            reader.take(4 * reader.int32())  # in-sync replicas
            leaders[partition] = leader
        if found == topic:
            return dict(sorted(leaders.items())) if error == 0 and leaders else None
    return None


def _receive(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the node closed the connection")
        data += chunk
    return bytes(data)
