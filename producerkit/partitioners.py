"""Choosing a partition for a message.

Keyed messages go through a *key partitioner*: a pure function ``(key, num_partitions) -> int``
that returns a partition in ``range(num_partitions)``. The same key and partition count always
give the same partition, in every process and on every run (none of them uses Python's salted
``hash()``).

================  ==========================================================================
name              behaviour
================  ==========================================================================
``"xxhash"``      **default.** ``xxh3_64(key) % n``.
``"murmur2"``     the Java client's (``toPositive(murmur2(key)) % n``); also librdkafka's
                  ``murmur2`` / ``murmur2_random`` and kafka-python's default.
``"memphis"``     the Memphis SDKs': ``murmur3_32(key, seed=31) % n``.
``"crc32"``       librdkafka's ``consistent``, and its default ``consistent_random`` for
                  keyed messages (so confluent-kafka-python's): ``crc32(key) % n``.
================  ==========================================================================

Why xxhash is the default: xxh3 runs in C, and its 64-bit output is uniform enough that ``% n``
shows no measurable skew. murmur2 runs in pure Python, many times the cost per key, growing with
the key's length (docs/partitioning.md has the measurements).

But **xxhash places keys differently from every other client**. When other producers write the
same keyed topic (a Java service, Kafka Streams, ksqlDB, a Connect source), pick ``"murmur2"``
so that a key lands in the same partition whoever wrote it; pick ``"crc32"`` to match
librdkafka-based clients left on their default, ``"memphis"`` to match the Memphis SDKs.

Keyless messages never reach these functions: the producer gives them a partition through a
:class:`KeylessPartitioner` (KIP-480 sticky, or round-robin). This is why
librdkafka's own treatment of a NULL key (``consistent`` hashes it as empty, sending every
keyless message to partition 0) has no counterpart here.

Partition counts are the caller's business: every function assumes ``num_partitions >= 1`` and
checks nothing, because each is called once per message.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

from mmh3 import hash as _mmh3_32
from xxhash import xxh3_64_intdigest as _xxh3_64

__all__ = [
    "KEYLESS_PARTITIONERS",
    "PARTITIONERS",
    "KeyPartitioner",
    "KeylessPartitioner",
    "RoundRobinPartitioner",
    "StickyPartitioner",
    "crc32",
    "memphis",
    "modulo_hash",
    "murmur2",
    "murmur2_hash",
    "resolve",
    "resolve_keyless",
    "xxhash",
]

KeyPartitioner = Callable[[bytes, int], int]
"""The type of a key partitioner: ``(key, num_partitions) -> partition``."""

# The Memphis SDKs hash partition keys with this seed (``Memphis.SEED`` in memphis.py).
_MEMPHIS_SEED = 31


def xxhash(key: bytes, num_partitions: int) -> int:
    """Return ``xxh3_64(key) % num_partitions``: the default, fast and uniform.

    Not compatible with any other client; see the module documentation.
    """
    return _xxh3_64(key) % num_partitions


# One precompiled unpacker per block count spares a format string and a struct-cache lookup
# per call; keys longer than 256 bytes, rare as keys go, take the generic path.
_PRECOMPILED_BLOCKS = 64
_UNPACK_BLOCKS = tuple(
    struct.Struct(f"<{count}I").unpack_from for count in range(_PRECOMPILED_BLOCKS + 1)
)
_unpack_from = struct.unpack_from


def _murmur2_u32(data: bytes) -> int:
    # Kafka's Utils.murmur2 computed on unsigned 32-bit values: Java's int arithmetic wraps
    # modulo 2**32, so masking after every multiplication gives the same bits, and Java's >>>
    # on an int is >> on its unsigned value. The literals are murmur2's m (0x5BD1E995) and
    # Kafka's seed (0x9747B28C); inlined because in CPython a constant is cheaper than a name.
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    blocks = length >> 2
    if blocks:
        if blocks <= _PRECOMPILED_BLOCKS:
            words = _UNPACK_BLOCKS[blocks](data)
        else:
            words = _unpack_from(f"<{blocks}I", data)
        for word in words:
            k = (word * 0x5BD1E995) & 0xFFFFFFFF
            h = ((h * 0x5BD1E995) ^ (((k ^ (k >> 24)) * 0x5BD1E995) & 0xFFFFFFFF)) & 0xFFFFFFFF
    tail = length & 3
    if tail:
        # Java's switch falls through 3 -> 2 -> 1, and only case 1 multiplies.
        i = length - tail
        if tail == 3:
            h ^= data[i + 2] << 16
        if tail >= 2:
            h ^= data[i + 1] << 8
        h = ((h ^ data[i]) * 0x5BD1E995) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0x5BD1E995) & 0xFFFFFFFF
    return h ^ (h >> 15)


def murmur2_hash(key: bytes) -> int:
    """Return Kafka's ``Utils.murmur2(key)``: the signed 32-bit Java ``int``.

    Pure Python, bit-for-bit the Java implementation (seed ``0x9747b28c``).
    """
    h = _murmur2_u32(key)
    return h - 0x100000000 if h & 0x80000000 else h


def murmur2(key: bytes, num_partitions: int) -> int:
    """Return the partition the Java client gives ``key``.

    That is Kafka's ``BuiltInPartitioner.partitionForKey`` (formerly ``DefaultPartitioner``):
    ``toPositive(murmur2(key)) % num_partitions``, where ``toPositive`` clears the sign bit;
    it is not ``abs()``, so hashes ``h`` and ``h ^ 0x80000000`` share a partition.
    """
    return (_murmur2_u32(key) & 0x7FFFFFFF) % num_partitions


def memphis(key: bytes, num_partitions: int) -> int:
    """Return the partition *index* the Memphis SDKs give ``key``.

    memphis.py computes ``mmh3.hash(key, 31, signed=False) % len(partitions_list)``; it hashes
    a ``str`` key as UTF-8, so pass ``key.encode()`` to match a ``str`` partition key. The
    result indexes the station's partition list: with the usual list ``[1, ..., n]`` the
    Memphis partition *number* is the result plus one.
    """
    # Positional arguments: mmh3 parses keywords noticeably slower (the third is ``signed``).
    return _mmh3_32(key, _MEMPHIS_SEED, False) % num_partitions


def crc32(key: bytes, num_partitions: int) -> int:
    """Return librdkafka's ``consistent`` partition: ``crc32(key) % num_partitions``.

    ``rd_crc32`` is the standard (zlib, IEEE 802.3) CRC-32, taken as unsigned.
    """
    return zlib.crc32(key) % num_partitions


PARTITIONERS: Mapping[str, KeyPartitioner] = MappingProxyType(
    {"xxhash": xxhash, "murmur2": murmur2, "memphis": memphis, "crc32": crc32}
)
"""The key partitioners by name: what ``resolve()`` accepts as a string."""


# Partitioners that are exactly ``hash(key) % num_partitions`` for a C hash function.
_MODULO_HASHES: Mapping[KeyPartitioner, Callable[[bytes], int]] = MappingProxyType(
    {xxhash: _xxh3_64, crc32: zlib.crc32}
)


def modulo_hash(partitioner: KeyPartitioner) -> Callable[[bytes], int] | None:
    """The C hash ``h`` if ``partitioner(key, n)`` is exactly ``h(key) % n``, else None.

    The producer then calls ``h`` itself, which saves a Python call per keyed message. Every
    such ``h`` returns an int in ``range(2**64)``: the C admission relies on it.
    """
    return _MODULO_HASHES.get(partitioner)


def resolve(partitioner: str | KeyPartitioner) -> KeyPartitioner:
    """Return the key partitioner named ``partitioner``, or ``partitioner`` itself if callable.

    Raises :class:`~producerkit.errors.ConfigurationError` (a ``ValueError``) for any other
    value, naming it and the valid names.
    """
    if isinstance(partitioner, str):
        found = PARTITIONERS.get(partitioner)
        if found is not None:
            return found
    elif callable(partitioner):
        return partitioner
    # Imported here so that importing this module stays free of the rest of the package.
    from producerkit.errors import ConfigurationError

    message = (
        f"unknown partitioner {partitioner!r}: expected one of "
        f"{', '.join(map(repr, PARTITIONERS))}, or a callable (key: bytes, num_partitions: int)"
    )
    raise ConfigurationError(message)


class KeylessPartitioner(Protocol):
    """Chooses partitions for messages without a key (and without an explicit partition).

    The producer calls :meth:`partition` exactly once per such message, and
    :meth:`on_new_batch` when it closes a batch of them and starts the next. Implementations
    are not thread-safe: they are meant for one event loop.
    """

    def partition(self, topic: str, num_partitions: int) -> int:
        """Return the partition, in ``range(num_partitions)``, for the next keyless message."""
        ...

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """Note that the batch for partition ``previous`` of ``topic`` is complete."""
        ...


class StickyPartitioner:
    """KIP-480 sticky partitioning: one partition per topic until its batch is complete.

    Keyless messages fill one batch at a time instead of one message per partition, which is
    what makes batching (and compression) pay off at low rates. When a batch completes, the
    topic moves to a random *other* partition, so over time the load evens out.
    """

    __slots__ = ("_current", "_randrange")

    def __init__(self, rng: random.Random | None = None) -> None:
        """Create the partitioner; ``rng`` makes the random choices reproducible (tests)."""
        self._current: dict[str, int] = {}
        self._randrange = (rng if rng is not None else random.Random()).randrange

    def partition(self, topic: str, num_partitions: int) -> int:
        """Return the topic's current sticky partition, choosing one at random if it has none."""
        current = self._current.get(topic)
        # A count that shrank under the current choice (a topic re-created smaller) re-draws.
        if current is None or current >= num_partitions:
            current = self._current[topic] = self._randrange(num_partitions)
        return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """Move ``topic`` to a random partition other than ``previous`` (when there is one).

        As in the Java client, nothing happens if the topic has already moved away from
        ``previous``: a late notice about an old batch must not move the new one.
        """
        current = self._current.get(topic)
        if current is not None and current != previous:
            return
        if num_partitions > 1 and 0 <= previous < num_partitions:
            # Uniform over the other n - 1 partitions in one draw, where Java loops until the
            # draw differs.
            chosen = self._randrange(num_partitions - 1)
            if chosen >= previous:
                chosen += 1
        else:
            chosen = self._randrange(num_partitions)
        self._current[topic] = chosen


