"""The brokers a bench runs against: those ``--kafka-url`` and ``--nats-url`` name (the test
suite's session brokers, tests/test_benches.py, or any other), else one started here from the
installed wheels for the run (Tansu, nats-server with JetStream).

A broker started here has a process id, so a bench can read its CPU; one named by URL has none
(``Broker.pid`` is None) and such a bench reports its CPU as not measured.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

import attrs

from producerkit.testing.brokers import start_kafka, start_nats


@attrs.frozen
class Broker:
    """A broker's ``host_port``, and its process id where it was started here."""

    host_port: str
    pid: int | None = None

    @property
    def kafka_url(self) -> str:
        return f"kafka://{self.host_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://{self.host_port}"

    @property
    def jetstream_url(self) -> str:
        return f"jetstream://{self.host_port}"


def add_broker_flags(
    parser: argparse.ArgumentParser, kafka: bool = True, nats: bool = True
) -> None:
    """``--kafka-url`` and/or ``--nats-url``: run against that broker instead of starting one."""
    if kafka:
        parser.add_argument(
            "--kafka-url",
            metavar="URL",
            help="run against this Kafka broker (kafka://HOST:PORT) instead of starting Tansu "
            "here (a topic per run is created on it; its CPU is not measured)",
        )
    if nats:
        parser.add_argument(
            "--nats-url",
            metavar="URL",
            help="run against this nats-server with JetStream (nats://HOST:PORT) instead of "
            "starting one here (its CPU is not measured)",
        )


@contextlib.contextmanager
def kafka(url: str | None, **start: Any) -> Iterator[Broker]:
    """The Kafka broker at ``url``, or Tansu started for the block with ``start_kafka(**start)``
    (``storage="null://sink"``, ...)."""
    if url:
        yield Broker(_host_port(url))
        return
    with start_kafka(**start) as broker:
        yield Broker(broker.host_port, broker.process.pid if broker.process else None)


@contextlib.contextmanager
def nats(url: str | None, **start: Any) -> Iterator[Broker]:
    """The nats-server at ``url``, or one with JetStream started for the block."""
    if url:
        yield Broker(_host_port(url))
        return
    with start_nats(**{"jetstream": True, **start}) as broker:
        yield Broker(broker.host_port, broker.process.pid if broker.process else None)


def _host_port(url: str) -> str:
    return url.partition("://")[2] or url
