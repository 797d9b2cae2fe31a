"""A script without asyncio: SyncProducer, from any thread.

    python examples/sync_script.py
    PRODUCERKIT_URL=kafka://127.0.0.1:9092 python examples/sync_script.py
    PRODUCERKIT_URL='jetstream://127.0.0.1:4222?create_stream=true' python examples/sync_script.py

``SyncProducer`` runs a Producer on an event loop in a thread of its own: each method blocks
until done, and any thread may call them (here, four at once).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "memory://sync-script"


def main() -> int:
    orders = [{"id": f"o-{i}", "user": f"user-{i % 100}", "total": i} for i in range(10_000)]
    with pk.SyncProducer(URL, topic="orders", value_serializer="json") as producer:
        delivery = producer.produce(orders[0], key=orders[0]["user"])  # waits for the ack
        print("first order stored at", delivery)

        def publish(chunk: list[dict[str, object]]) -> None:
            for order in chunk:  # returns once handed off; the acks are counted
                producer.produce(order, key=str(order["user"]), nonblocking=True)

        with ThreadPoolExecutor(4) as threads:
            list(threads.map(publish, [orders[1 + i :: 4] for i in range(4)]))
        try:
            producer.flush()  # waits for every ack
        except pk.ProduceError as error:  # .failures: each failed message, to send again
            print(f"{len(error.failures)} failed; first: {error.failures[0].exception}")
            return 1
        print(producer.stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