class RoundRobinPartitioner:
    """Each keyless message of a topic goes to the next partition in turn, from partition 0.

    Spreads messages perfectly evenly but makes batches small: prefer
    :class:`StickyPartitioner` unless consumers need the even spread message by message.
    """

    __slots__ = ("_counters",)

    def __init__(self) -> None:
        """Create the partitioner, with every topic starting at partition 0."""
        self._counters: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        """Return the next partition of ``topic`` in turn."""
        count = self._counters.get(topic, 0)
        self._counters[topic] = count + 1
        return count % num_partitions

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> None:
        """Do nothing: the turn advances per message, never per batch.

        (The Java client calls ``partition()`` a second time for the record that opens a
        new batch, so its RoundRobinPartitioner skips partitions, KAFKA-9965; calling
        :meth:`partition` once per message and ignoring batches avoids that.)
        """


KEYLESS_PARTITIONERS: Mapping[str, Callable[[], KeylessPartitioner]] = MappingProxyType(
    {"sticky": StickyPartitioner, "round_robin": RoundRobinPartitioner}
)
"""The keyless partitioners by name, as factories: what ``resolve_keyless()`` accepts."""


def resolve_keyless(partitioner: str | KeylessPartitioner) -> KeylessPartitioner:
    """Return a new keyless partitioner named ``partitioner``, or ``partitioner`` itself.

    Raises :class:`~producerkit.errors.ConfigurationError` (a ``ValueError``) for an unknown
    name or an object without ``partition`` and ``on_new_batch``.
    """
    if isinstance(partitioner, str):
        factory = KEYLESS_PARTITIONERS.get(partitioner)
        if factory is not None:
            return factory()
    elif callable(getattr(partitioner, "partition", None)) and callable(
        getattr(partitioner, "on_new_batch", None)
    ):
        return partitioner
    from producerkit.errors import ConfigurationError

    message = (
        f"unknown keyless partitioner {partitioner!r}: expected one of "
        f"{', '.join(map(repr, KEYLESS_PARTITIONERS))}, or an object with "
        "partition(topic, num_partitions) and on_new_batch(topic, num_partitions, previous)"
    )
    raise ConfigurationError(message)
