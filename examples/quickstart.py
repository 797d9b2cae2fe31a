"""producerkit in one screen, with no broker: ``python examples/quickstart.py``.

``memory://`` is a real backend that keeps every record in memory, so this runs anywhere. Give
it a broker's URL instead and nothing else changes (``producerkit dev`` starts both brokers)::

    PRODUCERKIT_URL=kafka://127.0.0.1:9092 python examples/quickstart.py
    PRODUCERKIT_URL='jetstream://127.0.0.1:4222?create_stream=true' python examples/quickstart.py

JetStream stores a subject only in a stream that takes it: ``create_stream=true`` (a backend
option, here in the URL's query) creates one for ``orders`` if none does. Without it, and
without a stream of your own, every message fails with "no JetStream stream stores subject".
"""

from __future__ import annotations

import asyncio
import os

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "memory://quickstart?partitions=4"


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
