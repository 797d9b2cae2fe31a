"""Every entry point answers an option it does not take with "did you mean" among everything it
takes, lists all of it, and names the backend the option belongs to when it is another's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import producerkit as pk


def test_a_producer_names_the_backend_an_option_belongs_to() -> None:
    with pytest.raises(pk.ConfigurationError) as caught:
        pk.Producer("kafka://127.0.0.1:1", topic="t", fast_ingest=True)
    message = str(caught.value)
    assert "'fast_ingest'" in message and "an option of jetstream://" in message
    assert "Producer settings: " in message and "kafka:// options: " in message
    assert "linger_ms" in message and "max_in_flight_messages" in message


def test_a_producer_lists_its_settings_beside_the_backends_options() -> None:
    with pytest.raises(pk.ConfigurationError, match="did you mean 'partitions'") as caught:
        pk.Producer("memory://", topic="t", partitons=2)
    assert "memory:// options: max_message_size, partitions" in str(caught.value)
    assert "timeout" in str(caught.value)


def test_publish_suggests_the_sinks_own_options() -> None:
    pytest.importorskip("pyspark")
    from producerkit.spark._publish import make_config

    with pytest.raises(pk.ConfigurationError) as caught:
        make_config("kafka://127.0.0.1:1", topic="t", exactlyOnce=True)
    message = str(caught.value)
    assert "did you mean 'exactly_once'" in message
    assert "the Spark sink's options: exactly_once, " in message
    assert "Producer settings: " in message and "kafka:// options: " in message


def test_format_suggests_the_sinks_own_options_among_lowercased_names() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.types import StringType, StructField, StructType

    from producerkit.spark import ProducerkitDataSource

    schema = StructType([StructField("value", StringType())])
    options = {"url": "kafka://127.0.0.1:1", "topic": "t", "exactlyonce": "true"}
    with pytest.raises(pk.ConfigurationError) as caught:
        ProducerkitDataSource(options)._config(schema, overwrite=False)
    message = str(caught.value)
    assert "did you mean 'exactly_once'" in message
    assert "report_path" in message and "exactly_once_log" in message  # format()'s own
    mistyped = {"url": "kafka://127.0.0.1:1", "topic": "t", "fast_ingest": "true"}
    with pytest.raises(pk.ConfigurationError, match="an option of jetstream://"):
        ProducerkitDataSource(mistyped)._config(schema, overwrite=False)


def test_partition_writer_suggests_too() -> None:
    pytest.importorskip("pyspark")
    from producerkit.spark import partition_writer

    with pytest.raises(pk.ConfigurationError, match="did you mean 'key_col'"):
        partition_writer("null://", topic="t", key_column="k")


def test_the_cli_option_flag_names_the_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[Any]
) -> None:
    from producerkit.cli import main

    source = tmp_path / "in.txt"
    source.write_text("a\n")
    argv = [str(source), "--url", "kafka://127.0.0.1:1", "--topic", "t", "-o", "fast_ingest=1"]
    assert main(["produce", *argv]) == 2
    error = capsys.readouterr().err
    assert "an option of jetstream://" in error and "kafka:// options: " in error
