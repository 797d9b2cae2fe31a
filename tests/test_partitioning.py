"""Partitioning and connection pooling against the real session brokers (issue 3's "done when").

- ``partitioner="murmur2"``: every keyed record read back from Kafka by another client sits on
  the partition Java's formula gives, and confluent-kafka's ``murmur2_random`` agrees key by key;
- ``connections=4``: the process holds 4 TCP connections to the broker, per-connection stats show
  the spread, and per-key order survives 100,000 nonblocking keyed messages (Kafka, JetStream);
- JetStream ``partitions=4``: subject ``{topic}.{partitioner(key, 4)}``; ``partition=`` wins;
  out of range is a MessageError at the call;
- Kafka metadata refresh: a topic that grows is seen by a running producer.

The Java formula is computed here from Kafka's ``Utils.murmur2`` (transliterated with Java
``int`` semantics and checked against Kafka's own test vectors), not from producerkit's code.
"""

from __future__ import annotations

import asyncio
import collections
import os
import uuid
from typing import Any

import pytest
from conftest import read_jetstream, read_kafka

import producerkit as pk
from producerkit import partitioners
from producerkit.testing.brokers import create_kafka_topic
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio

# ---------------------------------------------------------------------- helpers


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - 0x100000000 if value & 0x80000000 else value


