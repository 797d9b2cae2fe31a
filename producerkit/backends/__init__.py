"""Backends by URL scheme, imported on first use so that ``import producerkit`` stays light.

``spec_for(scheme)`` returns the backend's :class:`~producerkit.backends.base.BackendSpec`; the
schemes, their modules and the extras that install their client libraries are listed once, in
``producerkit._schemes``.
"""

from __future__ import annotations

import importlib

from producerkit._schemes import SCHEMES
from producerkit.backends.base import BackendSpec, Connection, Reports
from producerkit.errors import (
    ConfigurationError,
    IncompatibleClientError,
    MissingDependencyError,
)

__all__ = ["BackendSpec", "Connection", "Reports", "spec_for"]

_loaded: dict[str, BackendSpec] = {}


def spec_for(scheme: str) -> BackendSpec:
    """The spec of the backend serving ``scheme``; ConfigurationError for an unknown scheme,
    MissingDependencyError if its client library is not installed, IncompatibleClientError if
    it is installed but cannot be imported as producerkit expects."""
    cached = _loaded.get(scheme)
    if cached is not None:
        return cached
    entry = SCHEMES.get(scheme)
    if entry is None:
        raise ConfigurationError(
            f"unknown backend {scheme!r}: use one of {', '.join(sorted(SCHEMES))}"
        )
    try:
        module = importlib.import_module(f"producerkit.backends.{entry.module}")
    except ImportError as exc:
        from producerkit.backends import _clients

        version = _clients.installed_version(entry.client) if entry.client else None
        if entry.client is not None and version is not None:
            raise IncompatibleClientError(
                entry.client, version, _clients.supported_range(entry.client)
            ) from exc
        raise MissingDependencyError(
            f"the {scheme}:// backend needs {exc.name or 'a package'} which is not installed: "
            f'run  pip install "producerkit[{entry.extra}]"'
        ) from exc
    spec: BackendSpec = getattr(module, entry.spec)
    _loaded[scheme] = spec
    return spec
