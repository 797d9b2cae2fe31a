"""One chaos run: the broker or cluster started, the producer behind the fault proxy, the load
and the faults at once, then the read-back and the report (see the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import platform
import random
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import producerkit as pk
from chaos.faults import (
    REPLICATION,
    ApacheFaults,
    ClusterFaults,
    HarnessError,
    JetStreamFaults,
    NodeFaults,
    default_modes,
    fault_plan,
    inject_faults,
)
from chaos.judges.kafka_idempotence import cluster_summary, kafka_view
from chaos.judges.stored import Stored
from chaos.readback import LiveReader, read_committed, read_jetstream, read_kafka
from chaos.report import analyze, plot, print_summary
from chaos.workload import (
    VALUE_SIZE,
    WARM_UP,
    Ledger,
    Messages,
    has_msg_id,
    measure_capacity,
    rss_mb,
    sample,
    send_load,
)
from producerkit.testing.brokers import (
    BrokerFaults,
    LocalBroker,
    create_kafka_topic,
    start_kafka,
    start_nats,
)
from producerkit.testing.proxy import FaultProxy

if TYPE_CHECKING:
    from chaos.faults import Cluster

CLUSTER_BROKERS = 3
#: The cluster's default rate cap (msg/s): the mock keeps the last 5 MB of each partition and
#: answers each partition entry of a Fetch with one batch, found by walking the partition's
#: batches from the oldest (about 0.5 ms at the end of 5 MB of one-record batches), in the one
#: thread that also takes the producer's requests; the live read-back keeps up at this rate
#: (2,000 msg/s: within 1,600 records of the end over 4 minutes) on this 2-core machine.
CLUSTER_MAX_RATE = 2000.0
#: Apache Kafka's default rate cap (msg/s): three JVMs and the producer share this machine's 2
#: cores, and the topic is read back at the end (some 16 MB of log a minute on each node at
#: this rate). At 5,000 msg/s (load 15 on this machine) a node killed after 20 minutes had not
#: rejoined the ISR a minute after its restart.
APACHE_MAX_RATE = 2000.0
#: The JetStream cluster's default rate cap (msg/s): three nats-servers store every message
#: three times (R3, file storage) on the same 2 cores as the producer and the proxy, and a
#: server killed catches up on what it missed before it reports itself healthy.
JETSTREAM_CLUSTER_MAX_RATE = 2000.0
SETTLE = 2.0


def node_faults(cluster: Cluster, topic: str, partitions: int, seed: int) -> NodeFaults:
    """The cluster's own faults on ``topic`` (the JetStream cluster's: on its stream, named
    alike), seeded apart from the proxy's."""
    from producerkit.testing.kafka_cluster import KafkaCluster
    from producerkit.testing.nats_cluster import JetStreamCluster

    rng = random.Random(f"{seed}-cluster")
    if isinstance(cluster, KafkaCluster):
        return ClusterFaults(cluster, topic, partitions, rng)
    if isinstance(cluster, JetStreamCluster):
        return JetStreamFaults(cluster, topic, rng)
    return ApacheFaults(cluster, topic, partitions, rng)


