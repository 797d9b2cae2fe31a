"""``producerkit replay SPOOL --url URL``: send a spool's messages again.

A spool (``Producer(spool=PATH)``, ``producerkit produce --spool PATH``) holds every message that
failed, one JSON line each (see ``producerkit._spool``). Replay sends each to the topic,
partition, key, headers, msg_id and CreateTime it had, pipelined through one producer, and
rewrites SPOOL with what is left to send:

- a message acked is gone from SPOOL;
- one that fails again is in SPOOL once, with its new error and ``possibly_stored``;
- with ``--skip-possibly-stored``, one that may already be stored is kept as it is, unsent (to
  send it only where a duplicate does no harm, or with its msg_id on JetStream, later);
- Ctrl-C or SIGTERM stops reading: what was in flight fails (possibly stored) and what was not
  read yet is kept, so every message ends in exactly one place, the broker or SPOOL.

The new SPOOL is written beside it (``SPOOL.replaying``) and replaces it at the end. If replay is
killed (``kill -9``) before that, SPOOL is untouched: the next replay sends all of it again, so
the messages acked before the kill are sent twice (a msg_id lets JetStream drop them).

Exit code: 0 all sent, 1 some kept in SPOOL, 2 usage or configuration error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import attrs

import producerkit as pk
from producerkit import settings
from producerkit._spool import line_of, read_spool
from producerkit.cli._args import ArgumentParser, cli_syntax
from producerkit.cli.produce import add_setting_flags, setting_fields
from producerkit.errors import ConfigurationError

__all__ = ["ReplayCounts", "build_parser", "main", "replay"]


@attrs.define
class ReplayCounts:
    """What a replay did with each message of the spool."""

    read: int = 0
    acked: int = 0
    failed: int = 0
    kept: int = 0
    interrupted: bool = False


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="producerkit replay",
        description="Send a spool's messages again; leave in it only what is still unsent.",
        epilog="""\
examples:
  # what a Producer(spool="failed.spool") kept, sent again to the same topic(s)
  producerkit replay failed.spool --url kafka://127.0.0.1:9092
  # leave what may already be stored (possibly_stored) in the spool, unsent
  producerkit replay failed.spool --url jetstream://127.0.0.1:4222 --skip-possibly-stored

Exit code: 0 all sent, 1 some kept in the spool, 2 usage or configuration error,
130 interrupted.
""",
    )
    parser.add_argument(
        "path", metavar="SPOOL", help="a spool file (Producer(spool=...), produce --spool)"
    )
    parser.add_argument("--url", help="kafka://, jetstream://, nats://, memory:// or null:// URL")
    parser.add_argument("--config", help="TOML settings file (default ./producerkit.toml)")
    parser.add_argument(
        "--skip-possibly-stored",
        action="store_true",
        help="keep the messages that may already be stored in the spool, unsent",
    )
    parser.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="backend option, e.g. -o create_stream=true (repeatable)",
    )
    add_setting_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    path = Path(args.path)
    try:
        if not path.is_file():
            raise ConfigurationError(f"no such spool: {path}")
        overrides: dict[str, Any] = {}
        for item in args.option:
            name, found, value = item.partition("=")
            if not found or not name:
                raise ConfigurationError(f"--option {item!r} must look like NAME=VALUE")
            overrides[name] = value
        given = {field.name: getattr(args, field.name) for field in setting_fields()}
        overrides.update({name: value for name, value in given.items() if value is not None})
        kwargs = settings.load(args.config, url=args.url, **overrides)
        if kwargs.pop("spool", None) is not None:
            raise ConfigurationError("replay writes its own spool: give no --spool")
    except ConfigurationError as exc:
        parser.error(str(exc))
    try:
        counts = anyio.run(replay, path, kwargs, args.skip_possibly_stored)
    except ConfigurationError as exc:
        print(f"producerkit replay: error: {cli_syntax(str(exc))}", file=sys.stderr)
        return 2
    print(
        f"replayed {counts.read} message(s) from {path}: {counts.acked} acked, "
        f"{counts.failed} failed again, {counts.kept} kept unsent; {path} holds "
        f"{counts.failed + counts.kept}",
        file=sys.stderr,
    )
    if counts.interrupted:
        return 130
    return 1 if counts.failed or counts.kept else 0


async def replay(path: Path, kwargs: dict[str, Any], skip_possibly_stored: bool) -> ReplayCounts:
    """Send ``path``'s messages with a producer built from ``kwargs`` and rewrite ``path`` with
    what is left (see the module docstring)."""
    kwargs = dict(kwargs)
    url = kwargs.pop("url")
    counts = ReplayCounts()
    rewriting = path.with_name(path.name + ".replaying")
    rewriting.unlink(missing_ok=True)  # a replay killed before: all of it is still in path
    # The producer spools what fails again; what is kept unsent goes to the same file.
    producer = pk.Producer(url, spool=str(rewriting), **kwargs)
    with open(rewriting, "ab") as kept:
        async with anyio.create_task_group() as tasks:
            # Signals are taken before the producer connects: an interrupt while it connects
            # ends the connecting and keeps the whole spool; from the first message on, each
            # message is left in one place (the broker, or the spool).
            connecting = anyio.CancelScope()
            await tasks.start(_stop_on_signal, producer, counts, connecting)
            with connecting:
                await producer.start()
            if connecting.cancelled_caught:  # nothing was sent: every message is kept
                await producer.close()
                await _send_all(producer, path, kept, counts, skip_possibly_stored)
            else:
                async with producer:
                    await _send_all(producer, path, kept, counts, skip_possibly_stored)
                    if counts.interrupted:
                        producer.purge()  # what is in flight fails, spooled as possibly stored
                    with contextlib.suppress(pk.ProduceError):  # each failure is in the spool
                        await producer.flush()
            tasks.cancel_scope.cancel()
        kept.flush()
        os.fsync(kept.fileno())
    stats = producer.stats
    counts.acked, counts.failed = stats.acked, stats.failed
    os.replace(rewriting, path)
    return counts


async def _send_all(
    producer: pk.Producer,
    path: Path,
    kept: IO[bytes],
    counts: ReplayCounts,
    skip_possibly_stored: bool,
) -> None:
    """Produce each message of the spool; keep (write to ``kept``) those not to send, and
    every one read after an interruption."""
    for _, line, message in read_spool(path):
        counts.read += 1
        if counts.interrupted or (skip_possibly_stored and message.possibly_stored):
            kept.write(line if line.endswith(b"\n") else line + b"\n")
            counts.kept += 1
            continue
        try:
            await producer.produce(message.value, nonblocking=True, **message.produce_kwargs())
        except pk.MessageError as exc:  # refused by this producer: kept, with why
            kept.write(line_of(message, exc))
            counts.kept += 1


async def _stop_on_signal(
    producer: pk.Producer,
    counts: ReplayCounts,
    connecting: anyio.CancelScope,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """A SIGINT or SIGTERM stops sending: the rest of the spool is kept, and what is in flight
    fails at once (it is spooled as possibly stored); ``connecting`` (the producer's start) is
    cancelled. Started once the signals are taken."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            connecting.cancel()
            counts.interrupted = True
            producer.purge()