def java_murmur2(data: bytes) -> int:
    """org.apache.kafka.common.utils.Utils.murmur2, line by line, with Java int arithmetic."""
    length = len(data)
    m = 0x5BD1E995
    h = _int32(_int32(0x9747B28C) ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = _int32(data[i4] | data[i4 + 1] << 8 | data[i4 + 2] << 16 | data[i4 + 3] << 24)
        k = _int32(k * m)
        k = _int32(k ^ ((k & 0xFFFFFFFF) >> 24))  # k ^= k >>> r
        k = _int32(k * m)
        h = _int32(_int32(h * m) ^ k)
    tail = length & ~3
    remainder = length % 4
    if remainder == 3:
        h = _int32(h ^ data[tail + 2] << 16)
    if remainder >= 2:
        h = _int32(h ^ data[tail + 1] << 8)
    if remainder >= 1:
        h = _int32((h ^ data[tail]) * m)
    h = _int32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _int32(h * m)
    return _int32(h ^ ((h & 0xFFFFFFFF) >> 15))


def java_partition(key: bytes, num_partitions: int) -> int:
    """BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % numPartitions."""
    return (java_murmur2(key) & 0x7FFFFFFF) % num_partitions


def test_java_oracle_matches_kafka_utils_test_vectors() -> None:
    # apache/kafka UtilsTest.testMurmur2: the oracle above is only trusted because of these.
    vectors = {
        b"21": -973932308,
        b"foobar": -790332482,
        b"a-little-bit-long-string": -985981536,
        b"a-little-bit-longer-string": -1486304829,
        b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
        b"abc": 479470107,
    }
    assert {key: java_murmur2(key) for key in vectors} == vectors


def established_connections(port: int) -> int:
    """TCP connections in ESTABLISHED state from this process to 127.0.0.1:``port``.

    /proc/self/net/tcp lists every socket of the network namespace; only those whose inode is
    one of this process's open file descriptors are ours.
    """
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                    if fields[3] == "01" and remote_port == port and fields[9] in ours:
                        count += 1
        except FileNotFoundError:
            continue
    return count


def new_topic() -> str:
    return f"p-{uuid.uuid4().hex[:12]}"


def check_per_key_order(sequences: dict[bytes, list[int]], per_key: int) -> None:
    """Every key's sequence numbers, in the order read back, are exactly 0..per_key-1."""
    expected = list(range(per_key))
    broken = [key for key, seen in sequences.items() if seen != expected]
    assert not broken, f"{len(broken)} keys out of order or incomplete, e.g. {broken[:3]}"


KEYS = 1000
PER_KEY = 100  # KEYS * PER_KEY = 100,000 messages


def keyed_messages() -> list[tuple[bytes, int]]:
    """(key, sequence) for 100,000 messages: 1000 keys interleaved, 100 messages each."""
    return [(b"key-%d" % k, seq) for seq in range(PER_KEY) for k in range(KEYS)]


# ---------------------------------------------------------------------- murmur2 on Kafka


async def test_murmur2_keys_land_where_java_and_librdkafka_put_them(
    kafka_broker: SessionBroker,
) -> None:
    topic, peer_topic = new_topic(), new_topic()
    keys = [b"user-%d" % i for i in range(1500)] + [b"", b"\x00", b"\xff" * 7, "clé".encode()]

    async def main() -> tuple[list[dict[str, Any]], list[pk.Delivery | None]]:
        await create_kafka_topic(kafka_broker.url, topic, 6)
        await create_kafka_topic(kafka_broker.url, peer_topic, 6)
        async with pk.Producer(kafka_broker.url, topic=topic, partitioner="murmur2") as producer:
            # A few blocking produces: the returned Delivery says the same partition.
            deliveries = [await producer.produce(b"sync", key=key) for key in keys[:20]]
            for key in keys:
                await producer.produce(key, key=key, nonblocking=True)
            await producer.flush()
        return await read_kafka(kafka_broker.url, topic, 20 + len(keys)), deliveries

    records, deliveries = await main()
    assert len(records) == 20 + len(keys)
    for key, delivery in zip(keys, deliveries, strict=False):
        assert delivery is not None and delivery.partition == java_partition(key, 6)
    wrong = [r for r in records if r["partition"] != java_partition(r["key"], 6)]
    assert not wrong, f"{len(wrong)} records off Java's partition, e.g. {wrong[:3]}"
    assert len({r["partition"] for r in records}) == 6

    # confluent-kafka (librdkafka) with murmur2_random, a different client on the same broker.
    from confluent_kafka import Producer as ConfluentProducer

    peer = ConfluentProducer(
        {
            "bootstrap.servers": kafka_broker.url.removeprefix("kafka://"),
            "partitioner": "murmur2_random",
            "log_level": 3,
        }
    )
    for key in keys:
        peer.produce(peer_topic, key=key, value=key)
    assert peer.flush(30) == 0
    peer_records = await read_kafka(kafka_broker.url, peer_topic, len(keys))
    ours = {r["key"]: r["partition"] for r in records}
    theirs = {r["key"]: r["partition"] for r in peer_records}
    assert len(theirs) == len(keys)
    assert theirs == {key: ours[key] for key in theirs}


# ---------------------------------------------------------------------- connections=4


async def test_four_kafka_connections_keep_per_key_order(kafka_broker: SessionBroker) -> None:
    topic = new_topic()
    messages = keyed_messages()

    async def main() -> tuple[list[dict[str, Any]], pk.Stats, int]:
        # 8 partitions over 4 connections: partition p travels connection p % 4.
        await create_kafka_topic(kafka_broker.url, topic, 8)
        async with pk.Producer(kafka_broker.url, topic=topic, connections=4) as producer:
            await producer.produce(b"hello", key=b"hello")
            for key, seq in messages:
                await producer.produce(b"%d" % seq, key=key, nonblocking=True)
            await producer.flush()
            # aiokafka connects to a broker on first use: count once every connection has sent.
            sockets = established_connections(kafka_broker.port)
            stats = producer.stats
        records = await read_kafka(kafka_broker.url, topic, len(messages) + 1, timeout=40)
        return records, stats, sockets

    records, stats, sockets = await main()
    assert sockets == 4
    assert len(records) == len(messages) + 1
    records.sort(key=lambda r: (r["partition"], r["offset"]))
    sequences: dict[bytes, list[int]] = collections.defaultdict(list)
    per_connection = [0] * 4
    for record in records:
        per_connection[record["partition"] % 4] += 1
        if record["key"] != b"hello":
            sequences[record["key"]].append(int(record["value"]))
    check_per_key_order(sequences, PER_KEY)
    # Each connection acked exactly what the partitions it owns hold, and all four took a share.
    assert [c.acked for c in stats.connections] == per_connection
    assert [c.in_flight for c in stats.connections] == [0] * 4
    assert all(count > len(records) / 8 for count in per_connection)
    assert stats.acked == stats.produced == len(records)


async def test_four_jetstream_connections_keep_per_key_order(nats_broker: SessionBroker) -> None:
    topic = new_topic()
    messages = keyed_messages()
    url = nats_broker.jetstream_url

    async def main() -> tuple[list[dict[str, Any]], pk.Stats, int]:
        async with pk.Producer(
            url, topic=topic, connections=4, partitions=4, create_stream=True
        ) as producer:
            await producer.produce(b"hello:0", key=b"hello")
            sockets = established_connections(nats_broker.port)
            for key, seq in messages:
                await producer.produce(key + b":%d" % seq, key=key, nonblocking=True)
            await producer.flush()
            stats = producer.stats
        records = await read_jetstream(url, f"{topic}.>", len(messages) + 1, timeout=40)
        return records, stats, sockets

    records, stats, sockets = await main()
    assert sockets == 4
    assert len(records) == len(messages) + 1
    sequences: dict[bytes, list[int]] = collections.defaultdict(list)
    per_partition = [0] * 4
    for record in sorted(records, key=lambda r: r["offset"]):
        key, _, seq = record["value"].rpartition(b":")
        partition = partitioners.xxhash(key, 4)
        assert record["subject"] == f"{topic}.{partition}"
        per_partition[partition] += 1
        if key != b"hello":
            sequences[key].append(int(seq))
    check_per_key_order(sequences, PER_KEY)
    # partitions=4 over connections=4: partition p is connection p.
    assert [c.acked for c in stats.connections] == per_partition
    assert all(count > len(records) / 8 for count in per_partition)


async def test_keyless_traffic_spreads_over_connections(
    kafka_broker: SessionBroker, nats_broker: SessionBroker
) -> None:
    async def main() -> tuple[pk.Stats, pk.Stats]:
        # JetStream, unpartitioned: keyless messages take the connections in turn.
        async with pk.Producer(
            nats_broker.jetstream_url,
            topic=new_topic(),
            connections=4,
            create_stream=True,
        ) as producer:
            for i in range(4000):
                await producer.produce(b"%d" % i, nonblocking=True)
            await producer.flush()
            jetstream = producer.stats
        # Kafka, 4 partitions: sticky keyless moves to another partition after each batch, and
        # partition p travels connection p % 4. Small batches make many moves.
        topic = new_topic()
        await create_kafka_topic(kafka_broker.url, topic, 4)
        async with pk.Producer(
            kafka_broker.url, topic=topic, connections=4, max_batch_size=2048
        ) as producer:
            for i in range(20_000):
                await producer.produce(b"%d" % i, nonblocking=True)
            await producer.flush()
            kafka = producer.stats
        return jetstream, kafka

    jetstream, kafka = await main()
    assert [c.acked for c in jetstream.connections] == [1000] * 4
    assert sum(c.acked for c in kafka.connections) == 20_000
    assert sum(c.acked > 0 for c in kafka.connections) >= 3, kafka.connections


# ---------------------------------------------------------------------- JetStream partitions=4


@pytest.mark.parametrize("name", sorted(partitioners.PARTITIONERS))
async def test_jetstream_partitions_spread_keys_by_the_chosen_partitioner(
    nats_broker: SessionBroker, name: str
) -> None:
    topic = new_topic()
    url = nats_broker.jetstream_url
    keys = [b"k%d" % i for i in range(400)]
    choose = partitioners.PARTITIONERS[name]

    async def main() -> list[dict[str, Any]]:
        async with pk.Producer(
            url, topic=topic, partitions=4, partitioner=name, create_stream=True
        ) as producer:
            for key in keys:
                await producer.produce(key, key=key, nonblocking=True)
            delivery = await producer.produce(b"explicit", key=keys[0], partition=3)
            assert delivery is not None and delivery.partition == 3
            before = producer.stats.produced
            for bad in (4, -1):
                with pytest.raises(pk.MessageError, match="out of range"):
                    await producer.produce(b"x", key=b"k", partition=bad)
            assert producer.stats.produced == before  # refused at the call: nothing counted
            await producer.flush()
        return await read_jetstream(url, f"{topic}.>", len(keys) + 1)

    records = await main()
    assert len(records) == len(keys) + 1
    *keyed, explicit = sorted(records, key=lambda r: r["offset"])
    assert explicit == {**explicit, "subject": f"{topic}.3", "value": b"explicit"}
    wrong = [r for r in keyed if r["subject"] != f"{topic}.{choose(r['value'], 4)}"]
    assert not wrong, wrong[:3]
    assert {r["subject"] for r in keyed} == {f"{topic}.{p}" for p in range(4)}


async def test_jetstream_without_partitions_adds_no_suffix(nats_broker: SessionBroker) -> None:
    topic = new_topic()
    url = nats_broker.jetstream_url

    async def main() -> list[dict[str, Any]]:
        async with pk.Producer(url, topic=topic, create_stream=True) as producer:
            await producer.produce(b"v", key=b"k")
            with pytest.raises(pk.MessageError, match="not partitioned"):
                await producer.produce(b"v", key=b"k", partition=0)
        return await read_jetstream(url, topic, 1)

    assert [r["subject"] for r in await main()] == [topic]


async def test_kafka_explicit_partition_wins_and_out_of_range_fails_at_the_call(
    kafka_broker: SessionBroker,
) -> None:
    topic = new_topic()

    async def main() -> list[dict[str, Any]]:
        await create_kafka_topic(kafka_broker.url, topic, 6)
        async with pk.Producer(kafka_broker.url, topic=topic, partitioner="murmur2") as producer:
            key = next(b"k%d" % i for i in range(100) if java_partition(b"k%d" % i, 6) != 5)
            delivery = await producer.produce(b"v", key=key, partition=5)
            assert delivery is not None and delivery.partition == 5
            for bad in (6, -1):
                with pytest.raises(pk.MessageError, match="out of range"):
                    await producer.produce(b"v", key=key, partition=bad)
            assert producer.stats.produced == 1
        return await read_kafka(kafka_broker.url, topic, 1)

    assert [r["partition"] for r in await main()] == [5]


# ---------------------------------------------------------------------- metadata refresh


async def test_kafka_partition_count_follows_metadata(kafka_broker: SessionBroker) -> None:
    """Partitions added while a producer runs are used once aiokafka's metadata refresh sees
    them. Tansu 0.6 does not implement CreatePartitions (API key 37 is missing from its
    ApiVersions response), so this skips there."""
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
    from aiokafka.errors import IncompatibleBrokerVersion

    topic = new_topic()
    keys = [b"k%d" % i for i in range(200)]

    async def main() -> list[dict[str, Any]] | None:
        await create_kafka_topic(kafka_broker.url, topic, 2)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.url.removeprefix("kafka://"))
        await admin.start()
        try:
            async with pk.Producer(
                kafka_broker.url, topic=topic, partitioner="murmur2", metadata_max_age_ms=500
            ) as producer:
                for key in keys:
                    await producer.produce(b"before", key=key, nonblocking=True)
                await producer.flush()
                try:
                    await admin.create_partitions({topic: NewPartitions(6)})
                except IncompatibleBrokerVersion:
                    return None
                await asyncio.sleep(1.5)  # three metadata refresh periods
                for key in keys:
                    await producer.produce(b"after", key=key, nonblocking=True)
                await producer.flush()
        finally:
            await admin.close()
        return await read_kafka(kafka_broker.url, topic, 2 * len(keys))

    records = await main()
    if records is None:
        pytest.skip("the broker (Tansu 0.6) does not support CreatePartitions (API key 37)")
    after = [r for r in records if r["value"] == b"after"]
    assert all(r["partition"] == java_partition(r["key"], 6) for r in after)
    assert any(r["partition"] >= 2 for r in after)


