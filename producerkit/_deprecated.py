"""Old names kept importable for one release, with a DeprecationWarning naming the new one:
renamed attributes (:func:`renamed`) and moved modules (:func:`moved_module`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


def renamed(module: str, names: dict[str, tuple[str, Callable[[], Any]]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names``: old name -> (new name, getter of the object)."""

    def __getattr__(name: str) -> Any:
        entry = names.get(name)
        if entry is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_name, get = entry
        warnings.warn(
            f"{module}.{name} is deprecated: use {new_name}", DeprecationWarning, stacklevel=2
        )
        return get()

    return __getattr__


def moved_module(old: str, new: str) -> None:
    """Warn that module ``old`` is now ``new``: called in the body of ``old``, so on its import.

    ``stacklevel=3`` names the line importing ``old``: the warnings module skips the import
    machinery's frames in between.
    """
    warnings.warn(f"{old} is deprecated: import {new}", DeprecationWarning, stacklevel=3)
