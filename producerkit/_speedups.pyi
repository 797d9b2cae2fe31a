"""Types of the optional C module built from _speedups.c (loaded by producerkit._fast)."""

from typing import Any, Final

CRC32C: Final[str]
RECORD_SEQ: Final[int]
RECORD_VALUE: Final[int]
RECORD_KEY: Final[int]
RECORD_HEADERS: Final[int]
RECORD_DEADLINE: Final[int]
RECORD_FUTURE: Final[int]

def encode_batch(
    records: list[Any], start: int, max_bytes: int, time_shift: float
) -> tuple[bytes, int]: ...
def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int: ...
def untracked(record: tuple[Any, ...]) -> tuple[Any, ...]: ...
def pop_run(pending: dict[int, Any], records: list[Any]) -> tuple[int, list[int] | None]: ...
