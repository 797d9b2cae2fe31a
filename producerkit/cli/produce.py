"""``producerkit produce``: publish each record of a file or stdin, kcat-style.

Every record read ends up in exactly one of two places: acknowledged by the broker, or written to
``--failed-out FILE`` in the input's own format (and counted in the summary, and the exit code is
1). A rerun with that file as input (and the same flags) therefore retries exactly what failed::

    producerkit produce --url jetstream://127.0.0.1:4222 --topic orders \\
        --key-field user --failed-out failed.jsonl orders.jsonl
    producerkit produce ... --failed-out failed.jsonl failed.jsonl     # retry, same flags

A record can fail in three ways, all written to the failures file: the broker did not ack it in
``--timeout`` seconds or refused it (``on_error``, or the exception of a blocking produce), the
producer refused it at the call (too large, bad header), or the input line could not be parsed
(written verbatim, so it can be fixed and replayed). An interrupted run (Ctrl-C, SIGTERM: exit
130) adds the records it read and never sent, as ``Interrupted``.

This module is the command's interface: its flags and :func:`main`. The flags of the Producer's
settings are derived from :class:`~producerkit.ProducerOptions` (:func:`add_setting_flags`);
the run itself is :mod:`producerkit.cli.run`, the input formats :mod:`producerkit.cli.formats`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import attrs

from producerkit import settings
from producerkit._options import configurable
from producerkit.cli._args import ArgumentParser, cli_syntax, help_pointer
from producerkit.cli._metrics_flags import add_metrics_arguments, linger, start_metrics
from producerkit.cli._signals import StopRequest
from producerkit.cli.formats import FORMATS, detect_format, input_format
from producerkit.cli.run import produce_file
from producerkit.cli.values import VALUE_FORMATS, value_format
from producerkit.errors import ConfigurationError

__all__ = ["SHORT_OPTIONS", "add_setting_flags", "build_parser", "main", "setting_fields"]

#: Short options of setting flags, besides the long ``--<name>`` every setting has.
SHORT_OPTIONS: Final[dict[str, tuple[str, ...]]] = {"topic": ("-t",)}
#: The metavar of a setting flag, by the type its text converts to.
_METAVARS: Final[dict[type, str]] = {int: "N", float: "NUMBER", str: "NAME"}


PRODUCE_EPILOG: Final = """\
examples:
  # a JSON document per line, keyed by its "user" field; what fails goes to failed.jsonl
  producerkit produce --url kafka://127.0.0.1:9092 --topic orders --key-field user \\
      --failed-out failed.jsonl orders.jsonl
  # rerun exactly what failed, with the same flags
  producerkit produce --url kafka://127.0.0.1:9092 --topic orders --key-field user \\
      --failed-out failed2.jsonl failed.jsonl
  # JetStream: create the stream if there is none; msg_id from "id" (reruns de-duplicated)
  producerkit produce --url jetstream://127.0.0.1:4222 -o create_stream=true --topic orders \\
      --msg-id-field id orders.jsonl
  # a line per message from stdin, KEY:VALUE
  printf 'user-1:hello\\nuser-2:world\\n' | producerkit produce --url nats://127.0.0.1:4222 \\
      --topic greetings --key-delimiter :

