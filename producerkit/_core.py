"""The core's hot path, chosen once, here: the C implementation (``_speedups``) where it was
built, else the Python one (``_core_py``), which reads as what the C one does.

Both have the same names and signatures: ``WindowCore`` (the ledger and the in-flight bound),
``Router``, ``Admission`` (a plain message or chunk: checked, routed, admitted, sent),
``pop_run``, ``tell_run`` and ``new_delivery`` (settling), ``exact_bytes`` (serializers),
``DECLINED``. A producer takes the
:class:`Core` that :func:`active` names when it is made: the C one where it was built and
``PRODUCERKIT_NO_SPEEDUPS`` is not set. Tests run the other with :func:`using`, so one run covers
both, door included: ``Producer.produce`` is the C door around the Python door around the
method (:func:`produce_door`), and each door takes the messages of a producer whose Admission is
of its own implementation. ``ProducerCore``, the base class that holds a running producer's
Admission, is the C one where it was built (a field the C door reads without a lookup).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar, cast

import attrs

from producerkit import _core_py
from producerkit._fast import speedups
from producerkit._types import Delivery


class Core(NamedTuple):
    """One implementation of the core."""

    name: str
    WindowCore: Any
    Router: Any
    Admission: Any
    pop_run: Callable[..., Any]
    tell_run: Callable[..., int]
    new_delivery: Callable[..., Delivery]
    #: ``exact_bytes(function)``: ``function`` whose bytes results are copied to their exact
    #: size (C: an orjson result keeps no 1 KiB buffer until its ack); Python: ``function``.
    exact_bytes: Callable[[Callable[[Any], bytes]], Callable[[Any], bytes]]


def _as_is(function: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    return function


PYTHON = Core(
    "python",
    _core_py.WindowCore,
    _core_py.Router,
    _core_py.Admission,
    _core_py.pop_run,
    _core_py.tell_run,
    _core_py.new_delivery,
    _as_is,
)

C: Core | None = None
if speedups is not None:
    # A Delivery's fields are plain slots: the C maker fills them without running __init__.
    _delivery_slots = tuple(vars(Delivery)[field.name] for field in attrs.fields(Delivery))
    C = Core(
        "c",
        speedups.WindowCore,
        speedups.Router,
        speedups.Admission,
        speedups.pop_run,
        speedups.tell_run,
        speedups.SlotsMaker(Delivery, _delivery_slots),
        speedups.ExactBytes,
    )

#: The implementations this installation has: Python, and C where it was built.
IMPLEMENTATIONS: tuple[Core, ...] = (PYTHON,) if C is None else (PYTHON, C)

#: Where ``produce()`` finds a running producer's Admission (see ``_core_py.ProducerCore``).
ProducerCore: Any = _core_py.ProducerCore if speedups is None else speedups.ProducerCore
#: The outermost door (see :func:`produce_door`).
ProduceDoor: Any = _core_py.ProduceDoor if speedups is None else speedups.ProduceDoor
#: What an Admission returns for a message it leaves to the checked path (both: NotImplemented).
DECLINED = _core_py.DECLINED

_active = C if C is not None else PYTHON

_Method = TypeVar("_Method", bound=Callable[..., Any])


def produce_door(produce: _Method) -> _Method:
    """``produce`` behind the door of each implementation, Python's inside C's, each carrying
    its name, docstring and signature: a plain nonblocking message of a running producer goes
    through its own core's Admission (see ``_core_py.ProduceDoor``), everything else to
    ``produce``."""
    door: Any = functools.update_wrapper(_core_py.ProduceDoor(produce), produce)
    if speedups is not None:
        door = functools.update_wrapper(speedups.ProduceDoor(door), produce)
    return cast(_Method, door)


def active() -> Core:
    """The core a producer made now takes."""
    return _active


@contextlib.contextmanager
def using(core: Core) -> Iterator[Core]:
    """Producers made inside the block take ``core`` (for tests that run both)."""
    global _active
    before, _active = _active, core
    try:
        yield core
    finally:
        _active = before
