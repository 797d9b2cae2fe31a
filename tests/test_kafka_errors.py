"""Kafka errors a new user meets in the first hour, each naming its cause: an idempotent
producer against a broker that grants it no producer id, an unreachable or unresolvable bootstrap
server, a misspelt option; and OAUTHBEARER's mapping to aiokafka (no local broker speaks it)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import producerkit as pk
from producerkit.backends.kafka import options as kafka_options
from producerkit.testing.pytest_plugin import SessionBroker

pytestmark = pytest.mark.anyio


async def test_idempotence_without_a_producer_id_names_the_cause(
    kafka_broker: SessionBroker, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the public path the producer id is aiokafka's to ask for, with InitProducerId v0,
    which Tansu does not grant (it grants v3 and later, as the fast path asks)."""
    monkeypatch.setenv("PRODUCERKIT_CLIENT_PATH", "public")
    producer = pk.Producer(kafka_broker.url, topic=topic, enable_idempotence=True, timeout=5)
    with pytest.raises(pk.ConfigurationError) as raised:
        async with producer:
            await producer.produce(b"v")
    assert "InitProducerId" in str(raised.value) and "enable_idempotence" in str(raised.value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_refused_connection_says_refused() -> None:
    port = free_port()
    with pytest.raises(pk.BrokerUnavailable) as raised:
        async with pk.Producer(f"kafka://127.0.0.1:{port}", topic="t", timeout=5):
            pass
    message = str(raised.value)
    assert f"127.0.0.1:{port}: connection refused" in message
    assert "KafkaConnectionError: KafkaConnectionError" not in message


async def test_an_unknown_host_says_dns() -> None:
    with pytest.raises(
        pk.BrokerUnavailable, match=r"cannot resolve host 'no-such-host\.invalid' \(DNS"
    ):
        async with pk.Producer("kafka://no-such-host.invalid:9092", topic="t", timeout=5):
            pass


@pytest.mark.parametrize(
    ("url", "misspelt", "meant"),
    [
        ("kafka://127.0.0.1:9092", "lingr_ms", "linger_ms"),
        ("kafka://127.0.0.1:9092", "compresion_type", "compression_type"),
        ("jetstream://127.0.0.1:4222", "create_streams", "create_stream"),
        ("memory://", "partition", "partitions"),
    ],
)
def test_an_unknown_option_says_did_you_mean(url: str, misspelt: str, meant: str) -> None:
    """The backend's option is among the guesses (a Producer setting as close may come first:
    ``partition`` names both ``partitioner`` and memory's ``partitions``)."""
    with pytest.raises(pk.ConfigurationError, match=f"did you mean [^?]*{meant!r}"):
        pk.Producer(url, topic="t", **{misspelt: 1})


def test_an_option_like_none_gets_no_guess() -> None:
    with pytest.raises(pk.ConfigurationError) as raised:
        pk.Producer("kafka://127.0.0.1:9092", topic="t", zzzzzz=1)
    assert "did you mean" not in str(raised.value)


# ---------------------------------------------------------------------- OAUTHBEARER


def settings_for(**options: Any) -> dict[str, Any]:
    checked = kafka_options.check_options(options)
    return kafka_options.client_settings(checked, 30.0)


async def test_oauthbearer_maps_a_callable_to_aiokafkas_token_provider() -> None:
    from aiokafka.abc import AbstractTokenProvider

    async def fetch() -> str:
        return "async-token"

    for provider, token in ((lambda: "plain-token", "plain-token"), (fetch, "async-token")):
        settings = settings_for(sasl_oauth_token_provider=provider)
        assert settings["sasl_mechanism"] == "OAUTHBEARER"
        assert settings["security_protocol"] == "SASL_PLAINTEXT"
        mapped = settings["sasl_oauth_token_provider"]
        assert isinstance(mapped, AbstractTokenProvider)
        assert await mapped.token() == token
        assert "sasl_plain_username" not in settings


def test_oauthbearer_passes_aiokafkas_own_provider_through(tmp_path: Any) -> None:
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):  # type: ignore[misc]
        async def token(self) -> str:
            return "t"

    provider = Provider()
    settings = settings_for(sasl_mechanism="oauthbearer", sasl_oauth_token_provider=provider)
    assert settings["sasl_oauth_token_provider"] is provider
    assert settings["sasl_mechanism"] == "OAUTHBEARER"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sasl_mechanism": "OAUTHBEARER"}, "needs sasl_oauth_token_provider"),
        (
            {"sasl_oauth_token_provider": "a-token-in-a-url"},
            "must be a callable returning the access token",
        ),
        (
            {"sasl_mechanism": "PLAIN", "sasl_oauth_token_provider": lambda: "t"},
            "is for OAUTHBEARER",
        ),
        (
            {"username": "u", "password": "p", "sasl_oauth_token_provider": lambda: "t"},
            "give no username/password",
        ),
    ],
)
def test_oauthbearer_misconfigurations_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(pk.ConfigurationError, match=message) as raised:
        pk.Producer("kafka://127.0.0.1:9092", topic="t", **options)
    assert "a-token-in-a-url" not in str(raised.value)


def test_oauthbearer_is_kafka_only() -> None:
    with pytest.raises(pk.ConfigurationError, match="not used by nats"):
        pk.Producer("nats://127.0.0.1:4222", topic="t", sasl_oauth_token_provider=lambda: "t")


def test_a_producer_with_a_token_provider_shows_no_token() -> None:
    producer = pk.Producer(
        "kafka://127.0.0.1:9092", topic="t", sasl_oauth_token_provider=lambda: "s3cr3t"
    )
    assert "oauthbearer" in repr(producer) and "s3cr3t" not in repr(producer)
