"""Types of the C module built from _cwire.c (loaded by producerkit.backends.kafka.wire)."""

from collections.abc import Awaitable, Callable
from typing import Any, Final

CRC32C: Final[str]
RECORD_VALUE: Final[int]
RECORD_KEY: Final[int]
RECORD_TOPIC: Final[int]
RECORD_PARTITION: Final[int]
RECORD_HEADERS: Final[int]
RECORD_DEADLINE: Final[int]
RECORD_TIMESTAMP: Final[int]

def encode_batch(
    records: list[Any], start: int, max_bytes: int, time_shift: float, checksum: bool = True, /
) -> tuple[bytes, int]: ...
def encode_records(
    records: list[Any], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes, int, int, int]: ...
def frame_batch(section: bytes, codec: int, count: int, first_ts: int, max_ts: int) -> bytes: ...
def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...
def partition_runs(records: list[Any]) -> list[list[Any]]: ...

class Appender:
    def __init__(
        self,
        queues: dict[str, dict[int, Any]],
        queue_of: Callable[[Any], Any],
        gathering: Any,
        sender: Any,
        batch_full: Callable[[Any], Awaitable[None]],
        clock: Callable[[], float],
        queue_type: type,
    ) -> None: ...
    def __call__(self, record: Any, /) -> Awaitable[None] | None: ...
