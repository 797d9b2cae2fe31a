"""``--metrics-port`` and ``--metrics-linger``, the metrics flags of ``producerkit produce`` and
``producerkit demo``: the flags, the server they start and its lingering after the run.

The server itself (:mod:`producerkit.cli.metrics`, prometheus-client) is imported only when
``--metrics-port`` is given.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from producerkit.cli._signals import StopRequest, interruptible
from producerkit.errors import ConfigurationError

if TYPE_CHECKING:
    from producerkit.cli.metrics import Metrics

__all__ = ["add_metrics_arguments", "linger", "start_metrics"]


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-linger`` (shared with ``producerkit demo``)."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on http://127.0.0.1:PORT/metrics (0: a free port, "
        'printed); needs pip install "producerkit[metrics]"',
    )
    parser.add_argument(
        "--metrics-linger",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --metrics-port: keep serving the final metrics this long after the run "
        "(Ctrl-C ends it), so a scraper sees them",
    )


def start_metrics(args: argparse.Namespace) -> Metrics | None:
    """The metrics server for ``--metrics-port`` (None without it); ConfigurationError if it
    cannot start. prometheus-client is imported only here."""
    if args.metrics_port is None:
        if args.metrics_linger:
            raise ConfigurationError("--metrics-linger needs --metrics-port")
        return None
    if not 0 <= args.metrics_port <= 65535 or args.metrics_linger < 0:
        raise ConfigurationError("--metrics-port takes 0-65535 and --metrics-linger seconds >= 0")
    from producerkit.cli.metrics import Metrics

    metrics = Metrics()
    metrics.serve(args.metrics_port)
    return metrics


def linger(metrics: Metrics | None, seconds: float, stop: StopRequest | None = None) -> None:
    """Keep serving the final metrics for ``seconds`` (Ctrl-C ends it early), then stop.
    ``stop``: where the signals go already (one requested ends it, at once if it came before)."""
    if metrics is None:
        return
    try:
        if stop is not None:
            stop.wait(seconds)
        else:
            with interruptible():
                if seconds > 0:
                    time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    finally:
        metrics.close()
