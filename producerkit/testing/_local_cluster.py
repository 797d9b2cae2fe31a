"""What the local clusters of ``producerkit.testing`` share (Apache Kafka's nodes, the JetStream
cluster's servers): their work directory, the fault proxy in front of the first member, the
context manager, and polling until a condition holds."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Self

from producerkit.errors import BrokerUnavailable, ConfigurationError

if TYPE_CHECKING:
    from producerkit.testing.proxy import FaultProxy


class LocalCluster:
    """A cluster of broker processes on loopback: a subclass starts its members in
    :meth:`start` (in :meth:`_open_workdir`'s directory) and stops them in :meth:`stop`
    (through :meth:`_close_workdir`), and names its first member's client port
    (:meth:`_first_port`) for :attr:`faults`."""

    #: The URL scheme of the cluster's protocol (the fault proxy speaks it).
    scheme: ClassVar[str]
    #: How messages name the cluster.
    _title: ClassVar[str]

    def __init__(self, workdir: Path | None) -> None:
        self._given_workdir = workdir
        self._workdir: Path | None = None
        self._faults: FaultProxy | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _first_port(self) -> int:
        raise NotImplementedError

    @property
    def workdir(self) -> Path:
        """Where the members keep their configuration, data and logs (while started)."""
        if self._workdir is None:
            raise ConfigurationError(f"this {self._title} is not started")
        return self._workdir

    def _open_workdir(self, prefix: str) -> Path:
        """The given work directory (made if missing), else a new temporary one."""
        if self._given_workdir is not None:
            self._workdir = Path(self._given_workdir)
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix=prefix))
        return self._workdir

    def _close_workdir(self) -> None:
        """Stop the fault proxy and remove the work directory if this object made it."""
        faults, self._faults = self._faults, None
        if faults is not None:
            faults.stop()
        if self._given_workdir is None and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    @property
    def faults(self) -> FaultProxy:
        """A :class:`~producerkit.testing.proxy.FaultProxy` in front of the first member
        (started the first time it is asked for): give a client :attr:`faulty_url`. For Kafka
        every connection it makes, to each node Metadata names, passes through the proxy."""
        if self._faults is None:
            from producerkit.testing.proxy import FaultProxy

            self._faults = FaultProxy(self.scheme, "127.0.0.1", self._first_port()).start()
        return self._faults

    @property
    def faulty_url(self) -> str:
        """The cluster's URL through :attr:`faults`."""
        return f"{self.scheme}://{self.faults.host_port}"

    def _clear_faults(self) -> None:
        if self._faults is not None:
            self._faults.clear()

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout: float,
        what: str,
        *,
        not_yet: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Poll ``condition`` until true (raising one of ``not_yet`` counts as not yet); a
        :class:`~producerkit.errors.BrokerUnavailable` after ``timeout`` seconds."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                if condition():
                    return
            except not_yet:
                pass
            if time.monotonic() >= deadline:
                raise BrokerUnavailable(f"{self._title}: timed out waiting for {what}")
            time.sleep(0.1)

    def close(self) -> None:
        """The same as :meth:`stop`."""
        self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