Settings not given as flags come from PRODUCERKIT_* environment variables, then a TOML file
(--config, $PRODUCERKIT_CONFIG or ./producerkit.toml).
Exit code: 0 all acked, 1 some failed (see --failed-out), 2 usage or configuration error,
130 interrupted.
"""


def setting_fields() -> list[attrs.Attribute[Any]]:
    """The Producer settings this command takes as flags: the fields of ProducerOptions that
    text can give and whose metadata says ``cli``, in their declared order."""
    return [field for field in configurable() if field.metadata["cli"]]


def add_setting_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add a flag for every setting of :func:`setting_fields`, in a group of their own, and
    return the actions added.

    The flag of ``max_in_flight_messages`` is ``--max-in-flight-messages`` (plus the short
    options of :data:`SHORT_OPTIONS`); its ``dest`` is the field's name, its help the field's
    doc, and its value converts to the field's text type. Every default is None, so a flag not
    given leaves the setting to the environment, the TOML file or the Producer's default
    (:func:`producerkit.settings.load` ignores None). A bool setting is a
    ``BooleanOptionalAction``: ``--propagate-trace`` and ``--no-propagate-trace``, so the
    command line can also turn off what the environment or the file turned on.
    """
    group = parser.add_argument_group(
        "producer settings",
        "Each flag not given comes from PRODUCERKIT_<SETTING>, then the TOML file, then the "
        "Producer's default.",
    )
    actions: list[argparse.Action] = []
    for field in setting_fields():
        kind = field.metadata["text"]
        flags = [f"--{field.name.replace('_', '-')}", *SHORT_OPTIONS.get(field.name, ())]
        help_text = field.metadata["doc"].replace("%", "%%")  # argparse formats help with %
        if kind is bool:
            action = group.add_argument(
                *flags,
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            action = group.add_argument(
                *flags,
                dest=field.name,
                type=kind,
                default=None,
                metavar=_METAVARS.get(kind),
                help=help_text,
            )
        actions.append(action)
    return actions


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: its own flags (input, formats, failures file, progress, metrics)
    and, from :func:`add_setting_flags`, one per Producer setting."""
    parser = ArgumentParser(
        prog="producerkit produce",
        description="Publish each record of a file (or stdin) to Kafka, NATS or JetStream.",
        epilog=PRODUCE_EPILOG,
    )
    parser.add_argument("file", nargs="?", default="-", help="input file; - or none for stdin")
    parser.add_argument("--url", help="kafka://, jetstream://, nats://, memory:// or null:// URL")
    parser.add_argument("--config", help="TOML settings file (default ./producerkit.toml)")
    parser.add_argument(
        "--format",
        "-f",
        choices=FORMATS,
        help="lines: a message per line; jsonl: a JSON document per line; csv: a header row, then "
        "a message per row (multi-line quoted fields kept). Default: from the file's extension "
        "(.csv, .jsonl or .ndjson), else lines (stdin too)",
    )
    parser.add_argument(
        "--value-format",
        choices=VALUE_FORMATS,
        default="bytes",
        help=(
            "how each value is sent: bytes (default) as read, a JSONL/CSV field's text, a CSV row "
            "as a JSON object; str: the same, refusing values that are not UTF-8; json: the "
            "value (a line, a JSONL document or field, a CSV row or cell) as compact JSON; avro: "
            "that JSON value as Avro (--avro-schema, --schema-id)"
        ),
    )
    parser.add_argument("--avro-schema", metavar="FILE", help="avro: the schema (.avsc JSON)")
    parser.add_argument(
        "--schema-id", type=int, metavar="N", help="avro: the schema's registry id (framed)"
    )
    parser.add_argument("--key-field", help="jsonl/csv: the field whose value is the key")
    parser.add_argument("--value-field", help="jsonl/csv: send only this field as the value")
    parser.add_argument(
        "--msg-id-field", help="jsonl/csv: field used as msg_id (JetStream de-duplicates reruns)"
    )
    parser.add_argument("--key-delimiter", help="lines: split each line into KEY<delim>VALUE")
    parser.add_argument(
        "--header",
        "-H",
        action="append",
        default=[],
        metavar="K=V",
        help="add this header to every message (repeatable)",
    )
    parser.add_argument(
        "--one-by-one",
        action="store_true",
        help="wait for each record's ack before sending the next (default: pipelined, up to "
        "--max-in-flight-messages in flight, each key's records kept in order)",
    )
    parser.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="backend option, e.g. -o create_stream=true -o linger_ms=5 (repeatable)",
    )
    parser.add_argument(
        "--failed-out",
        metavar="FILE",
        help="write records that failed here, in the input format, to rerun them",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    add_metrics_arguments(parser)
    add_setting_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default: ``sys.argv[1:]``) and return its exit code: 0 all
    acked, 1 some failed, 2 a usage or configuration error, 130 interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # From here a SIGINT or SIGTERM only sets a flag until the run takes the signals over (and
    # counts it): raised as KeyboardInterrupt at start-up, it could land anywhere, asyncio's own
    # handler included, and leave the process hung or killed by the signal.
    early = StopRequest()
    with early.installed():
        return _main(parser, args, early)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace, early: StopRequest) -> int:
    try:
        args.format = args.format or detect_format(args.file)
        values = value_format(args.value_format, args.avro_schema, args.schema_id)
        fmt = input_format(args, values)
        headers = _pairs(args.header, "--header") or None
        kwargs = settings.load(args.config, **_overrides(args))
        if "topic" not in kwargs:
            raise ConfigurationError(
                "no topic: pass --topic NAME, set PRODUCERKIT_TOPIC=NAME, or write "
                'topic = "NAME" in the TOML file (--config, $PRODUCERKIT_CONFIG or '
                "./producerkit.toml)"
            )
        if args.file != "-" and not os.path.isfile(args.file):
            raise ConfigurationError(f"no such file: {args.file}")
        metrics = start_metrics(args)
    except ConfigurationError as exc:
        parser.error(str(exc))  # exits with code 2
    failed_out = Path(args.failed_out) if args.failed_out else None
    show_progress = args.progress if args.progress is not None else sys.stderr.isatty()
    pipelined = not args.one_by_one
    try:
        return anyio.run(
            produce_file,
            args.file,
            fmt,
            kwargs,
            headers,
            failed_out,
            show_progress,
            pipelined,
            metrics,
            early,
        )
    except ConfigurationError as exc:  # e.g. a backend option, checked when the Producer is built
        print(f"producerkit produce: error: {cli_syntax(str(exc))}", file=sys.stderr)
        print(help_pointer("producerkit produce"), file=sys.stderr)
        return 2
    finally:
        linger(metrics, args.metrics_linger, early)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """What the command line sets, for :func:`producerkit.settings.load`: the backend options of
    ``-o``, then ``--url`` and the setting flags given (a flag given wins over ``-o``)."""
    overrides: dict[str, Any] = _pairs(args.option, "--option")
    flags = {
        "url": args.url,
        **{field.name: getattr(args, field.name) for field in setting_fields()},
    }
    overrides.update({name: value for name, value in flags.items() if value is not None})
    return overrides


def _pairs(items: list[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, found, value = item.partition("=")
        if not found or not name:
            raise ConfigurationError(f"{what} {item!r} must look like NAME=VALUE")
        pairs[name] = value
    return pairs
