"""SyncProducer: the Producer's API, blocking, for scripts, threads and Spark executors.

It owns an event loop in a daemon thread and runs each call there, so it works the same whether
or not the calling thread already runs a loop (notebooks), and any number of threads may share
one. A blocking call waits on the loop's result for at most the producer's timeout plus a margin,
so a stuck loop can never hang the caller forever.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from producerkit._producer import Producer
from producerkit._types import Delivery, Stats
from producerkit.errors import ProducerClosed, ProduceTimeout

__all__ = ["SyncProducer"]

T = TypeVar("T")

#: Seconds beyond the producer's own deadlines that a blocking call waits for the loop thread.
_LOOP_MARGIN = 5.0


class SyncProducer:
    """Blocking twin of :class:`~producerkit.Producer`; takes the same arguments.

    ``with SyncProducer(url, topic=...) as producer: producer.produce(b"v", nonblocking=True)``
    """

    def __init__(self, url: str, **kwargs: Any) -> None:
        self._producer = Producer(url, **kwargs)  # validates everything before a thread starts
        self._timeout: float = self._producer._timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="producerkit-loop", daemon=True
        )
        self._thread.start()
        self._closed = False

    def _run(self, coroutine: Coroutine[Any, Any, T], wait: float | None = None) -> T:
        if self._closed:
            coroutine.close()
            raise ProducerClosed("produce() after close(): create a new SyncProducer")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        limit = (wait if wait is not None else self._timeout) + _LOOP_MARGIN
        try:
            return future.result(limit)
        except TimeoutError as exc:
            future.cancel()
            raise ProduceTimeout(f"no answer from the producer's loop within {limit}s") from exc

    def start(self) -> None:
        self._run(self._producer.start())

    def produce(
        self,
        value: bytes | bytearray | memoryview | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        topic: str | None = None,
        partition: int | None = None,
        nonblocking: bool = False,
        msg_id: str | None = None,
    ) -> Delivery | None:
        """Same as :meth:`Producer.produce`, blocking the calling thread."""
        return self._run(
            self._producer.produce(
                value,
                key=key,
                headers=headers,
                topic=topic,
                partition=partition,
                nonblocking=nonblocking,
                msg_id=msg_id,
            ),
            # a full window may wait for a whole timeout before the message itself is sent
            wait=None if nonblocking else 2 * self._timeout,
        )

    def flush(self, timeout: float | None = None) -> None:
        self._run(self._producer.flush(timeout), wait=timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush and close, then stop the loop thread. Raises ProduceError if anything failed."""
        if self._closed:
            return
        try:
            self._run(self._producer.close(timeout), wait=timeout)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_LOOP_MARGIN)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncProducer:
        self.start()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:
            exc.add_note(f"producerkit: also, on close: {close_error}")

    @property
    def stats(self) -> Stats:
        return self._producer.stats

    @property
    def producer(self) -> Producer:
        """The asynchronous producer underneath (its methods must run on this producer's loop)."""
        return self._producer

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def __repr__(self) -> str:
        return f"<Sync{repr(self._producer)[1:]}"
