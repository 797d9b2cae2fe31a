"""Tests for producerkit.partitioners: published hash vectors, ranges, keyless partitioners."""

from __future__ import annotations

import importlib
import os
import random
import subprocess
import sys
import zlib
from collections import Counter
from collections.abc import Callable
from typing import cast

import mmh3
import pytest
import xxhash as xxhash_lib
from hypothesis import given, settings
from hypothesis import strategies as st

from producerkit import partitioners as pk
from producerkit.partitioners import (
    KEYLESS_PARTITIONERS,
    PARTITIONERS,
    KeylessPartitioner,
    RoundRobinPartitioner,
    StickyPartitioner,
    crc32,
    memphis,
    murmur2,
    murmur2_hash,
    resolve,
    resolve_keyless,
    xxhash,
)

KEY_PARTITIONERS: list[Callable[[bytes, int], int]] = [xxhash, murmur2, memphis, crc32]
keys = st.binary(max_size=300)  # past 256 bytes murmur2 takes its generic unpacking path
partition_counts = st.integers(min_value=1, max_value=10_000)


# --- murmur2: Kafka's Java implementation is the reference -------------------------------------

# apache/kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2
# (the same six cases appear in kafka_ex, ClickHouse's kafkaMurmurHash test and others).
KAFKA_UTILS_TEST_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# akka/akka, akka-cluster-sharding-typed/.../internal/Murmur2Spec.scala: "expected correct hash
# values from the kafka murmur2 impl"; they cover every tail length (1, 2, 3, 0, 1 bytes).
AKKA_KAFKA_VECTORS = {
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}

# confluentinc/librdkafka, src/rdmurmur2.c, unittest_murmurhashneutral2 ("java_murmur2_results"):
# the hash with the sign bit cleared, as librdkafka's murmur2 partitioner uses it.
LIBRDKAFKA_POSITIVE_VECTORS = {
    b"kafka": 1348980580,
    b"amqp": 767747138,
    b"giberish123456789": 257239820,
}

# dpkp/kafka-python, test/test_partitioner.py, test_murmur2_java_compatibility: partitions out of
# 1000 "compare[d] with output from Kafka's org.apache.kafka.clients.producer.Partitioner".
JAVA_PARTITIONS_OF_1000 = {
    b"": 681,
    b"a": 524,
    b"ab": 434,
    b"abc": 107,
    b"123456789": 566,
    b"\x00 ": 742,
}


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value


