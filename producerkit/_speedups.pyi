"""Types of the optional C module built from _speedups.c (loaded by producerkit._fast)."""

from collections.abc import Callable, Generator, Iterator
from typing import Any, Final

MESSAGE_VALUE: Final[int]
MESSAGE_KEY: Final[int]
MESSAGE_TOPIC: Final[int]
MESSAGE_PARTITION: Final[int]
MESSAGE_HEADERS: Final[int]
MESSAGE_MSG_ID: Final[int]
MESSAGE_TIMESTAMP: Final[int]
RECORD_SEQ: Final[int]
RECORD_VALUE: Final[int]
RECORD_KEY: Final[int]
RECORD_TOPIC: Final[int]
RECORD_PARTITION: Final[int]
RECORD_HEADERS: Final[int]
RECORD_MSG_ID: Final[int]
RECORD_DEADLINE: Final[int]
RECORD_CONNECTION: Final[int]
RECORD_FUTURE: Final[int]
RECORD_TIMESTAMP: Final[int]
RECORD_CONTEXT: Final[int]
DECLINED: Final[object]

class Ledger:
    """The window's ledger: seq -> record in flight, in admission order (filled by admission)."""

    def __len__(self) -> int: ...
    def __contains__(self, seq: object) -> bool: ...
    def __getitem__(self, seq: int) -> Any: ...
    def __delitem__(self, seq: int) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def pop(self, seq: int, default: Any = ..., /) -> Any: ...
    def get(self, seq: int, default: Any = None, /) -> Any: ...
    def keys(self) -> list[int]: ...
    def values(self) -> list[Any]: ...
    def items(self) -> list[tuple[int, Any]]: ...

def pop_run(
    pending: Ledger | dict[int, Any], records: list[Any]
) -> tuple[int, list[int] | None]: ...
def tell_run(
    pending: Ledger | dict[int, Any],
    records: list[Any],
    first_offset: int | None,
    stored_at: float | None,
    make_delivery: Callable[..., Any],
    on_delivery: Callable[[Any, Any], object],
    report: Callable[[Exception], object],
    answer: Callable[[Any, Any], object],
) -> int: ...

class Record(tuple[Any, ...]):
    def __new__(cls, *fields: Any) -> Record: ...

class SlotsMaker:
    def __init__(self, cls: type, slots: tuple[Any, ...]) -> None: ...
    def __call__(self, *values: Any) -> Any: ...

class ExactBytes:
    function: Callable[[Any], Any]
    def __init__(self, function: Callable[[Any], Any]) -> None: ...
    def __call__(self, obj: Any) -> Any: ...

class Router:
    def __init__(
        self,
        partitioner: Any,
        key_hash: Any,
        keyless_partition: Any,
        connections: int,
        not_a_partition: type[Exception],
        native_hash: int = 0,
    ) -> None: ...
    def route(
        self, topic: str, key: bytes | None, partition: int | None, num_partitions: int | None
    ) -> tuple[int | None, int]: ...

class WindowCore:
    pending: Ledger
    limit: int
    peak_in_flight: int
    handed: int
    taken: int
    timeout: float
    watching: bool
    def __init__(
        self,
        limit: int,
        timeout: float,
        watch: Callable[[Any], object],
        untrack: bool = False,
    ) -> None: ...
    def full(self) -> bool: ...
    def admit(
        self,
        message: tuple[Any, ...],
        partition: int | None,
        connection: int,
        slot: Any,
        context: Any = None,
        reserved: bool = False,
    ) -> Any: ...

class Done:
    def __await__(self) -> Generator[Any]: ...
    def send(self, value: object) -> Any: ...
    def throw(self, *args: Any) -> Any: ...
    def close(self) -> None: ...

class ProducerCore:
    _admission: Any

class ProduceDoor:
    def __init__(self, produce: Callable[..., Any]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: object, owner: type | None = None) -> Any: ...

class Admission:
    def __init__(
        self,
        router: Router,
        window: WindowCore,
        sends: tuple[Any, ...],
        send_failed: Any,
        hand_off: Any,
        topics: dict[str, int | None],
        default_topic: str | None,
        max_payload: int,
        *,
        takes_context: bool = False,
        stamps: bool = False,
        value_serializer: Any = None,
        trace_headers: Any = None,
    ) -> None: ...
    def admit(
        self,
        value: object,
        key: object,
        topic: object,
        partition: object,
        headers: object,
        msg_id: object,
        context: object,
        expect: object,
        timestamp: object,
        reserved: bool = False,
    ) -> Any: ...
    def admit_chunk(
        self,
        values: list[Any],
        keys: list[Any] | None,
        topic: object,
        start: int,
        stop: int,
        tombstones: bool,
    ) -> Any: ...