async def chaos(
    args: argparse.Namespace,
    broker: LocalBroker | None,
    faults: FaultProxy,
    cluster: Cluster | None = None,
) -> dict[str, Any]:
    """One run against ``broker`` behind ``faults``, or against ``cluster`` (the mock's, Apache
    Kafka's or the JetStream cluster) behind its own fault proxy (``faults``), with its own
    faults too."""
    import numpy as np

    jetstream = args.backend in ("jetstream", "jetstream-cluster")
    id_runs = args.backend == "jetstream-cluster"
    nonce = uuid.uuid4().hex[:8]
    topic, capacity_topic = f"chaos{nonce}", f"capacity{nonce}"
    cluster_faults = (
        None if cluster is None else node_faults(cluster, topic, args.partitions, args.seed)
    )
    options: dict[str, Any] = {"timeout": args.timeout}
    if jetstream:
        options.update(create_stream=True, stream_storage="file")
        if cluster is not None:
            options["stream_replicas"] = REPLICATION
    else:
        for name in (topic, capacity_topic):
            if cluster_faults is not None:
                await asyncio.to_thread(cluster_faults.create_topic, name)
            else:
                assert broker is not None
                await create_kafka_topic(broker.url, name, args.partitions)
        if args.preset:
            options["preset"] = args.preset
    seconds = args.minutes * 60
    rate = args.rate
    rss_start = rss_mb()
    holder: list[Ledger] = []

    def on_delivery(result: pk.Delivery | pk.Failure, context: Any) -> None:
        if holder:
            holder[0].on_delivery(result, context)

    url = faults.url if cluster is None else cluster.faulty_url  # every member's, proxied
    producer = pk.Producer(url, topic=topic, on_delivery=on_delivery, **options)
    await producer.start()
    idempotent = getattr(producer.backend, "idempotent", None)
    if idempotent is not None:
        reason = getattr(producer.backend, "idempotence_reason", "")
        print(f"idempotent: {idempotent} ({reason})", flush=True)
    capacity = None
    if rate is None:
        capacity = await measure_capacity(
            producer,
            capacity_topic,
            args.capacity_seconds,
            Messages(args.keys, f"{args.seed}-capacity", jetstream, id_runs),
        )
        rate = min(capacity / 2, args.max_messages / seconds, args.max_rate or math.inf)
        capped = " (capped by --max-messages/--max-rate)" if rate < capacity / 2 else ""
        print(
            f"capacity {capacity:,.0f} msg/s: the load runs at {rate:,.0f} msg/s{capped}",
            flush=True,
        )
    await producer.produce(WARM_UP)
    baseline = producer.stats
    fast_acked_before = getattr(producer.backend, "fast_ingest_acked", 0)
    t0 = time.monotonic() + 0.01
    ledger = Ledger(math.ceil(rate * seconds) + 1, t0)
    holder.append(ledger)
    live: LiveReader | None = None
    if isinstance(cluster_faults, ClusterFaults):  # read while the load runs: the mock keeps
        live = LiveReader(  # 5 MB a partition
            cluster_faults.mock.mock_addresses,
            topic,
            dict(cluster_faults.leaders),
            len(ledger.status),
        )
        cluster_faults.watchers.append(live.move)
        live.start()
    logs = [faults.log] + ([cluster_faults.log] if cluster_faults else [])

    def active() -> tuple[str, ...]:
        return tuple(mode for log in logs for mode in log.active())

    samples: list[dict[str, Any]] = []
    sampler = asyncio.ensure_future(sample(producer, ledger, active, samples, live))
    modes = tuple(args.modes.split(",")) if args.modes else default_modes(args.backend)
    injector = asyncio.ensure_future(
        inject_faults(
            faults,
            fault_plan(random.Random(args.seed), modes),
            t0 + seconds - args.timeout - 3,
            cluster_faults,
        )
    )
    # A broken harness stops the load: the rest of the run would test nothing it claims.
    injector.add_done_callback(
        lambda task: setattr(ledger, "stopped", not task.cancelled() and bool(task.exception()))
    )
    print(f"load: {seconds:g} s at {rate:,.0f} msg/s, faults among {', '.join(modes)}", flush=True)
    harness_error = None
    try:
        messages = Messages(args.keys, f"{args.seed}-keys", jetstream, id_runs)
        await send_load(producer, ledger, rate, seconds, messages)
        try:
            await injector
        except HarnessError as exc:
            harness_error = str(exc)
            print(f"HARNESS ERROR: {exc}", flush=True)
    finally:
        injector.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await injector  # a cluster fault cut short ends its window
        await asyncio.to_thread(cluster_faults.reset if cluster_faults else faults.clear)
        closing = time.monotonic()
        with contextlib.suppress(pk.ProduceError):
            await producer.close()
        close_seconds = time.monotonic() - closing
        sampler.cancel()
    stats = producer.stats
    fast_ingest_acked = getattr(producer.backend, "fast_ingest_acked", 0) - fast_acked_before
    rss_end = rss_mb()
    if broker is not None:
        processes = [broker.process]
    elif isinstance(cluster_faults, ApacheFaults):  # the nodes' JVMs
        processes = [node.process for node in cluster_faults.kafka.nodes]
    elif isinstance(cluster_faults, JetStreamFaults):
        processes = [server.process for server in cluster_faults.jetstream.servers]
    else:
        processes = []
    pids = [process.pid for process in processes if process is not None]
    broker_rss = sum(rss_mb(pid) for pid in pids) if pids else math.nan
    windows = [
        {
            "mode": w.mode,
            "start": round(w.started - t0, 3),
            "end": round((w.ended if w.ended is not None else w.started) - t0, 3),
            "detail": w.detail,
        }
        for w in sorted((w for log in logs for w in log.windows()), key=lambda w: w.started)
        if w.mode != "latency"
    ]
    await asyncio.to_thread(faults.stop)
    await asyncio.sleep(SETTLE)
    print("reading back ...", flush=True)
    read_started = time.monotonic()
    view = cluster_report = None
    if live is not None:
        assert isinstance(cluster_faults, ClusterFaults)
        broker_count = await live.finish()
        stored = Stored.from_positions(ledger, live.result, live.positions())
        broker_count -= stored.warm_ups
        for error in live.errors:
            print(f"HARNESS ERROR: {error}", flush=True)
        harness_error = harness_error or "; ".join(live.errors[:3]) or None
        await asyncio.to_thread(cluster_faults.mock.batches.settle, 5.0)
        view = kafka_view(stored, live.served())
        cluster_report = {
            **cluster_faults.report(),
            "read_max_lag_records": live.result.get("max_lag"),
            "read_margin_records": live.result.get("margin"),
            "read_fetches": live.result.get("fetches"),
            "read_reconnects": live.result.get("reconnects"),
            "records_by_verdict": view["records_by_verdict"],
            "order_violations_in_sequence": view["order_violations_in_sequence"],
            "sequence_gaps": view["sequence_gaps"],
            "unbatched_records": view["unbatched_records"],
            "stored_only_in_batches_kafka_refuses": view["stored_only_in_batches_kafka_refuses"],
            **cluster_summary(cluster_faults.mock.batches, topic, cluster_faults.errors_pushed),
        }
    elif isinstance(cluster_faults, ApacheFaults):
        stored = Stored(ledger)
        bootstrap = cluster_faults.kafka.bootstrap_servers
        high = await asyncio.to_thread(
            read_committed, bootstrap, topic, args.partitions, stored.visit
        )
        broker_count = high - stored.warm_ups
        cluster_report = await asyncio.to_thread(cluster_faults.report)
    elif isinstance(cluster_faults, JetStreamFaults):
        stored = Stored(ledger)
        url = cluster_faults.jetstream.url
        broker_count = await read_jetstream(url, topic, stored.visit) - stored.warm_ups
        cluster_report = {
            **await asyncio.to_thread(cluster_faults.report),
            "fast_ingest_acked": fast_ingest_acked,
        }
    else:
        stored = Stored(ledger)
        reader = read_jetstream if jetstream else read_kafka
        assert broker is not None
        broker_count = await reader(broker.url, topic, stored.visit) - stored.warm_ups
    result = analyze(
        ledger,
        stored,
        broker_count,
        windows,
        (stats.acked - baseline.acked, stats.failed - baseline.failed),
        args.timeout,
        strict_order=not jetstream and args.preset is None,
        dedupes=jetstream or cluster is not None,
        view=view,
        with_id=has_msg_id(np.arange(ledger.sent)) if id_runs else None,
        leader_deaths=(
            [at - t0 for at in cluster_faults.leader_deaths]
            if isinstance(cluster_faults, JetStreamFaults)
            else None
        ),
    )
    checks_pass = all(check["pass"] for check in result["checks"].values())
    return {
        "config": {
            "backend": args.backend,
            "preset": args.preset,
            "seed": args.seed,
            "minutes": args.minutes,
            "rate": rate,
            "capacity": capacity,
            "timeout": args.timeout,
            "keys": args.keys,
            "partitions": None if jetstream else args.partitions,
            "value_size": VALUE_SIZE,
            "modes": list(modes),
            "topic": topic,
            "idempotent": idempotent,
        },
        "cluster": cluster_report,
        "environment": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "producerkit": pk.__version__,
        },
        "pass": checks_pass and result["blocked_past_timeout_s"]["pass"] and not harness_error,
        "harness_error": harness_error,
        "result": result,
        "faults": windows,
        "samples": samples,
        "producer_stats": {
            "window_waits": stats.window_waits - baseline.window_waits,
            "window_wait_seconds": round(
                stats.window_wait_seconds - baseline.window_wait_seconds, 3
            ),
            "peak_in_flight": stats.peak_in_flight,
        },
        "close_seconds": round(close_seconds, 3),
        "read_back_seconds": round(time.monotonic() - read_started, 3),
        "rss_mb": {
            "start": round(rss_start, 1),
            "end": round(rss_end, 1),
            "ledger": round(ledger.nbytes / 1e6, 1),
            "broker_end": round(broker_rss, 1),
        },
    }


