"""The partition counts of the topics a producer has produced to, each learned once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final

from producerkit._message import MessageRules
from producerkit.backends.base import Connection
from producerkit.errors import ProduceTimeout

#: What :attr:`Topics.counts` gives for a topic not learned yet (None means unpartitioned).
UNKNOWN: Final = -1


class Topics:
    """``counts``: topic -> partition count (None: unpartitioned), for the topics learned so far.

    The first message to a topic has its name checked and its count learned from the
    connections (:meth:`learn`); a count a connection reports changed is forgotten and learned
    again by the next message (:meth:`forget`).
    """

    __slots__ = ("_rules", "_tasks", "_timeout", "connections", "counts")

    def __init__(self, rules: MessageRules, timeout: float) -> None:
        self._rules = rules
        self._timeout = timeout
        self.counts: dict[str, int | None] = {}
        self.connections: Sequence[Connection] = ()
        self._tasks: dict[str, asyncio.Task[int | None]] = {}

    async def learn(self, topic: str) -> int | None:
        """The topic's partition count, learned once (concurrent callers share one question);
        MessageError for a topic this backend refuses, ProduceTimeout without an answer."""
        count = self.counts.get(topic, UNKNOWN)
        if count != UNKNOWN:
            return count
        self._rules.check_topic(topic)
        task = self._tasks.get(topic)
        if task is None:
            task = asyncio.ensure_future(self._ask_every_connection(topic))
            self._tasks[topic] = task
        try:
            count = await asyncio.wait_for(asyncio.shield(task), self._timeout)
        except TimeoutError as exc:
            self._tasks.pop(topic, None)
            raise ProduceTimeout(
                f"no metadata for topic {topic!r} within {self._timeout}s"
            ) from exc
        except BaseException:
            if task.done():
                self._tasks.pop(topic, None)
            raise
        self._tasks.pop(topic, None)
        self.counts[topic] = count
        return count

    async def _ask_every_connection(self, topic: str) -> int | None:
        """The first connection prepares the topic (creating a stream, say) and gives its
        partition count; then every other connection learns the topic too, so that each one
        watches its metadata and reports a partition count that changes."""
        first, *others = self.connections
        count = await first.prepare_topic(topic)
        await asyncio.gather(*(connection.prepare_topic(topic) for connection in others))
        return count

    def forget(self, topic: str) -> None:
        """The topic's partition count may have changed: learn it again."""
        self.counts.pop(topic, None)

    def cancel(self) -> None:
        for task in self._tasks.values():
            task.cancel()
