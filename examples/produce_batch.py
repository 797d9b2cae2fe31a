"""produce_batch: many messages in one call, from lists or from an Arrow table.

    python examples/produce_batch.py
    PRODUCERKIT_URL=kafka://127.0.0.1:9092 python examples/produce_batch.py
    PRODUCERKIT_URL='jetstream://127.0.0.1:4222?create_stream=true' python examples/produce_batch.py

``produce_batch(values, keys=..., headers=..., msg_ids=..., ...)`` does what as many
``produce(..., nonblocking=True)`` calls would (the same window, serializers and outcomes) at a
fraction of their cost. Each argument is a column, one item per message: a list, a tuple or an
Arrow array (string or binary). The Arrow part needs pyarrow (``pip install pyarrow``).
"""

from __future__ import annotations

import asyncio
import os

import pyarrow as pa

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "memory://produce-batch"


async def main() -> None:
    async with pk.Producer(URL, topic="orders") as producer:
        # From lists.
        values = [b'{"order": %d}' % i for i in range(10_000)]
        keys = [b"user-%d" % (i % 100) for i in range(10_000)]
        await producer.produce_batch(values, keys=keys)

        # From an Arrow table: its columns as they are (string columns are sent as UTF-8).
        table = pa.table(
            {
                "user": [f"user-{i % 100}" for i in range(10_000)],
                "payload": [f'{{"order": {i}}}'.encode() for i in range(10_000, 20_000)],
            }
        )
        await producer.produce_batch(table["payload"], keys=table["user"])

        await producer.flush()  # every message acked, or raises pk.ProduceError
        print(producer.stats)


if __name__ == "__main__":
    asyncio.run(main())
