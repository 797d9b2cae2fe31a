"""Kafka's compression codecs, through cramjam (gzip: zlib; zstd: zstandard where installed), at
librdkafka's default levels.

A compressed record batch (v2) is its records section compressed whole, with the codec in the
batch's attributes. ``compressor(codec, level)`` returns ``(section) -> compressed``:

=========  =========  =====================================================================
codec      attribute  what is written
=========  =========  =====================================================================
gzip       1          a gzip stream (the standard library's zlib); level 1-9, default 6
                      (zlib's, as librdkafka's)
snappy     2          raw snappy (no xerial framing), as librdkafka writes it; no levels
lz4        3          an LZ4 frame of independent 64 KiB blocks without checksums, as the
                      Java client and librdkafka write it; level 0 (fast, the default) or
                      1-12 (high compression)
zstd       4          a zstd frame; level 1-22, default 3 (zstd's and librdkafka's),
                      with the parameters of zstd's streaming compressor, as the Java
                      client writes it
=========  =========  =====================================================================

The LZ4 frame is written here, block by block, because a frame of linked blocks (what cramjam's
frame compressor writes) cannot be read by the Java LZ4 reader that brokers and Java consumers
use.

zstd goes through the ``zstandard`` library where it is installed (the ``kafka`` extra brings
it), else through cramjam's streaming ``Compressor``. Either way zstd is given the level's
parameters for a source of unknown size (as the Java client's ``ZstdOutputStream`` is), not those
it would pick for the section's size: for a section of 128 to 256 KiB (a full batch at
``max_batch_size=256 KiB``) those ran at 60% of the speed on hex text and wrote 10% more bytes.
``zstandard`` still states the window the section needs (smaller frames declare a smaller
window), and it releases the GIL while it compresses, which cramjam's streaming compressor does
not. The frame has no content size field, like the Java client's; librdkafka and aiokafka read
it back.

Each call of :func:`compressor` returns a function with its own state: one thread at a time may
call it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final

from producerkit.errors import ConfigurationError

__all__ = [
    "CODECS",
    "DEFAULT_LEVELS",
    "check_level",
    "compresses_off_the_loop",
    "compressor",
    "zstd_compressor",
]

#: compression_type -> the record batch's codec attribute.
CODECS: Final = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
#: The level each codec is given when ``compression_level`` is not (librdkafka's defaults).
DEFAULT_LEVELS: Final[dict[str, int | None]] = {"gzip": 6, "snappy": None, "lz4": 0, "zstd": 3}
_LEVELS: Final = {"gzip": range(1, 10), "lz4": range(13), "zstd": range(1, 23)}

_LZ4_MAGIC: Final = struct.pack("<I", 0x184D2204)
#: FLG: version 01, independent blocks, no block checksum, no content size or checksum.
_LZ4_FLG: Final = 0x60
#: BD: blocks of at most 64 KiB.
_LZ4_BD: Final = 0x40
_LZ4_BLOCK: Final = 64 * 1024
_LZ4_UNCOMPRESSED: Final = 0x80000000
_LZ4_END: Final = b"\x00\x00\x00\x00"
_INT32: Final = struct.Struct("<I")


def check_level(codec: str | None, level: object) -> int | None:
    """``compression_level`` for ``codec``, checked: ConfigurationError naming the range."""
    if level is None:
        return DEFAULT_LEVELS.get(codec or "")
    if codec is None:
        raise ConfigurationError("compression_level needs a compression_type")
    allowed = _LEVELS.get(codec)
    if allowed is None:
        raise ConfigurationError(f"compression_type={codec!r} has no levels")
    if type(level) is not int or level not in allowed:
        raise ConfigurationError(
            f"compression_level for {codec} must be an int from {allowed.start} to "
            f"{allowed.stop - 1}, got {level!r}"
        )
    return level


def compressor(codec: str, level: int | None) -> Callable[[Any], Any]:
    """``(records section) -> compressed`` for ``codec`` at ``level`` (any buffer in, a buffer
    out)."""
    if codec == "gzip":
        import gzip

        return lambda data: gzip.compress(data, compresslevel=level or 6, mtime=0)
    import cramjam

    if codec == "snappy":
        return cramjam.snappy.compress_raw
    if codec == "zstd":
        return zstd_compressor(level or 3)
    if codec == "lz4":
        return lambda data: _lz4_frame(cramjam.lz4.compress_block, data, level or 0)
    raise ConfigurationError(f"unknown compression_type {codec!r}")


def zstd_compressor(level: int, *, library: str = "zstandard") -> Callable[[Any], Any]:
    """zstd at ``level`` with the parameters for a source of unknown size, through
    ``library`` ("zstandard", or "cramjam", which is also used when zstandard is missing)."""
    zstandard = _zstandard() if library == "zstandard" else None
    if zstandard is not None:
        parameters = zstandard.ZstdCompressionParameters.from_level(
            level, source_size=0, write_content_size=False
        )
        made: Callable[[Any], Any] = zstandard.ZstdCompressor(
            compression_params=parameters
        ).compress
        return made
    import cramjam

    def compress(data: Any) -> Any:
        stream = cramjam.zstd.Compressor(level=level)
        stream.compress(data)
        return stream.finish()

    return compress


def compresses_off_the_loop(codec: str) -> bool:
    """Whether a large section of ``codec`` is compressed on a thread rather than on the event
    loop: for the codecs whose compressor is one call that releases the GIL and costs a few
    microseconds a message (gzip; zstd through zstandard). snappy and lz4 cost less than the
    hand-over to a thread and back (measured in docs/performance.md); lz4's frame is also
    written block by block in Python, which would take the GIL back four times a batch."""
    if codec == "gzip":
        return True
    if codec == "zstd":
        return _zstandard() is not None
    return False


def _zstandard() -> Any:
    """The zstandard module, or None where it cannot be imported: the one answer both
    :func:`zstd_compressor` and :func:`compresses_off_the_loop` go by."""
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def _lz4_frame(compress_block: Callable[..., Any], data: Any, level: int) -> bytes:
    import xxhash

    descriptor = bytes((_LZ4_FLG, _LZ4_BD))
    checksum = (xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF
    parts = [_LZ4_MAGIC, descriptor, bytes((checksum,))]
    view = memoryview(data)
    options: dict[str, Any] = {"store_size": False}
    if level > 0:
        options.update(mode="high_compression", compression=level)
    for start in range(0, len(view), _LZ4_BLOCK):
        block = view[start : start + _LZ4_BLOCK]
        compressed = compress_block(block, **options)
        if len(compressed) < len(block):
            parts.append(_INT32.pack(len(compressed)))
            parts.append(bytes(compressed))
        else:  # incompressible: stored as it is
            parts.append(_INT32.pack(len(block) | _LZ4_UNCOMPRESSED))
            parts.append(bytes(block))
    parts.append(_LZ4_END)
    return b"".join(parts)
