"""The names the Spark sink takes, and the error for one it does not: its own options
(``exactly_once``, the ``*_col`` columns, ...), the Producer settings and the backend's options,
all derived from where they are declared (``SinkConfig``, ``ProducerOptions``, the backend's
spec), so a typo gets a "did you mean" among all of them before Spark runs anything."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from producerkit._options import Accepted, check_option_names, producer_accepts

__all__ = ["check_sink_options", "sink_accepts"]


def sink_accepts(
    scheme: str, backend_options: Iterable[str], own: Collection[str] = ()
) -> list[Accepted]:
    """What the sink takes for a ``scheme://`` URL: ``own`` (an entry point's own names, such as
    ``format("producerkit")``'s ``url``), the sink's keywords, then the Producer's."""
    from producerkit.spark._publish import SINK_KEYWORDS

    return [
        ("the Spark sink's option", "the Spark sink's options", [*own, *SINK_KEYWORDS]),
        *producer_accepts(scheme, backend_options),
    ]


def check_sink_options(url: str, names: Iterable[str], own: Collection[str] = ()) -> None:
    """Raise ConfigurationError for the first of ``names`` the sink does not take (see
    :func:`~producerkit._options.unknown_option`); a bad URL is left for the Producer to say."""
    from producerkit._urls import parse_url
    from producerkit.backends import spec_for
    from producerkit.errors import ProducerkitError

    try:
        scheme = parse_url(url).scheme
        spec = spec_for(scheme)
    except ProducerkitError:
        return
    check_option_names(names, scheme, sink_accepts(scheme, spec.options, own))
