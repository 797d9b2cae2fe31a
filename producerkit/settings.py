"""Producer settings from keyword overrides, the environment and a TOML file.

:func:`load` returns the keyword arguments of :class:`~producerkit.Producer`, so
``Producer(**settings.load())`` works in a script, and ``producerkit produce`` uses the same
function, so a deployment configured once is configured for both.

Precedence, highest first (a layer only supplies the settings it names):

1. keyword overrides passed to :func:`load` (the CLI passes its flags here; ``None`` means unset)
2. environment variables: ``PRODUCERKIT_URL`` and ``PRODUCERKIT_<SETTING>`` for every setting
   of :class:`~producerkit.ProducerOptions` that text can give (``PRODUCERKIT_TOPIC``,
   ``PRODUCERKIT_MAX_IN_FLIGHT_MESSAGES``, ``PRODUCERKIT_TIMEOUT``, ...: :data:`SETTINGS`); and a
   backend option ``NAME`` as ``PRODUCERKIT_OPTION_NAME`` (``PRODUCERKIT_OPTION_LINGER_MS=5``)
3. a TOML file: ``config=`` (the CLI's ``--config``), else ``$PRODUCERKIT_CONFIG``, else
   ``./producerkit.toml`` if it exists. Settings are top-level keys, backend options go in an
   ``[options]`` table::

       url = "kafka://127.0.0.1:9092"
       topic = "orders"
       max_in_flight_messages = 500

       [options]
       linger_ms = 5

4. the Producer's own defaults (not filled in here, so they stay documented in one place).

Backend options merge key by key over the layers: ``PRODUCERKIT_OPTION_ACKS=all`` changes
``acks`` and keeps the file's ``linger_ms``. Options from the environment are strings, exactly
like URL query parameters, and each backend converts and checks them.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from producerkit._options import configurable, convert_text
from producerkit.errors import ConfigurationError

__all__ = ["DEFAULT_CONFIG_FILE", "ENV_PREFIX", "SETTINGS", "find_config_file", "load"]

ENV_PREFIX: Final = "PRODUCERKIT_"
DEFAULT_CONFIG_FILE: Final = "producerkit.toml"

#: The Producer keyword arguments a configuration may set (``url`` and every setting of
#: ProducerOptions that text can give), with the type text converts to. Callables
#: (``on_error``, ``on_stats``, a partitioner function) only come from code.
SETTINGS: Final[Mapping[str, type]] = {
    "url": str,
    **{field.name: field.metadata["text"] for field in configurable()},
}

_OPTION_ENV_PREFIX: Final = ENV_PREFIX + "OPTION_"


def load(
    config: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    require_url: bool = True,
    **overrides: Any,
) -> dict[str, Any]:
    """Producer keyword arguments from ``overrides`` > environment > TOML file.

    Args:
        config: a TOML file to read; it must exist. Without it, ``$PRODUCERKIT_CONFIG`` (which
            must exist too) or ``./producerkit.toml`` (only if present).
        environ: the environment to read (default ``os.environ``); tests pass a dict.
        require_url: raise ConfigurationError when no layer gives a URL.
        **overrides: Producer settings or backend options; ``None`` values are ignored, so a
            CLI can pass every flag whether or not it was given.

    Returns:
        ``{"url": ..., "topic": ..., ..., <backend options>}``: pass it as
        ``Producer(**settings)``.
    """
    env = os.environ if environ is None else environ
    path = find_config_file(config, env)
    layers = [
        _from_toml(path) if path is not None else {},
        _from_environ(env),
        {name: value for name, value in overrides.items() if value is not None},
    ]
    merged: dict[str, Any] = {}
    for layer in layers:  # lowest precedence first; later layers overwrite, option by option
        merged.update(layer)
    if require_url and "url" not in merged:
        raise ConfigurationError(
            "no producer URL: pass --url on the command line (url= in Python), set "
            'PRODUCERKIT_URL, or put url = "..." in '
            f"{path or DEFAULT_CONFIG_FILE}"
        )
    return merged


def find_config_file(
    config: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """The TOML file :func:`load` reads, or None. An explicitly named file must exist."""
    env = os.environ if environ is None else environ
    named = config if config is not None else env.get(ENV_PREFIX + "CONFIG") or None
    if named is not None:
        path = Path(named).expanduser()
        if not path.is_file():
            raise ConfigurationError(f"configuration file {str(path)!r} does not exist")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def _from_environ(env: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in SETTINGS:
        text = env.get(ENV_PREFIX + name.upper())
        if text is not None and text.strip():
            found[name] = _convert(name, text.strip(), ENV_PREFIX + name.upper())
    for variable, text in env.items():
        if variable.startswith(_OPTION_ENV_PREFIX) and len(variable) > len(_OPTION_ENV_PREFIX):
            found[variable[len(_OPTION_ENV_PREFIX) :].lower()] = text
    return found


def _convert(name: str, text: str, source: str) -> Any:
    return text if name == "url" else convert_text(name, text, source)


def _from_toml(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{path}: invalid TOML: {exc}") from exc
    found: dict[str, Any] = {}
    for name, value in data.items():
        if name == "options":
            if not isinstance(value, dict):
                raise ConfigurationError(f"{path}: [options] must be a table of backend options")
            found.update(value)
        elif name in SETTINGS:
            kind = SETTINGS[name]
            # TOML has its own types; accept an int where a float is expected, nothing looser.
            ok = isinstance(value, kind) or (kind is float and type(value) is int)
            if not ok or (isinstance(value, bool) and kind is not bool):
                raise ConfigurationError(f"{path}: {name} = {value!r} must be a {kind.__name__}")
            found[name] = value
        else:
            # A typo here would otherwise be silently ignored, and the default used instead.
            known = ", ".join([*SETTINGS, "[options]"])
            close = difflib.get_close_matches(name, SETTINGS, n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            raise ConfigurationError(f"{path}: unknown setting {name!r}; {hint}known: {known}")
    return found
