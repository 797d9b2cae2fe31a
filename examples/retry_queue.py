"""on_delivery with a retry queue: a message that failed for a reason that may pass (no answer
in time, a lost connection) is produced again after a pause, up to 3 attempts; any other
failure, and the last attempt's, is a dead letter.

    python examples/retry_queue.py
    PRODUCERKIT_URL=kafka://127.0.0.1:9092 python examples/retry_queue.py
    PRODUCERKIT_URL='jetstream://127.0.0.1:4222?create_stream=true' python examples/retry_queue.py

``on_delivery(result, context)`` is called once per message, on the event loop, with its
Delivery or its Failure and the ``context`` it was produced with (here its attempt number); it
only queues. A failure may have been stored anyway (``failure.possibly_stored``: its ack was
lost), so a retry can store it twice on Kafka; on JetStream the ``msg_id`` makes the stream
drop the second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import producerkit as pk

URL = os.environ.get("PRODUCERKIT_URL") or "memory://retry-queue"
RETRIABLE = (pk.ProduceTimeout, pk.BrokerUnavailable)


class RetryQueue:
    """The ``on_delivery`` callback: counts the acked, queues the failures worth another try."""

    def __init__(self, attempts: int = 3, pause: float = 0.5) -> None:
        self.attempts, self.pause = attempts, pause
        self.queued: list[tuple[pk.Failure, int]] = []
        self.dead: list[pk.Failure] = []
        self.acked = self.retried = 0

    def __call__(self, result: pk.Delivery | pk.Failure, attempt: int) -> None:
        if isinstance(result, pk.Delivery):
            self.acked += 1
        elif isinstance(result.exception, RETRIABLE) and attempt < self.attempts:
            self.queued.append((result, attempt + 1))
        else:
            self.dead.append(result)

    async def drain(self, producer: pk.Producer) -> None:
        """Wait for every outcome, then produce the queued messages again, round after round
        (each after a longer pause), until nothing is queued."""
        pause = self.pause
        while True:
            with contextlib.suppress(pk.ProduceError):  # each failure already reached __call__
                await producer.flush()
            if not self.queued:
                return
            await asyncio.sleep(pause)
            pause *= 2
            queued, self.queued = self.queued, []
            for failure, attempt in queued:
                await producer.produce(
                    failure.value, **failure.retry_kwargs(), nonblocking=True, context=attempt
                )
            self.retried += len(queued)


async def main() -> RetryQueue:
    retries = RetryQueue()
    async with pk.Producer(URL, topic="orders", timeout=10, on_delivery=retries) as producer:
        for i in range(1_000):
            await producer.produce(
                b'{"order": %d}' % i,
                key=b"user-%d" % (i % 100),
                msg_id=f"order-{i}",  # JetStream stores one copy per msg_id
                nonblocking=True,
                context=1,  # the first attempt
            )
        await retries.drain(producer)
    print(f"{retries.acked} acked, {retries.retried} retried, {len(retries.dead)} dead letters")
    for failure in retries.dead:
        print("dead letter:", failure.value, failure.exception)
    return retries


if __name__ == "__main__":
    asyncio.run(main())
