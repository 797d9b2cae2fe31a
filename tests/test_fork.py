"""A producer used in a forked child (gunicorn --preload, multiprocessing's fork start method,
Celery prefork) raises ProducerForked at once: it never waits out a deadline for a loop thread
that the child does not have, and never writes to the parent's connections. The parent's
producer produces on."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pytest
from conftest import BackendCase

import producerkit as pk

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork() here")


def _in_child(sync: pk.SyncProducer) -> dict[str, Any]:
    """What the child sees: each call's error type and how long it took."""
    seen: dict[str, Any] = {}
    calls = {
        "produce": lambda: sync.produce(b"from the child", key=b"k"),
        "nonblocking": lambda: sync.produce(b"from the child", nonblocking=True),
        "flush": sync.flush,
        "close": sync.close,
    }
    for name, call in calls.items():
        started = time.monotonic()
        try:
            call()
            seen[name] = ["returned", time.monotonic() - started]
        except BaseException as exc:
            seen[name] = [type(exc).__name__, time.monotonic() - started]
    return seen


def _fork_and_use(sync: pk.SyncProducer) -> dict[str, Any]:
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(reading)
            os.write(writing, json.dumps(_in_child(sync)).encode())
        finally:
            os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        answer = json.loads(pipe.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return answer


def test_a_forked_child_gets_a_typed_error_at_once_and_the_parent_goes_on(
    backend: BackendCase, topic: str
) -> None:
    with pk.SyncProducer(backend.url, topic=topic, timeout=5.0, **backend.options) as sync:
        sync.produce(b"before the fork", key=b"k")
        sync.produce(b"in flight at the fork", key=b"k", nonblocking=True)
        seen = _fork_and_use(sync)
        for call, (error, seconds) in seen.items():
            assert error == "ProducerForked", (call, seen)
            assert seconds < 2.0, (call, seen)
        delivery = sync.produce(b"after the fork", key=b"k")
        assert delivery is not None
    stats = sync.stats
    assert (stats.produced, stats.acked, stats.failed) == (3, 3, 0)


@pytest.mark.anyio
async def test_an_async_producer_in_a_forked_child_raises_too(
    backend: BackendCase, topic: str
) -> None:
    async with pk.Producer(backend.url, topic=topic, timeout=5.0, **backend.options) as producer:
        await producer.produce(b"before")
        reading, writing = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                producer.purge  # noqa: B018 - attributes read fine in the child
                try:
                    await producer.produce(b"in the child")
                except pk.ProducerForked:
                    code = 0
            finally:
                os.write(writing, b"%d" % code)
                os._exit(0)
        os.close(writing)
        with os.fdopen(reading, "rb") as pipe:
            assert pipe.read() == b"0"
        os.waitpid(pid, 0)
        await producer.produce(b"after")
    assert producer.stats.acked == 2


def test_producerforked_is_a_producerclosed() -> None:
    assert issubclass(pk.ProducerForked, pk.ProducerClosed)
    assert "fork" in sys.modules["producerkit.errors"].__doc__
