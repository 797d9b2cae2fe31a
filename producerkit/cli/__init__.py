"""The ``producerkit`` command: ``demo``, ``bench``, ``produce``, ``replay``, ``dev``.

Each subcommand lives in its own module of this package (:mod:`.demo`, :mod:`.bench`,
:mod:`.produce`, :mod:`.replay`, :mod:`.dev`), imported only when it runs, so
``producerkit --help`` is quick and needs none of the optional dependencies.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

_COMMANDS = {
    "demo": (
        "producerkit.cli.demo",
        "start local brokers; compare sending one at a time with many at once",
    ),
    "bench": ("producerkit.cli.bench", "open-loop latency/throughput benchmark (HDR, plots)"),
    "produce": ("producerkit.cli.produce", "publish each record of a file or stdin"),
    "replay": ("producerkit.cli.replay", "send a spool's failed messages again"),
    "dev": ("producerkit.cli.dev", "start local Kafka (Tansu) and NATS brokers for development"),
}


def _usage() -> str:
    lines = ["usage: producerkit COMMAND [options]", "", "commands:"]
    lines += [f"  {name:<9} {summary}" for name, (_, summary) in _COMMANDS.items()]
    lines += ["", "options:", "  -h, --help  show this help", "  --version   show the version"]
    lines += ["", "producerkit COMMAND --help shows a command's options."]
    return "\n".join(lines)


#: The client libraries' loggers (their children inherit the level).
_CLIENT_LOGGERS = ("aiokafka", "nats")


def quiet_client_logs() -> None:
    """Keep the client libraries' own log lines off the command's stderr: aiokafka logs
    ``Unable connect to ...`` at ERROR on every attempt, beside producerkit's own report of the
    same failure (``BrokerUnavailable: cannot reach a Kafka bootstrap server ...``, with its
    cause). A command says what failed in producerkit's words; only a CRITICAL line of a client
    gets through."""
    for name in _CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] == "--version":
        from producerkit import __version__

        print(__version__)
        return 0
    command = _COMMANDS.get(args[0])
    if command is None:
        print(f"producerkit: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    quiet_client_logs()
    try:
        module = importlib.import_module(command[0])
        code: int = module.main(args[1:])
    except KeyboardInterrupt:  # Ctrl-C before a command took the signal over, or in one that
        print(f"producerkit {args[0]}: interrupted", file=sys.stderr)  # does not take it
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