def java_murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2, transliterated line by line with Java int semantics (slow)."""
    length = len(data)
    seed = _int32(0x9747B28C)
    m = 0x5BD1E995
    r = 24
    h = _int32(seed ^ length)
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = _int32(
            (data[i4 + 0] & 0xFF)
            + ((data[i4 + 1] & 0xFF) << 8)
            + ((data[i4 + 2] & 0xFF) << 16)
            + ((data[i4 + 3] & 0xFF) << 24)
        )
        k = _int32(k * m)
        k = _int32(k ^ ((k & 0xFFFFFFFF) >> r))  # k ^= k >>> r
        k = _int32(k * m)
        h = _int32(h * m)
        h = _int32(h ^ k)
    remainder = length % 4
    if remainder == 3:
        h = _int32(h ^ ((data[(length & ~3) + 2] & 0xFF) << 16))
    if remainder >= 2:
        h = _int32(h ^ ((data[(length & ~3) + 1] & 0xFF) << 8))
    if remainder >= 1:
        h = _int32(h ^ (data[length & ~3] & 0xFF))
        h = _int32(h * m)
    h = _int32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _int32(h * m)
    return _int32(h ^ ((h & 0xFFFFFFFF) >> 15))


@pytest.mark.parametrize(
    ("key", "expected"), [*KAFKA_UTILS_TEST_VECTORS.items(), *AKKA_KAFKA_VECTORS.items()]
)
def test_murmur2_hash_matches_java_vectors(key: bytes, expected: int) -> None:
    assert murmur2_hash(key) == expected
    assert java_murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_POSITIVE_VECTORS.items())
def test_murmur2_hash_matches_librdkafka_vectors(key: bytes, expected: int) -> None:
    assert murmur2_hash(key) & 0x7FFFFFFF == expected


@pytest.mark.parametrize(("key", "expected"), JAVA_PARTITIONS_OF_1000.items())
def test_murmur2_partition_matches_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key, 1000) == expected


def test_murmur2_partition_is_to_positive_not_abs() -> None:
    # murmur2(b"21") is negative: Java's toPositive() clears the sign bit, abs() would differ.
    h = KAFKA_UTILS_TEST_VECTORS[b"21"]
    assert murmur2(b"21", 1000) == (h & 0x7FFFFFFF) % 1000 == 340
    assert murmur2(b"21", 1000) != abs(h) % 1000


def test_murmur2_every_tail_length_and_long_keys() -> None:
    rng = random.Random(480)
    lengths = [*range(17), 255, 256, 257, 259, 260, 1000]
    for length in lengths:
        for _ in range(20):
            data = rng.randbytes(length)
            assert murmur2_hash(data) == java_murmur2(data), length


@settings(max_examples=300, deadline=None)
@given(key=keys, n=partition_counts)
def test_murmur2_matches_reference_transliteration(key: bytes, n: int) -> None:
    expected = java_murmur2(key)
    assert murmur2_hash(key) == expected
    assert -(2**31) <= murmur2_hash(key) < 2**31
    assert murmur2(key, n) == (expected & 0x7FFFFFFF) % n


def _kafka_python_murmur2() -> Callable[[bytes], int]:
    pytest.importorskip("kafka")
    # kafka-python >= 2.1 keeps murmur2 in .default, older releases in .hashed.
    for module_name in ("kafka.partitioner.default", "kafka.partitioner.hashed"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found = getattr(module, "murmur2", None)
        if callable(found):
            return cast("Callable[[bytes], int]", found)
    pytest.skip("kafka-python is installed but has no murmur2 where expected")


@settings(max_examples=300, deadline=None)
@given(key=keys)
def test_murmur2_cross_check_with_kafka_python(key: bytes) -> None:
    reference = _kafka_python_murmur2()
    # kafka-python returns the same 32 bits as an unsigned value.
    assert murmur2_hash(key) & 0xFFFFFFFF == reference(key) & 0xFFFFFFFF


# --- memphis, crc32, xxhash --------------------------------------------------------------------


def test_memphis_uses_murmur3_x86_32() -> None:
    # Published MurmurHash3_x86_32 vectors: the classic pangram with seed 0, and mmh3's README.
    assert mmh3.hash(b"The quick brown fox jumps over the lazy dog", 0, signed=False) == 0x2E4FF723
    assert mmh3.hash("foo") == -156908512


@pytest.mark.parametrize(
    ("key", "unsigned_hash"),
    [
        # mmh3.hash(key, 31, signed=False), memphis.py's Producer.get_partition_from_key formula
        # (Memphis.SEED = 31). Regression values, not published by Memphis.
        (b"", 1257683291),
        (b"a", 3387765255),
        (b"user-1", 3441879530),
        (b"order-42", 3439376744),
        ("ключ".encode(), 4127882257),
    ],
)
def test_memphis_known_values(key: bytes, unsigned_hash: int) -> None:
    for n in (1, 2, 3, 7, 10, 64, 1000):
        assert memphis(key, n) == unsigned_hash % n


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=50), n=partition_counts)
def test_memphis_matches_sdk_formula_for_str_keys(text: str, n: int) -> None:
    # memphis.py hashes the str partition key itself; mmh3 encodes a str as UTF-8.
    assert memphis(text.encode(), n) == mmh3.hash(text, 31, signed=False) % n


def test_crc32_is_librdkafka_consistent() -> None:
    # CRC-32/ISO-HDLC check value, the same CRC as librdkafka's rd_crc32 (zlib's crc32).
    assert zlib.crc32(b"123456789") == 0xCBF43926
    for n in (1, 3, 12, 64, 1000):
        assert crc32(b"123456789", n) == 0xCBF43926 % n
    assert crc32(b"", 7) == 0  # the empty key hashes to 0


def test_xxhash_is_xxh3_64() -> None:
    # XXH3_64bits of empty input with seed 0: the xxHash reference sanity value.
    assert xxhash_lib.xxh3_64_intdigest(b"") == 0x2D06800538D394C2
    for key in (b"", b"user-1", b"x" * 1000):
        for n in (1, 12, 64, 1000):
            assert xxhash(key, n) == xxhash_lib.xxh3_64_intdigest(key) % n


# --- properties shared by every key partitioner ------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(key=keys, n=partition_counts)
def test_partition_in_range(key: bytes, n: int) -> None:
    for partitioner in KEY_PARTITIONERS:
        assert 0 <= partitioner(key, n) < n


@settings(max_examples=100, deadline=None)
@given(key=keys, n=partition_counts)
def test_deterministic(key: bytes, n: int) -> None:
    for partitioner in KEY_PARTITIONERS:
        assert partitioner(key, n) == partitioner(bytes(key), n)


def test_single_partition_is_always_zero() -> None:
    for partitioner in KEY_PARTITIONERS:
        assert {partitioner(b"k%d" % i, 1) for i in range(100)} == {0}


def test_deterministic_across_processes() -> None:
    # Python's str/bytes hash() is salted per process; none of the partitioners may depend on it.
    sample = [b"", b"a", b"user-42", b"\xff" * 33]
    script = (
        "from producerkit import partitioners as pk\n"
        f"print([[f(k, 97) for k in {sample!r}] for f in "
        "(pk.xxhash, pk.murmur2, pk.memphis, pk.crc32)])"
    )
    here = [[f(k, 97) for k in sample] for f in KEY_PARTITIONERS]
    # The directory this run imported producerkit from (not resolved: it may be a symlink).
    root = os.path.dirname(os.path.dirname(os.path.abspath(pk.__file__)))
    for hash_seed in ("1", "2"):
        env = {
            **os.environ,
            "PYTHONHASHSEED": hash_seed,
            "PYTHONPATH": root,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == repr(here)


def test_partitioners_spread_keys() -> None:
    # A coarse sanity check (the bench measures uniformity properly): no empty or hot partition.
    for partitioner in KEY_PARTITIONERS:
        counts = Counter(partitioner(b"user-%d" % i, 8) for i in range(8000))
        assert len(counts) == 8
        assert max(counts.values()) < 1200, partitioner.__name__


# --- registry ----------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert dict(PARTITIONERS) == {
        "xxhash": xxhash,
        "murmur2": murmur2,
        "memphis": memphis,
        "crc32": crc32,
    }
    assert set(KEYLESS_PARTITIONERS) == {"sticky", "round_robin"}
    with pytest.raises(TypeError):
        PARTITIONERS["mine"] = xxhash  # type: ignore[index]


@pytest.mark.parametrize("name", ["xxhash", "murmur2", "memphis", "crc32"])
def test_resolve_by_name(name: str) -> None:
    assert resolve(name) is PARTITIONERS[name]


def test_resolve_passes_callables_through() -> None:
    def mine(key: bytes, num_partitions: int) -> int:
        return len(key) % num_partitions

    assert resolve(mine) is mine


@pytest.mark.parametrize("bad", ["murmur3", "", "XXHASH", " crc32", 42, None])
def test_resolve_rejects_unknown(bad: object) -> None:
    errors = pytest.importorskip("producerkit.errors")
    with pytest.raises(errors.ConfigurationError) as caught:
        resolve(bad)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert repr(bad) in message
    for name in PARTITIONERS:
        assert repr(name) in message


def test_resolve_keyless() -> None:
    sticky = resolve_keyless("sticky")
    assert isinstance(sticky, StickyPartitioner)
    # A fresh instance per call: the state belongs to one producer.
    assert resolve_keyless("sticky") is not sticky
    assert isinstance(resolve_keyless("round_robin"), RoundRobinPartitioner)
    assert resolve_keyless(sticky) is sticky


@pytest.mark.parametrize("bad", ["random", "roundrobin", 3, object()])
def test_resolve_keyless_rejects_unknown(bad: object) -> None:
    errors = pytest.importorskip("producerkit.errors")
    with pytest.raises(errors.ConfigurationError) as caught:
        resolve_keyless(bad)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert "'sticky'" in str(caught.value)
    assert "'round_robin'" in str(caught.value)


# --- keyless partitioners ----------------------------------------------------------------------


def test_keyless_partitioners_share_the_protocol() -> None:
    partitioners: list[KeylessPartitioner] = [StickyPartitioner(), RoundRobinPartitioner()]
    for partitioner in partitioners:
        assert 0 <= partitioner.partition("t", 5) < 5
        partitioner.on_new_batch("t", 5, 0)


def test_sticky_stays_put_between_batches() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 12)
    assert all(sticky.partition("t", 12) == first for _ in range(1000))


def test_sticky_moves_to_another_partition_on_new_batch() -> None:
    for n in (2, 3, 12, 100):
        sticky = StickyPartitioner(random.Random(n))
        seen = set()
        current = sticky.partition("t", n)
        for _ in range(100 * n):
            sticky.on_new_batch("t", n, current)
            following = sticky.partition("t", n)
            assert following != current
            assert 0 <= following < n
            assert sticky.partition("t", n) == following
            seen.add(following)
            current = following
        assert seen == set(range(n))


def test_sticky_single_partition_stays_put() -> None:
    sticky = StickyPartitioner(random.Random(0))
    assert sticky.partition("t", 1) == 0
    for _ in range(10):
        sticky.on_new_batch("t", 1, 0)
        assert sticky.partition("t", 1) == 0


def test_sticky_ignores_stale_batch_notice() -> None:
    sticky = StickyPartitioner(random.Random(7))
    current = sticky.partition("t", 10)
    stale = (current + 1) % 10
    for _ in range(50):
        sticky.on_new_batch("t", 10, stale)
        assert sticky.partition("t", 10) == current


def test_sticky_topics_are_independent() -> None:
    sticky = StickyPartitioner(random.Random(3))
    a = sticky.partition("a", 50)
    b = sticky.partition("b", 50)
    sticky.on_new_batch("a", 50, a)
    assert sticky.partition("a", 50) != a
    assert sticky.partition("b", 50) == b


def test_sticky_new_batch_before_first_partition_and_out_of_range_previous() -> None:
    sticky = StickyPartitioner(random.Random(5))
    sticky.on_new_batch("t", 4, 2)
    assert sticky.partition("t", 4) != 2
    sticky.on_new_batch("u", 4, 9)  # previous beyond the count: any partition will do
    assert 0 <= sticky.partition("u", 4) < 4


def test_sticky_redraws_when_partition_count_shrinks() -> None:
    sticky = StickyPartitioner(random.Random(11))
    while sticky.partition("t", 100) < 10:
        sticky.on_new_batch("t", 100, sticky.partition("t", 100))
    assert 0 <= sticky.partition("t", 10) < 10


def test_sticky_is_reproducible_with_a_seeded_rng() -> None:
    def run(seed: int) -> list[int]:
        sticky = StickyPartitioner(random.Random(seed))
        out = []
        for _ in range(20):
            p = sticky.partition("t", 9)
            out.append(p)
            sticky.on_new_batch("t", 9, p)
        return out

    assert run(42) == run(42)


def test_sticky_default_rng_spreads_first_choice() -> None:
    assert len({StickyPartitioner().partition("t", 64) for _ in range(200)}) > 1


def test_round_robin_cycles() -> None:
    rr = RoundRobinPartitioner()
    assert [rr.partition("t", 4) for _ in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_round_robin_ignores_batches_and_keeps_topics_apart() -> None:
    rr = RoundRobinPartitioner()
    assert rr.partition("a", 3) == 0
    rr.on_new_batch("a", 3, 0)
    assert rr.partition("b", 3) == 0
    assert rr.partition("a", 3) == 1
    assert rr.partition("a", 3) == 2
    assert rr.partition("b", 3) == 1


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=50))
def test_keyless_in_range_even_when_count_changes(counts: list[int]) -> None:
    sticky = StickyPartitioner(random.Random(0))
    rr = RoundRobinPartitioner()
    for n in counts:
        p = sticky.partition("t", n)
        assert 0 <= p < n
        sticky.on_new_batch("t", n, p)
        assert 0 <= sticky.partition("t", n) < n
        assert 0 <= rr.partition("t", n) < n
