"""Allocations per message on the hot path, counted with tracemalloc (seed 002: BlazingMQ went
from ~4 to ~1.5 allocations per message).

    python benches/allocations.py [--messages 100000] [--json results/allocations.json]

Two measures, both on ``null://`` so that only producerkit's own code allocates:

1. **Blocks per message in flight.** Acks are held back while ``--messages`` keyed nonblocking
   messages are produced, so everything a message keeps alive until its ack is still live; the
   tracemalloc snapshot diff, grouped by file, divided by the count, is what each message costs
   while in flight (the values and keys are the caller's, created before the snapshot).
2. **Growth after warm-up.** One million messages through the normal instant-ack path between
   two snapshots: the difference must be ~0 bytes per message (no leak, no unbounded cache).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tracemalloc
from pathlib import Path
from typing import Any

import attrs

import producerkit as pk
from producerkit._record import Record
from producerkit.backends.null import NULL, NullConnection


class HeldNullConnection(NullConnection):
    """null:// that keeps acks back until released (measurement only)."""

    held: list[Record]

    def send(self, record: Record) -> None:
        self.held.append(record)

    def release(self) -> None:
        for offset, record in enumerate(self.held):
            self.reports.acked(record, offset)
        self.held.clear()


async def in_flight_blocks(count: int) -> dict[str, Any]:
    keys = [b"user-%d" % (i % 10_000) for i in range(count)]
    value = b"x" * 512
    producer = pk.Producer("null://?partitions=12", topic="alloc", max_in_flight_messages=count + 1)
    # Before start(): the producer builds its connections from the spec when it starts.
    producer._spec = attrs.evolve(NULL, connection=HeldNullConnection)
    async with producer:
        backend = producer.backend
        held: list[Record] = []
        backend.held = held  # type: ignore[attr-defined]
        held.extend([None] * count)  # type: ignore[list-item]  # the list's own growth is not ours
        held.clear()
        for key in keys[:1000]:  # warm the dicts and caches
            await producer.produce(value, key=key, nonblocking=True)
        backend.release()  # type: ignore[attr-defined]
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        for key in keys:
            await producer.produce(value, key=key, nonblocking=True)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        backend.release()  # type: ignore[attr-defined]
    by_file: dict[str, float] = {}
    total = 0
    for stat in after.compare_to(before, "filename"):
        if stat.count_diff > 0:
            name = stat.traceback[0].filename.rsplit("/", 2)[-1]
            by_file[name] = round(stat.count_diff / count, 3)
            total += stat.count_diff
    return {"messages": count, "blocks_per_message": round(total / count, 3), "by_file": by_file}


async def growth_after_warmup(count: int) -> dict[str, Any]:
    value = b"x" * 512
    keys = [b"user-%d" % (i % 10_000) for i in range(10_000)]
    async with pk.Producer(
        "null://?partitions=12", topic="alloc", max_in_flight_messages=10_000
    ) as producer:
        for i in range(100_000):
            await producer.produce(value, key=keys[i % 10_000], nonblocking=True)
        tracemalloc.start(1)
        first = tracemalloc.take_snapshot()
        for i in range(count):
            await producer.produce(value, key=keys[i % 10_000], nonblocking=True)
        await producer.flush()
        second = tracemalloc.take_snapshot()
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in second.compare_to(first, "filename"))
    return {"messages": count, "bytes_grown": grown, "bytes_per_message": grown / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--growth-messages", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, default=Path("results/allocations.json"))
    args = parser.parse_args(argv)
    held = asyncio.run(in_flight_blocks(args.messages))
    print(f"blocks alive per message in flight: {held['blocks_per_message']}")
    for name, blocks in sorted(held["by_file"].items(), key=lambda item: -item[1]):
        print(f"  {name:<28} {blocks}")
    growth = asyncio.run(growth_after_warmup(args.growth_messages))
    print(
        f"growth over {growth['messages']:,} messages after warm-up: {growth['bytes_grown']:,} "
        f"bytes ({growth['bytes_per_message']:.4f} bytes/message)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"in_flight": held, "growth": growth}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
