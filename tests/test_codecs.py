"""Kafka's codecs through producerkit's own cramjam calls: librdkafka's default levels, the LZ4
frame the Java reader takes (independent blocks, no checksums), compressed batches framed the
same in C and in Python, readable by aiokafka's batch reader, and compression_level checked."""

from __future__ import annotations

import pytest

pytest.importorskip("aiokafka")
pytest.importorskip("cramjam")

from aiokafka.record.default_records import DefaultRecordBatch

import producerkit as pk
from producerkit._record import Record
from producerkit.backends.kafka import codecs, record_batch, wire

RECORDS = [
    Record(n, b"value-%d " % n * 20, b"k%d" % (n % 3), "t", 0, (("h", b"%d" % n),), None,
           1000.0, 0, None, 1_700_000_000_000 + n)
    for n in range(1, 400)
]  # fmt: skip


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("level", [None, 1])
def test_a_compressed_batch_reads_back_whole(codec: str, level: int | None) -> None:
    if codec == "snappy" and level is not None:
        pytest.skip("snappy has no levels")
    checked = codecs.check_level(codec, level)
    data, end = record_batch.CompressedEncoder(codec, checked)(RECORDS, 0, 1 << 20, 0.0)
    assert end == len(RECORDS)
    batch = DefaultRecordBatch(bytes(data))
    assert batch.validate_crc() and batch.compression_type == codecs.CODECS[codec]
    read = [(r.key, r.value, list(r.headers), r.timestamp) for r in batch]
    assert read == [(r.key, r.value, list(r.headers), r.timestamp) for r in RECORDS]


@pytest.mark.skipif(wire.C is None, reason=f"the C Kafka wire: {wire.SPEEDUPS}")
def test_the_c_framing_is_the_python_framing() -> None:
    assert wire.C is not None
    section, end, first, latest = wire.C.encode_records(RECORDS, 0, 1 << 20, 0.0)
    twin = wire.PYTHON.encode_records(RECORDS, 0, 1 << 20, 0.0)
    assert (bytes(section), end, first, latest) == twin
    compressed = codecs.compressor("zstd", 3)(section)
    assert wire.C.frame_batch(compressed, 4, end, first, latest) == (
        wire.PYTHON.frame_batch(compressed, 4, end, first, latest)
    )


def test_lz4_frames_have_independent_blocks_and_no_checksums() -> None:
    data = bytes(range(256)) * 1024  # 256 KiB: four blocks
    frame = codecs.compressor("lz4", 0)(data)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    flags, block_size = frame[4], frame[5]
    assert flags == 0x60 and block_size == 0x40  # independent blocks of 64 KiB, nothing else
    import cramjam  # what aiokafka decodes with

    assert bytes(cramjam.lz4.decompress(frame)) == data


@pytest.mark.parametrize("level", [0, 9])
def test_lz4_frames_read_back_whatever_the_blocks(level: int) -> None:
    """Incompressible blocks are stored as they are (the high bit of their size set), a short
    last block and an empty section make valid frames too."""
    import random

    import cramjam

    generator = random.Random(7)
    for data in (b"", b"a", generator.randbytes(65537), b"ab" * 100_000):
        frame = bytes(codecs.compressor("lz4", level)(data))
        assert bytes(cramjam.lz4.decompress(frame)) == data, len(data)
        if len(data) > 1000 and data[:2] != b"ab":
            assert frame[7 + 3] & 0x80  # the first block's size: stored uncompressed


@pytest.mark.parametrize("library", ["zstandard", "cramjam"])
def test_zstd_sections_of_every_size_read_back(library: str) -> None:
    """zstd with the streaming compressor's parameters (no content size in the frame) at the
    batch sizes where zstd's parameters change (16, 128 and 256 KiB), through either library;
    both write the same compressed blocks (cramjam ends with an empty one)."""
    import cramjam

    if library == "zstandard":
        pytest.importorskip("zstandard")
    data = bytes(range(256)) * 4096 + b"records " * 100_000
    for size in (0, 1, 16 * 1024, 128 * 1024, 200 * 1024, 256 * 1024, 300 * 1024):
        frame = bytes(codecs.zstd_compressor(3, library=library)(data[:size]))
        assert bytes(cramjam.zstd.decompress(frame)) == data[:size]
        assert frame[4] & 0xC0 == 0  # the frame header names no content size
        streamed = bytes(codecs.zstd_compressor(3, library="cramjam")(data[:size]))
        assert abs(len(frame) - len(streamed)) <= 8  # the frame's bookkeeping, no more


def test_the_default_levels_are_librdkafkas() -> None:
    assert codecs.DEFAULT_LEVELS == {"gzip": 6, "snappy": None, "lz4": 0, "zstd": 3}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"compression_type": "gzip", "compression_level": 10}, "from 1 to 9"),
        ({"compression_type": "zstd", "compression_level": 0}, "from 1 to 22"),
        ({"compression_type": "snappy", "compression_level": 1}, "has no levels"),
        ({"compression_level": 3}, "needs a compression_type"),
    ],
)
def test_a_bad_level_is_a_configuration_error(options: dict[str, object], match: str) -> None:
    with pytest.raises(pk.ConfigurationError, match=match):
        pk.Producer("kafka://127.0.0.1:1", topic="t", **options)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_large_section_is_compressed_on_the_thread_into_the_same_batch(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from concurrent.futures import Future

    monkeypatch.setattr(record_batch.CompressedEncoder, "OFF_LOOP_FROM", 32 * 1024)
    encoder = record_batch.CompressedEncoder(codec, None)
    try:
        data, end, size = encoder.encode_later(RECORDS, 0, 1 << 20, 0.0)
        assert end == len(RECORDS) and size >= encoder.OFF_LOOP_FROM
        assert isinstance(data, Future) is codecs.compresses_off_the_loop(codec)
        framed = data.result(timeout=30) if isinstance(data, Future) else data
        assert bytes(framed) == bytes(encoder(RECORDS, 0, 1 << 20, 0.0)[0])
        small, end, _ = encoder.encode_later(RECORDS, 0, 1000, 0.0)
        assert not isinstance(small, Future) and end < len(RECORDS)
    finally:
        encoder.close()
