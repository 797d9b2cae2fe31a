"""Atomic batches (JetStream): an order's events stored all together, or none of them.

    producerkit dev --detach
    PRODUCERKIT_URL=jetstream://127.0.0.1:4222 python examples/atomic_batch.py

Needs nats-server 2.12 or later (``producerkit dev`` runs one) and a stream that allows atomic
batches: ``create_stream=True, allow_atomic=True`` creates one so. The other backends refuse
``atomic_batch()`` with a ConfigurationError saying why; docs/jetstream.md has the limits.
"""

from __future__ import annotations

import asyncio
import os

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "jetstream://127.0.0.1:4222"


async def main() -> None:
    async with pk.Producer(
        URL, topic="sales", create_stream=True, allow_atomic=True, value_serializer="json"
    ) as producer:
        # Committed when the block ends: the three messages are stored together.
        async with producer.atomic_batch() as batch:
            await batch.produce({"order": 7, "total": 30}, topic="sales.7")
            await batch.produce({"order": 7, "line": 1, "sku": "A"}, topic="sales.7.lines")
            await batch.produce({"order": 7, "line": 2, "sku": "B"}, topic="sales.7.lines")
        print("order 7 stored whole:", producer.stats.acked, "messages acked")

        # A block that raises commits nothing: none of its messages is stored.
        try:
            async with producer.atomic_batch() as batch:
                await batch.produce({"order": 7, "refund": 30}, topic="sales.7.refunds")
                raise RuntimeError("the payment provider said no")
        except RuntimeError as error:
            print("refund not stored:", error)


if __name__ == "__main__":
    asyncio.run(main())
