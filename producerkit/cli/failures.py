"""The failures file of ``producerkit produce`` (``--failed-out FILE``) and the failure counts.

Every record that does not reach the broker goes through :class:`FailureSink`: counted by reason
for the summary and, with ``--failed-out``, written back in the input's format so that a rerun
with the file as its input retries exactly what failed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from producerkit.cli._args import cli_syntax
from producerkit.cli.formats import Format, InvalidRecord, Parsed, Writer
from producerkit.errors import MessageError

if TYPE_CHECKING:
    import producerkit as pk
    from producerkit.cli.metrics import Metrics

__all__ = ["FailureSink", "Interrupted"]


class Interrupted(Exception):
    """Why a record read was never sent: the run was interrupted (Ctrl-C, SIGTERM) first."""


class _FailureFile:
    """One failures file: written to ``PATH.partial`` as records fail, put in place by
    :meth:`finish` (created empty when nothing failed)."""

    def __init__(self, fmt: Format, path: Path) -> None:
        self.path = path
        self.count = 0
        self._fmt = fmt
        self._partial = path.with_name(path.name + ".partial")
        self._file: IO[bytes] | None = None
        self._write: Writer | None = None

    def open(self) -> IO[bytes]:
        if self._file is None:
            self._file = open(self._partial, "wb")  # noqa: SIM115 - closed in finish()
            self._file.write(self._fmt.preamble())
            self._write = self._fmt.open_writer(self._file)
        return self._file

    def write(self, value: Any, key: bytes | None, msg_id: str | None) -> None:
        self.open()
        assert self._write is not None
        self._write(value, key, msg_id)
        self.count += 1

    def write_raw(self, data: bytes) -> None:
        self.open().write(data)
        self.count += 1

    def finish(self, create: bool) -> None:
        if self._file is not None:
            self._file.close()
            os.replace(self._partial, self.path)
        elif create:  # an empty file: replaying it (the usual next step) sends nothing
            self.path.write_bytes(b"")


def possibly_stored_path(path: Path) -> Path:
    """Where ``--failed-out PATH`` puts the failures that may be stored all the same:
    ``failed.jsonl`` -> ``failed.possibly-stored.jsonl``."""
    return path.with_name(f"{path.stem}.possibly-stored{path.suffix}")


class FailureSink:
    """Counts failed records by reason and writes them to ``--failed-out`` as they happen.

    A record that may have been stored all the same (its answer was lost: ``possibly_stored``)
    goes to a second file beside it (:func:`possibly_stored_path`), so that a rerun of FILE
    sends nothing twice; rerun that one only where a duplicate does no harm, or with a msg id.
    Writes go to ``.partial`` files that replace the files at the end, so FILE may also be this
    run's input (the usual retry). When nothing failed, FILE is created or emptied: it always
    exists after a run and holds what is left to send; replaying an empty file sends nothing.
    """

    def __init__(self, fmt: Format, path: Path | None, metrics: Metrics | None = None) -> None:
        self.path = path
        self._metrics = metrics
        self.count = 0
        self.reasons: dict[str, int] = {}
        self.examples: list[str] = []
        self._finished = False
        self._unsent = _FailureFile(fmt, path) if path is not None else None
        self._maybe = _FailureFile(fmt, possibly_stored_path(path)) if path is not None else None

    @property
    def possibly_stored(self) -> int:
        """Records written to the possibly-stored file."""
        return self._maybe.count if self._maybe is not None else 0

    def add(
        self,
        value: Any,
        key: bytes | None,
        msg_id: str | None,
        exc: BaseException,
        possibly_stored: bool = False,
    ) -> None:
        self._count(exc)
        if self._metrics is not None and isinstance(exc, MessageError):
            self._metrics.rejected(exc)  # refused at the call: never a message
        file = self._maybe if possibly_stored else self._unsent
        if file is not None:
            file.write(value, key, msg_id)

    def add_failure(self, failure: pk.Failure) -> None:
        self.add(
            failure.value, failure.key, failure.msg_id, failure.exception, failure.possibly_stored
        )

    def add_raw(self, raw: bytes, exc: BaseException) -> None:
        self._count(exc)
        if self._metrics is not None:
            self._metrics.rejected(exc)
        if self._unsent is not None:
            self._unsent.write_raw(raw if raw.endswith(b"\n") else raw + b"\n")

    def _count(self, exc: BaseException) -> None:
        self.count += 1
        name = type(exc).__name__
        seen = self.reasons.get(name, 0)
        self.reasons[name] = seen + 1
        if not seen and len(self.examples) < 3:
            # One example per kind of failure, so a user sees why without a log per record.
            self.examples.append(f"{name}: {cli_syntax(str(exc))}")

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if self._unsent is not None and self._maybe is not None:
            self._unsent.finish(create=True)
            self._maybe.finish(create=False)

    def add_unsent(self, item: Parsed | InvalidRecord) -> None:
        """A record read but never handed to the producer (the run was interrupted)."""
        if isinstance(item, InvalidRecord):
            self.add_raw(item.raw, item)
        else:
            self.add(*item, Interrupted("read, not sent: the run was interrupted"))

    def write_raw(self, data: bytes) -> None:
        """Input copied as it is (nothing could be sent); counted by :meth:`input_unsent`."""
        if self._unsent is not None:
            self._unsent.write_raw(data)

    def input_unsent(self, records: int, exc: BaseException) -> None:
        """The whole input (``records`` of it) was left to send because of ``exc``."""
        name = type(exc).__name__
        self.count += records
        self.reasons[name] = self.reasons.get(name, 0) + records
        self.examples.append(f"{name}: {cli_syntax(str(exc))}")