def start_cluster(backend: str) -> Cluster:
    """The mock cluster (recording the Produce batches), Apache Kafka or the JetStream cluster
    (its servers naming none of each other to the producer, which reaches each through the
    proxy only), CLUSTER_BROKERS brokers, not started (``with`` starts it)."""
    if backend == "kafka-cluster":
        from chaos.judges.kafka_recorder import RecordingKafkaCluster

        return RecordingKafkaCluster(CLUSTER_BROKERS, record_batches=True)
    if backend == "jetstream-cluster":
        from producerkit.testing.nats_cluster import JetStreamCluster

        return JetStreamCluster(CLUSTER_BROKERS, extra_args=["--no_advertise=true"])
    from producerkit.testing.apache_kafka import ApacheKafka

    return ApacheKafka(CLUSTER_BROKERS)


def main(argv: list[str] | None = None) -> int:
    import chaos as package

    parser = argparse.ArgumentParser(description=(package.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument("--seed", type=int, default=1, help="seeds the faults and the keys")
    parser.add_argument(
        "--backend",
        choices=("kafka", "jetstream", "kafka-cluster", "kafka-apache", "jetstream-cluster"),
        required=True,
        help="kafka: Tansu; kafka-cluster: librdkafka's mock cluster of 3 brokers, in-process;"
        " kafka-apache: 3 Apache Kafka nodes (Java 17+); jetstream-cluster: 3 nats-servers,"
        " an R3 stream",
    )
    parser.add_argument("--preset", choices=("throughput",), help="Kafka's preset (default: none)")
    parser.add_argument(
        "--rate", type=float, help="messages/s (default: half the capacity measured)"
    )
    parser.add_argument("--json", type=Path, help="write the whole report here")
    parser.add_argument("--plot", type=Path, help="draw the run into this PNG")
    parser.add_argument("--timeout", type=float, default=5.0, help="the producer's timeout (s)")
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6, help="of the Kafka topic")
    parser.add_argument("--capacity-seconds", type=float, default=3.0)
    parser.add_argument(
        "--max-messages",
        type=int,
        default=20_000_000,
        help="cap the measured rate so the run sends at most this many (Tansu keeps every "
        "record in memory, some 260 bytes each)",
    )
    parser.add_argument(
        "--max-rate",
        type=float,
        help="cap the measured rate at this many msg/s (default: none; kafka-cluster:"
        f" {CLUSTER_MAX_RATE:,.0f}, what the mock can serve back while the load runs;"
        f" kafka-apache: {APACHE_MAX_RATE:,.0f}; jetstream-cluster:"
        f" {JETSTREAM_CLUSTER_MAX_RATE:,.0f})",
    )
    parser.add_argument("--modes", help="faults to draw from, comma-separated (default: all)")
    args = parser.parse_args(argv)
    if args.max_rate is None:
        args.max_rate = {
            "kafka-cluster": CLUSTER_MAX_RATE,
            "kafka-apache": APACHE_MAX_RATE,
            "jetstream-cluster": JETSTREAM_CLUSTER_MAX_RATE,
        }.get(args.backend)
    if args.preset and args.backend in ("jetstream", "jetstream-cluster"):
        parser.error("--preset is a Kafka setting")
    known = default_modes(args.backend)
    unknown = set((args.modes or "").split(",")) - {"", *known}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)} on {args.backend}: {', '.join(known)}")
    if not 1 <= args.partitions <= 127:
        parser.error("--partitions must be 1-127")
    logging.basicConfig(
        level=logging.ERROR, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    for noisy in ("aiokafka", "nats"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)

    if args.backend in ("kafka-cluster", "kafka-apache", "jetstream-cluster"):
        with start_cluster(args.backend) as cluster:
            report = asyncio.run(chaos(args, None, cluster.faults, cluster))
    else:
        starter = start_nats if args.backend == "jetstream" else start_kafka
        with starter() as broker, BrokerFaults(broker) as faults:
            report = asyncio.run(chaos(args, broker, faults))
    print_summary(report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot(report, args.plot)
        print(f"wrote {args.plot}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
