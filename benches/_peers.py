"""One runner of ``benches/throughput.py --only peers`` in a process of its own, and the clock
every runner there reads: its rate, its client CPU and the broker's, over the timed part only.

    python benches/_peers.py RUNNER --url URL --topic TOPIC --messages N [--broker-pid PID]

prints one JSON line: ``{"runner", "messages", "seconds", "rate", "client_cpu", "broker_cpu"}``
(CPU in seconds; ``broker_cpu`` is null without ``--broker-pid``). The client's CPU is this
process's (``time.process_time()``: every thread of it, librdkafka's included), the broker's is
its process's user + system time (psutil), both read when the runner's clock starts and stops,
so neither start-up, imports nor connecting counts. The Java producer's rows run a JVM from
here (``_java.py``), which times its own pass: its wall and CPU seconds are the JVM's
(``Clock.stop(measured=...)``), the broker's CPU is read here around it.

``RUNNER`` is one of ``throughput.PEER_RUNNERS`` (producerkit and the peers that install on
this interpreter, imported from throughput.py) or of :data:`FAST_PUBLISHERS`: the JetStream fast
publishers whose packages need Python 3.13 or newer, which this file runs itself with nothing
but those packages (and psutil) installed: run it with the interpreter of a 3.13 venv that has
them (docs/performance.md, "The peers that need Python 3.13").

This file imports nothing of producerkit at module level, so that it runs there too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar


class Clock:
    """The timed part of one run: ``clock = Clock()`` where the run's clock starts,
    ``clock.stop(count)`` (the rate) where it ends; the figures stay in ``Clock.last``."""

    #: The broker's process id, set by whoever knows it (``--broker-pid``): None, not measured.
    broker_pid: ClassVar[int | None] = None
    #: The last stopped clock's figures: ``seconds``, ``client_cpu``, ``broker_cpu``, ``rate``.
    last: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        self._broker = _broker_process(Clock.broker_pid)
        self._broker_cpu = _cpu_of(self._broker)
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def stop(self, count: int, *, measured: tuple[float, float] | None = None) -> int:
        """The rate of ``count`` messages since the clock started; the figures into ``last``.

        ``measured``: the wall and CPU seconds of a client in a process of its own that timed
        itself (the Java producer's JVM, ``_java.py``), taken instead of this process's; the
        broker's CPU is still read here, from the clock's start to this call."""
        wall = time.perf_counter() - self._wall
        cpu = time.process_time() - self._cpu
        broker = _cpu_of(self._broker)
        if measured is not None:
            wall, cpu = measured
        rate = round(count / wall)
        Clock.last = {
            "messages": count,
            "seconds": wall,
            "rate": rate,
            "client_cpu": cpu,
            "broker_cpu": None if broker is None else broker - (self._broker_cpu or 0.0),
        }
        return rate


def _broker_process(pid: int | None) -> Any:
    if pid is None:
        return None
    import psutil

    return psutil.Process(pid)


def _cpu_of(process: Any) -> float | None:
    if process is None:
        return None
    times = process.cpu_times()
    return float(times.user + times.system)


# --------------------------------------------------------------------------- Python 3.13+ peers

#: The value every runner sends (``throughput.VALUE``); NATS has no key field, so these runners
#: send values only, as the nats-py peer does.
VALUE = b"x" * 512


async def nats_jetstream_extra(url: str, subject: str, count: int) -> int:
    """nats-jetstream-extra's ``FastPublisher`` at its defaults (a flow of 100, 2 ack windows
    outstanding): one fast batch of ``count`` messages, ``add`` each, ``commit`` the last."""
    from nats.client import connect
    from nats.jetstream import new as jetstream
    from nats.jetstream_extra import fast_publish

    client = await connect(_nats(url))
    try:
        publisher = fast_publish(jetstream(client))
        clock = Clock()
        add = publisher.add
        for _ in range(count - 1):
            await add(subject, VALUE)
        ack = await publisher.commit(subject, VALUE)
        rate = clock.stop(count)
        assert ack.batch_size in (None, count), ack
    finally:
        await client.close()
    return rate


async def natsio_jetstream_batch(url: str, subject: str, count: int) -> int:
    """natsio with natsio-jetstream-batch's ``fast_publisher`` at its defaults (a flow of 100, 2
    ack windows outstanding): one fast batch of ``count`` messages, ``add`` each, ``commit``
    the last."""
    import natsio
    from natsio.jetstream_batch import fast_publisher

    client = await natsio.connect(_nats(url))
    try:
        async with fast_publisher(client.jetstream()) as publisher:
            clock = Clock()
            add = publisher.add
            for _ in range(count - 1):
                await add(subject, VALUE)
            ack = await publisher.commit(subject, VALUE)
            rate = clock.stop(count)
        assert ack.size == count, ack
    finally:
        await client.close()
    return rate


#: The runners this file runs itself, by name, and the package each needs.
FAST_PUBLISHERS: dict[str, tuple[Callable[[str, str, int], Awaitable[int]], str]] = {
    "nats-jetstream-extra": (nats_jetstream_extra, "nats-jetstream-extra"),
    "natsio-jetstream-batch": (natsio_jetstream_batch, "natsio-jetstream-batch"),
}


def _nats(url: str) -> str:
    return "nats://" + url.partition("://")[2]


# --------------------------------------------------------------------------- the child's main


def run(runner: str, url: str, topic: str, count: int) -> dict[str, Any]:
    """Run ``runner`` once here; its clock's figures."""
    Clock.last = {}
    if runner in FAST_PUBLISHERS:
        asyncio.run(FAST_PUBLISHERS[runner][0](url, topic, count))
    else:
        from throughput import PEER_RUNNERS, make_messages

        asyncio.run(PEER_RUNNERS[runner](url, topic, make_messages(count, True)))
    if not Clock.last:
        raise RuntimeError(f"{runner} did not stop its clock")
    return {"runner": runner, **Clock.last}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runner")
    parser.add_argument("--url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--broker-pid", type=int)
    args = parser.parse_args(argv)
    Clock.broker_pid = args.broker_pid
    print(json.dumps(run(args.runner, args.url, args.topic, args.messages)), flush=True)
    return 0


if __name__ == "__main__":
    # As the module throughput.py imports (its runners stop that module's Clock, not __main__'s).
    import _peers

    raise SystemExit(_peers.main())
