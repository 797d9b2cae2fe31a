"""Backends by URL scheme, imported on first use so that ``import producerkit`` stays light."""

from __future__ import annotations

import importlib

from producerkit.backends.base import Backend, DeliverySink
from producerkit.errors import (
    ConfigurationError,
    IncompatibleClientError,
    MissingDependencyError,
)

__all__ = ["Backend", "DeliverySink", "load_backend"]

# scheme -> (module, class, the extra that installs its client library)
_BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "kafka": ("kafka", "KafkaBackend", "kafka"),
    "jetstream": ("nats", "JetStreamBackend", "nats"),
    "nats": ("nats", "NatsBackend", "nats"),
    "memory": ("memory", "MemoryBackend", None),
    "null": ("null", "NullBackend", None),
}
#: extra -> the client library it installs (a distribution name).
_CLIENTS = {"kafka": "aiokafka", "nats": "nats-py"}
_loaded: dict[str, type[Backend]] = {}


def load_backend(scheme: str) -> type[Backend]:
    cached = _loaded.get(scheme)
    if cached is not None:
        return cached
    try:
        module_name, class_name, extra = _BACKENDS[scheme]
    except KeyError:
        raise ConfigurationError(
            f"unknown backend {scheme!r}: use one of {', '.join(sorted(_BACKENDS))}"
        ) from None
    try:
        module = importlib.import_module(f"producerkit.backends.{module_name}")
    except ImportError as exc:
        # Installed but not importable as expected: a version producerkit does not support.
        from producerkit.backends import _clients

        distribution = _CLIENTS.get(extra or "")
        version = _clients.installed_version(distribution) if distribution else None
        if distribution is not None and version is not None:
            raise IncompatibleClientError(
                distribution, version, _clients.supported_range(distribution)
            ) from exc
        raise MissingDependencyError(
            f"the {scheme}:// backend needs {exc.name or 'a package'} which is not installed: "
            f'run  pip install "producerkit[{extra}]"'
        ) from exc
    cls: type[Backend] = getattr(module, class_name)
    _loaded[scheme] = cls
    return cls
