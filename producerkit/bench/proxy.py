"""Deprecated: moved to :mod:`producerkit.testing.proxy`; this alias goes in the next release."""

from producerkit import _deprecated
from producerkit.testing.proxy import DelayProxy

__all__ = ["DelayProxy"]

_deprecated.moved_module("producerkit.bench.proxy", "producerkit.testing.proxy")
