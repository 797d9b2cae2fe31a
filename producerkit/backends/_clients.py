"""The client libraries: the versions producerkit is proven with, and which path a connection
takes through its client.

A client older than its range fails ``start()`` with :class:`IncompatibleClientError`: its public
API differs from what the backend calls (nats-py < 2.16 has no ``skip_subject_validation``;
aiokafka < 0.13 builds requests differently). A client newer than its range is allowed: its
adapter probes the internals the fast path needs and falls back to the public API if they are not
as expected. The ranges are what ``scripts/client_matrix.py`` passed (docs/compatibility.md).

Each client has an adapter module (``_aiokafka_compat``, ``_natspy_compat``) holding every access
to its private internals. A connection takes the adapter's **fast** path when the probe finds
those internals as expected, else the client's **public** API; ``PRODUCERKIT_CLIENT_PATH=public``
(or ``fast``) forces one. Which path, and why, is logged once per process and reason.
"""

from __future__ import annotations

import logging
import os
import re
from importlib import metadata
from typing import Final

from producerkit.errors import ConfigurationError, IncompatibleClientError

logger = logging.getLogger("producerkit.clients")

FAST: Final = "fast"
PUBLIC: Final = "public"
#: The environment variable that forces a path (``public`` or ``fast``) for every client.
PATH_VARIABLE: Final = "PRODUCERKIT_CLIENT_PATH"

#: distribution -> (oldest supported, first unsupported newer release), as in pyproject.toml.
SUPPORTED: dict[str, tuple[str, str]] = {
    "aiokafka": ("0.13", "0.15"),
    "nats-py": ("2.16", "2.17"),
}


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def version_tuple(version: str) -> tuple[int, ...]:
    """The leading numeric release of a version string: ``"0.14.0rc1"`` -> ``(0, 14, 0)``."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in numbers[0].split(".")) if numbers else ()


def supported_range(distribution: str) -> str:
    oldest, too_new = SUPPORTED[distribution]
    return f">={oldest},<{too_new}"


def is_newer_than_tested(distribution: str, version: str) -> bool:
    return version_tuple(version) >= version_tuple(SUPPORTED[distribution][1])


def check_client(distribution: str) -> str:
    """The installed version of ``distribution``; IncompatibleClientError if it is older than the
    supported range (or its version cannot be read)."""
    version = installed_version(distribution)
    oldest = SUPPORTED[distribution][0]
    if version is None or version_tuple(version) < version_tuple(oldest):
        raise IncompatibleClientError(distribution, version, supported_range(distribution))
    return version


def forced_path() -> str | None:
    """The path ``PRODUCERKIT_CLIENT_PATH`` asks for, or None; ConfigurationError if unknown."""
    wanted = os.environ.get(PATH_VARIABLE, "").strip().lower()
    if not wanted:
        return None
    if wanted not in (FAST, PUBLIC):
        raise ConfigurationError(f"{PATH_VARIABLE} must be 'fast' or 'public', got {wanted!r}")
    return wanted


def resolve_path(distribution: str, version: str, problem: str | None) -> tuple[str, str]:
    """``(path, why)`` for a client whose probe found ``problem`` (None: internals as expected),
    with ``PRODUCERKIT_CLIENT_PATH`` applied; logged once per process and reason."""
    forced = forced_path()
    if forced == PUBLIC:
        path, reason = PUBLIC, f"{PATH_VARIABLE}=public"
    elif problem is None:
        newer = is_newer_than_tested(distribution, version)
        note = " (newer than tested; its internals probed as expected)" if newer else ""
        path, reason = FAST, f"{distribution} {version}{note}"
    elif forced == FAST:
        raise ConfigurationError(f"{PATH_VARIABLE}=fast, but {distribution} {version}: {problem}")
    else:
        path, reason = PUBLIC, f"{distribution} {version}: {problem}"
    if (distribution, path, reason) not in _logged:
        _logged.add((distribution, path, reason))
        quiet = path == FAST or forced == PUBLIC
        logger.log(
            logging.INFO if quiet else logging.WARNING,
            "%s: the %s path (%s)",
            distribution,
            path,
            reason,
        )
    return path, reason


_logged: set[tuple[str, str, str]] = set()
