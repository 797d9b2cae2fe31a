"""One settings source: ProducerOptions declares every Producer setting, and Producer's keywords,
the environment/TOML loader, the Spark sink's options and ``producerkit produce``'s flags agree
with it."""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import pytest

import producerkit as pk
from producerkit import settings
from producerkit._options import ALL_BACKENDS, ProducerOptions, configurable
from producerkit.spark._worker import SinkConfig

FIELDS = attrs.fields(ProducerOptions)


def test_producer_keywords_are_the_settings_with_their_defaults() -> None:
    parameters = inspect.signature(pk.Producer).parameters
    keywords = {
        name: parameter.default
        for name, parameter in parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keywords == {field.name: field.default for field in FIELDS}
    assert next(iter(parameters)) == "url" and list(parameters)[-1] == "options"


def test_every_setting_has_a_one_line_doc_and_its_backends() -> None:
    for field in FIELDS:
        doc = field.metadata["doc"]
        assert doc and "\n" not in doc and len(doc) < 100, field.name
        assert field.metadata["backends"] <= ALL_BACKENDS and field.metadata["backends"]


def test_the_settings_loader_reads_every_setting_text_can_give() -> None:
    assert set(settings.SETTINGS) == {"url"} | {field.name for field in configurable()}
    callables = {field.name for field in FIELDS if field.metadata["text"] is None}
    assert callables == {"on_error", "on_delivery", "on_outcome", "on_stats"}


@pytest.mark.parametrize(
    ("variable", "text", "name", "value"),
    [
        ("PRODUCERKIT_MAX_IN_FLIGHT_BYTES", "1000", "max_in_flight_bytes", 1000),
        ("PRODUCERKIT_RESUME_AT", "0.9", "resume_at", 0.9),
        ("PRODUCERKIT_PROPAGATE_TRACE", "true", "propagate_trace", True),
        ("PRODUCERKIT_VALUE_SERIALIZER", "json", "value_serializer", "json"),
    ],
)
def test_settings_come_from_the_environment_as_their_types(
    variable: str, text: str, name: str, value: Any
) -> None:
    loaded = settings.load(environ={"PRODUCERKIT_URL": "null://", variable: text})
    assert loaded[name] == value


def test_a_bad_setting_from_text_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(pk.ConfigurationError, match=r"PRODUCERKIT_RESUME_AT.*resume_at"):
        settings.load(environ={"PRODUCERKIT_URL": "null://", "PRODUCERKIT_RESUME_AT": "most"})


def test_the_spark_sink_takes_every_setting_text_can_give_as_strings() -> None:
    texts = {
        "max_in_flight_messages": "10",
        "timeout": "2.5",
        "connections": "2",
        "partitioner": "murmur2",
        "keyless": "round_robin",
        "stats_interval": "1",
        "propagate_trace": "false",
        "max_in_flight_bytes": "1000",
        "resume_at": "0.75",
        "max_rate": "100",
        "max_bytes_rate": "1000",
        "rate_burst": "5",
    }
    assert set(texts) | {"topic", "value_serializer", "key_serializer", "spool"} == {
        field.name for field in configurable()
    }
    config = SinkConfig(url="null://", topic="t", producer_kwargs=tuple(texts.items()))
    arguments = config.producer_arguments()
    for name in texts:
        kind = attrs.fields_dict(ProducerOptions)[name].metadata["text"]
        assert type(arguments[name]) is kind, name
    pk.Producer("null://", topic="t", **arguments)  # each one taken
