"""The Kafka protocol as far as the fault proxy reads it: it splits each byte stream into
size-prefixed frames, remembers each request's API key and version by correlation id, and
rewrites the broker host/port in Metadata (API 3, v0-v12, flexible versions included) and
FindCoordinator (API 10, v0-v4) responses to point at the proxy's listeners."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

_METADATA: Final = 3
_FIND_COORDINATOR: Final = 10


class _KafkaFramer:
    """Splits a Kafka byte stream into size-prefixed frames and passes each through ``handle``."""

    __slots__ = ("buffer", "handle")

    def __init__(self, handle: Callable[[bytes], bytes]) -> None:
        self.buffer = bytearray()
        self.handle = handle

    def __call__(self, data: bytes) -> list[bytes]:
        buffer = self.buffer
        buffer += data
        frames: list[bytes] = []
        start = 0
        while len(buffer) - start >= 4:
            (size,) = struct.unpack_from(">i", buffer, start)
            end = start + 4 + size
            if len(buffer) < end:
                break
            frames.append(self.handle(bytes(buffer[start:end])))
            start = end
        del buffer[:start]
        # Forward complete frames as one chunk: same bytes, one timer entry.
        return [b"".join(frames)] if frames else []


def _note_request(frame: bytes, versions: dict[int, tuple[int, int]]) -> bytes:
    if len(frame) >= 12:
        api_key, api_version, correlation_id = struct.unpack_from(">hhi", frame, 4)
        if api_key in (_METADATA, _FIND_COORDINATOR):
            versions[correlation_id] = (api_key, api_version)
    return frame


def _rewrite_response(
    frame: bytes,
    versions: dict[int, tuple[int, int]],
    advertised: Callable[[str, int], tuple[str, int]],
) -> bytes:
    if len(frame) < 8 or not versions:
        return frame
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    request = versions.pop(correlation_id, None)
    if request is None:
        return frame
    api_key, version = request
    try:
        if api_key == _METADATA:
            body = _rewrite_metadata(frame[8:], version, advertised)
        else:
            body = _rewrite_find_coordinator(frame[8:], version, advertised)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError):
        return frame  # a version this parser does not know: pass it through unchanged
    payload = frame[4:8] + body
    return struct.pack(">i", len(payload)) + payload


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def int16(self) -> int:
        value: int = struct.unpack(">h", self.take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self.take(4))[0]
        return value

    def uvarint(self) -> int:
        result = shift = 0
        while True:
            byte = self.take(1)[0]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def string(self, compact: bool) -> str | None:
        length = self.uvarint() - 1 if compact else self.int16()
        if length < 0:
            return None
        return self.take(length).decode("utf-8")

    def tagged_fields(self) -> bytes:
        """The raw bytes of a tagged-field section, to copy through unchanged."""
        start = self.pos
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())
        return self.data[start : self.pos]

    def rest(self) -> bytes:
        return self.data[self.pos :]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _string(text: str | None, compact: bool) -> bytes:
    if text is None:
        return _uvarint(0) if compact else struct.pack(">h", -1)
    raw = text.encode("utf-8")
    return (_uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def _rewrite_metadata(
    body: bytes, version: int, advertised: Callable[[str, int], tuple[str, int]]
) -> bytes:
    flexible = version >= 9
    reader = _Reader(body)
    out = bytearray()
    if flexible:
        out += reader.tagged_fields()  # response header v1
    if version >= 3:
        out += reader.take(4)  # throttle_time_ms
    count = reader.uvarint() - 1 if flexible else reader.int32()
    out += _uvarint(count + 1) if flexible else struct.pack(">i", count)
    for _ in range(max(count, 0)):
        node_id = reader.take(4)
        host = reader.string(flexible)
        port = reader.int32()
        new_host, new_port = advertised(host or "", port)
        out += node_id + _string(new_host, flexible) + struct.pack(">i", new_port)
        if version >= 1:
            out += _string(reader.string(flexible), flexible)  # rack
        if flexible:
            out += reader.tagged_fields()
    return bytes(out) + reader.rest()


def _rewrite_find_coordinator(
    body: bytes, version: int, advertised: Callable[[str, int], tuple[str, int]]
) -> bytes:
    flexible = version >= 3
    reader = _Reader(body)
    out = bytearray()
    if flexible:
        out += reader.tagged_fields()

    def node() -> None:
        out.extend(reader.take(4))  # node_id
        host = reader.string(flexible)
        port = reader.int32()
        new_host, new_port = advertised(host or "", port)
        out.extend(_string(new_host, flexible) + struct.pack(">i", new_port))

    if version >= 1:
        out += reader.take(4)  # throttle_time_ms
    if version >= 4:
        count = reader.uvarint() - 1
        out += _uvarint(count + 1)
        for _ in range(max(count, 0)):
            out += _string(reader.string(True), True)  # key
            node()
            out += reader.take(2)  # error_code
            out += _string(reader.string(True), True)  # error_message
            out += reader.tagged_fields()
        return bytes(out) + reader.rest()
    out += reader.take(2)  # error_code
    if version >= 1:
        out += _string(reader.string(flexible), flexible)  # error_message
    node()
    return bytes(out) + reader.rest()
