"""Types of the optional C module built from _speedups.c (loaded by producerkit._fast)."""

from typing import Any, Final

CRC32C: Final[str]
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

def encode_batch(
    records: list[Any], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes, int]: ...
def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...
def untracked(record: tuple[Any, ...]) -> tuple[Any, ...]: ...
def pop_run(pending: dict[int, Any], records: list[Any]) -> tuple[int, list[int] | None]: ...

DECLINED: Final[object]

class Router:
    def __init__(self, partitioner: Any, key_hash: Any, keyless: Any, connections: int) -> None: ...
    def route(
        self, topic: str, key: bytes | None, partition: int | None, num_partitions: int | None
    ) -> tuple[int | None, int]: ...

class WindowCore:
    pending: dict[int, Any]
    timer: Any
    limit: int
    peak_in_flight: int
    timeout: float
    def __init__(self, limit: int, timeout: float, untrack: bool = False) -> None: ...
    def admit(
        self,
        value: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int | None,
        headers: Any,
        msg_id: str | None,
        connection: int,
        future: Any,
        timestamp: int | None = None,
    ) -> tuple[Any, ...]: ...

class Admission:
    def __init__(
        self,
        router: Router,
        window: WindowCore,
        sends: tuple[Any, ...],
        send_failed: Any,
        topics: dict[str, int | None],
        default_topic: str | None,
        max_payload: int,
    ) -> None: ...
    def admit(
        self,
        value: object,
        key: object,
        topic: object,
        partition: object,
        headers: object,
        msg_id: object,
    ) -> Any: ...

class Gather:
    ship_due: bool
    batch_records: int
    def __init__(self, queues: dict[str, dict[int, Any]], send: Any) -> None: ...
    def send(self, record: tuple[Any, ...]) -> Any: ...