async def test_kafka_topic_recreated_larger_is_seen_by_a_running_producer(
    kafka_broker: SessionBroker,
) -> None:
    """The same refresh path as above, on a change Tansu can make: the topic deleted and created
    again with 6 partitions instead of 2 while the producer (2 connections) stays open."""
    from aiokafka.admin import AIOKafkaAdminClient

    topic = new_topic()
    keys = [b"k%d" % i for i in range(300)]

    async def main() -> list[dict[str, Any]]:
        await create_kafka_topic(kafka_broker.url, topic, 2)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.url.removeprefix("kafka://"))
        await admin.start()
        try:
            async with pk.Producer(
                kafka_broker.url,
                topic=topic,
                partitioner="murmur2",
                connections=2,
                metadata_max_age_ms=500,
            ) as producer:
                before = [await producer.produce(b"before", key=key) for key in keys[:50]]
                assert {d.partition for d in before if d is not None} == {0, 1}
                await admin.delete_topics([topic])
                await create_kafka_topic(kafka_broker.url, topic, 6)
                await asyncio.sleep(1.5)  # three metadata refresh periods
                for key in keys:
                    await producer.produce(b"after", key=key, nonblocking=True)
                await producer.flush()
        finally:
            await admin.close()
        return await read_kafka(kafka_broker.url, topic, len(keys))

    records = await main()
    assert len(records) == len(keys)  # the deleted topic's records are gone with it
    wrong = [r for r in records if r["partition"] != java_partition(r["key"], 6)]
    assert not wrong, wrong[:3]
    assert {r["partition"] for r in records} == set(range(6))
