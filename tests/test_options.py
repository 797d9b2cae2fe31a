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
from producerkit._options import ALL_BACKENDS, SPARK_DEFAULTS, ProducerOptions, configurable
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


# ---------------------------------------------------------------------- the Spark sink

#: A value of each setting text can give, as text (``format("producerkit")``'s options) and as
#: the value a keyword takes; topic and the serializers are the sink's to ship, not the worker's.
SETTINGS_AS_TEXT = {
    "max_in_flight_messages": ("10", 10),
    "timeout": ("2.5", 2.5),
    "connections": ("2", 2),
    "partitioner": ("murmur2", "murmur2"),
    "keyless": ("round_robin", "round_robin"),
    "stats_interval": ("1", 1.0),
    "propagate_trace": ("true", True),
    "max_in_flight_bytes": ("1000", 1000),
    "resume_at": ("0.75", 0.75),
    "max_rate": ("100", 100.0),
    "max_bytes_rate": ("1000", 1000.0),
    "rate_burst": ("5", 5.0),
    "spool": ("failed.jsonl", "failed.jsonl"),
}


def test_spark_defaults_name_settings_and_differ_from_theirs() -> None:
    """Where the Spark sink defaults otherwise, it is a ProducerOptions setting, a valid value
    for it, and another value than its own default (else it would not be declared)."""
    assert set(SPARK_DEFAULTS) <= {field.name for field in FIELDS}
    ProducerOptions(**SPARK_DEFAULTS)
    for name, value in SPARK_DEFAULTS.items():
        assert value != attrs.fields_dict(ProducerOptions)[name].default, name


def test_spark_functions_take_exactly_the_settings_and_their_own() -> None:
    """publish() and partition_writer() declare only the sink's own keywords: every Producer
    setting comes from ProducerOptions (their signatures name each with its Spark default),
    on_error being the sink's own ("fail" or "count")."""
    pytest.importorskip("pyspark")
    from producerkit.spark import partition_writer, publish
    from producerkit.spark._publish import SINK_KEYWORDS, spark_default

    settings = {field.name for field in FIELDS}
    functions = {publish: set(), partition_writer: {"counters", "report_path"}}
    for function, extra in functions.items():
        code = function.__code__
        declared = set(
            code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
        )
        assert declared == set(SINK_KEYWORDS) | extra, function
        parameters = inspect.signature(function).parameters
        keywords = {
            name: parameter.default
            for name, parameter in parameters.items()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        }
        assert set(keywords) == settings | set(SINK_KEYWORDS) | extra, function
        for name in settings - {"on_error"}:
            assert keywords[name] == spark_default(name), (function, name)
        assert keywords["max_in_flight_messages"] == SPARK_DEFAULTS["max_in_flight_messages"]
        assert keywords["timeout"] == pk.Producer.__init__.__kwdefaults__["timeout"]


def test_every_setting_reaches_the_spark_sinks_producers() -> None:
    """Each setting text can give reaches the executors' producer from the keywords
    (publish(), partition_writer(), batch_publisher() all go through make_config) and from
    format("producerkit")'s options as text; a setting not given has its Spark default, and a
    mistyped one is refused on the driver, naming the setting it is close to."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, StructField, StructType

    from producerkit.spark._datasource import ProducerkitDataSource
    from producerkit.spark._publish import make_config

    assert {"topic", "value_serializer", "key_serializer", *SETTINGS_AS_TEXT} == {
        field.name for field in configurable()
    }
    values = {name: value for name, (_, value) in SETTINGS_AS_TEXT.items()}
    texts = {name: text for name, (text, _) in SETTINGS_AS_TEXT.items()}
    from_keywords = make_config("null://", topic="t", **values).producer_arguments()
    schema = StructType([StructField("value", BinaryType())])
    source = ProducerkitDataSource({"url": "null://", "topic": "t", **texts})
    from_options = source._config(schema, overwrite=False).sink.producer_arguments()
    assert from_keywords == from_options == values

    defaults = ProducerkitDataSource({"url": "null://", "topic": "t"})
    for arguments in (
        make_config("null://", topic="t").producer_arguments(),
        defaults._config(schema, overwrite=False).sink.producer_arguments(),
    ):
        assert arguments == dict(SPARK_DEFAULTS)

    with pytest.raises(pk.ConfigurationError, match="did you mean 'max_in_flight_messages'"):
        make_config("null://", topic="t", max_inflight_messages=5)
    mistyped = ProducerkitDataSource({"url": "null://", "topic": "t", "time_out": "5"})
    with pytest.raises(pk.ConfigurationError, match="did you mean 'timeout'"):
        mistyped._config(schema, overwrite=False)
