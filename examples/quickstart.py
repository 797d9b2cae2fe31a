"""producerkit in one screen, with no broker: ``python examples/quickstart.py``.

``memory://`` is a real backend that keeps every record in memory, so this runs anywhere. Swap
the URL for ``kafka://127.0.0.1:9092`` or ``jetstream://127.0.0.1:4222`` (``producerkit dev``
starts both) and nothing else changes.
"""

from __future__ import annotations

import asyncio
import os

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL", "memory://quickstart?partitions=4")


async def main() -> None:
    failures: list[pk.Failure] = []
    async with pk.Producer(URL, topic="orders", on_error=failures.append) as producer:
        # Blocking: one round trip, and the broker's answer.
        delivery = await producer.produce(b'{"order": 1}', key=b"user-1")
        print("stored at", delivery)

        # Nonblocking: up to max_in_flight_messages in flight, outcomes counted.
        for i in range(10_000):
            await producer.produce(
                b'{"order": %d}' % i, key=b"user-%d" % (i % 100), nonblocking=True
            )
        await producer.flush()  # raises pk.ProduceError(.failures) if any failed
        print(producer.stats)
    assert not failures


if __name__ == "__main__":
    asyncio.run(main())
