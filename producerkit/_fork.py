"""Producers in a process forked from the one that started them: retired at the fork.

A forked child inherits copies of its parent's producers, with the parent's sockets and without
its threads (a SyncProducer's loop thread is gone). Writing to those sockets would interleave
with the parent's own writes, and waiting on the missing thread would only end at a deadline.
:func:`watch` registers a started producer; in the child, right after ``fork()``, every one is
retired: nothing of it runs or writes again, and each later call raises
:class:`~producerkit.ProducerForked` at once. The parent's producers are not touched.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Protocol

from producerkit.errors import ProducerForked


class Forkable(Protocol):
    def retire_after_fork(self, parent: int) -> None:
        """In a forked child: stop for good, touching no connection (see the module)."""


_watched: weakref.WeakSet[Forkable] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def watch(producer: Forkable) -> None:
    """Retire ``producer`` in any child this process forks from now on."""
    global _hooked
    with _lock:
        _watched.add(producer)
        if not _hooked:
            os.register_at_fork(after_in_child=_retire_all)
            _hooked = True


def check(parent: int | None, what: str) -> None:
    """Raise ProducerForked if ``parent`` (the pid a retired ``what`` was started in) is set."""
    if parent is not None:
        raise ProducerForked(
            f"this {what} was started in process {parent}, the parent of this one "
            f"({os.getpid()}): its connections are the parent's; create a new {what} here"
        )


def _retire_all() -> None:
    parent = os.getppid()
    for producer in list(_watched):
        with contextlib.suppress(Exception):  # a child must survive its fork hook
            producer.retire_after_fork(parent)
    _watched.clear()
