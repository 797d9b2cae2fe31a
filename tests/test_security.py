"""TLS, credentials and redaction against real brokers configured here.

One nats-server with TLS (a CA and server certificate generated below), users with passwords and
per-user publish permissions, and JetStream; one with a token; one requiring client
certificates. Tansu serves no TLS (its --cert/--key are accepted but the listener stays
plaintext), so Kafka TLS is tested as a handshake refused by a plaintext listener plus the
mapping of options; Tansu's --authentication (SCRAM) is tested for refusals.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import pickle
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import producerkit as pk
from producerkit import _security
from producerkit._urls import parse_url
from producerkit.testing.brokers import LocalBroker, free_port, start_nats, tansu_binary

SECRET = "s3cr3t-" + uuid.uuid4().hex[:10]  # alice's password: must never be printed
TOKEN = "tok-" + uuid.uuid4().hex[:12]

pytestmark = pytest.mark.anyio


# ---------------------------------------------------------------------- certificates


def _write_pki(directory: Path, name: str) -> None:
    """``{name}.pem`` (a CA), ``{name}-server.pem/.key`` and ``{name}-client.pem/.key``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def write(stem: str, key: Any, cert: Any) -> None:
        (directory / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"producerkit test {name}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    write(name, ca_key, ca)
    for leaf, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, leaf)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        write(f"{name}-{leaf}", key, cert)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    _write_pki(directory, "ca")
    _write_pki(directory, "other")  # a CA the servers do not use: "untrusted certificate"
    return directory


# ---------------------------------------------------------------------- brokers


def _nats(directory: Path, config: str, jetstream: bool) -> LocalBroker:
    path = directory / "nats.conf"
    path.write_text(config)
    return start_nats(jetstream=jetstream, workdir=directory, extra_args=["-c", str(path)])


@pytest.fixture(scope="module")
def secure_nats(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """TLS; alice may publish to orders(.>) (and use JetStream), bob to anything."""
    config = f"""
tls {{
  cert_file: "{pki}/ca-server.pem"
  key_file: "{pki}/ca-server.key"
  timeout: 2
}}
authorization {{
  users = [
    {{user: alice, password: "{SECRET}", permissions: {{
      publish: {{allow: ["orders", "orders.>", "$JS.API.>"]}},
      subscribe: {{allow: ["_INBOX.>"]}}}}}}
    {{user: bob, password: "bob-pw"}}
  ]
}}
"""
    with _nats(tmp_path_factory.mktemp("nats-tls"), config, jetstream=True) as broker:
        yield broker


@pytest.fixture(scope="module")
def token_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    config = f'authorization {{ token: "{TOKEN}" }}\n'
    with _nats(tmp_path_factory.mktemp("nats-token"), config, jetstream=False) as broker:
        yield broker


@pytest.fixture(scope="module")
def mtls_nats(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    config = f"""
tls {{
  cert_file: "{pki}/ca-server.pem"
  key_file: "{pki}/ca-server.key"
  ca_file: "{pki}/ca.pem"
  verify: true
  timeout: 2
}}
"""
    with _nats(tmp_path_factory.mktemp("nats-mtls"), config, jetstream=False) as broker:
        yield broker


@pytest.fixture(scope="module")
def plain_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with start_nats(jetstream=False, workdir=tmp_path_factory.mktemp("nats-plain")) as broker:
        yield broker


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """Tansu with --authentication (SASL SCRAM required). Its users can only be created by an
    authenticated client and its memory storage starts empty, so only refusals are testable."""
    port = free_port()
    command = [
        tansu_binary(),
        "broker",
        "--listener-url",
        f"tcp://127.0.0.1:{port}",
        "--advertised-listener-url",
        f"tcp://127.0.0.1:{port}",
        "--storage-engine",
        "memory://tansu/",
        "--authentication",
    ]
    directory = tmp_path_factory.mktemp("tansu-sasl")
    with LocalBroker("kafka", command, port, f"kafka://127.0.0.1:{port}", directory, False) as b:
        b.start()
        yield b


def _tls(pki: Path, **extra: Any) -> dict[str, Any]:
    return {"tls_ca_file": str(pki / "ca.pem"), **extra}


def _alice_url(broker: LocalBroker, scheme: str) -> str:
    return f"{scheme}://alice:{SECRET}@{broker.host_port}"


async def _refusal(
    url: str, timeout: float = 10, **options: Any
) -> tuple[pk.ProducerkitError, float]:
    started = time.monotonic()
    with pytest.raises(pk.ProducerkitError) as caught:
        async with pk.Producer(url, topic="orders", timeout=timeout, **options) as producer:
            await producer.produce(b"never")
    return caught.value, time.monotonic() - started


# ---------------------------------------------------------------------- NATS: the good path


async def test_jetstream_tls_password_publishes_and_reads_back(
    secure_nats: LocalBroker, pki: Path
) -> None:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    topic = f"orders.{uuid.uuid4().hex[:8]}"
    url = _alice_url(secure_nats, "jetstream")
    async with pk.Producer(url, topic=topic, create_stream=True, **_tls(pki)) as producer:
        deliveries = [await producer.produce(f"m{i}".encode()) for i in range(20)]
        assert [d.offset for d in deliveries if d] == sorted(d.offset for d in deliveries if d)
    nc = await nats.connect(
        f"nats://{secure_nats.host_port}",
        user="bob",
        password="bob-pw",
        tls=_security.ssl_context(_tls(pki)),
    )
    try:
        js = nc.jetstream()
        stream = await js.find_stream_name_by_subject(topic)
        sub = await js.pull_subscribe(
            topic, stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        stored = [msg.data for msg in await sub.fetch(20, timeout=5)]
    finally:
        await nc.close()
    assert stored == [f"m{i}".encode() for i in range(20)]


async def test_core_nats_tls_password_publishes(secure_nats: LocalBroker, pki: Path) -> None:
    import nats

    received: list[bytes] = []

    async def collect(msg: Any) -> None:
        received.append(msg.data)

    nc = await nats.connect(
        f"nats://{secure_nats.host_port}",
        user="bob",
        password="bob-pw",
        tls=_security.ssl_context(_tls(pki)),
    )
    try:
        sub = await nc.subscribe("orders", cb=collect)
        await nc.flush()
        async with pk.Producer(_alice_url(secure_nats, "nats"), **_tls(pki)) as producer:
            for i in range(10):
                await producer.produce(f"c{i}".encode(), topic="orders", nonblocking=True)
            await producer.flush()
            assert producer.stats.acked == 10
        await anyio.sleep(0.2)
        await sub.unsubscribe()
    finally:
        await nc.close()
    assert received == [f"c{i}".encode() for i in range(10)]


async def test_credentials_from_environment(
    secure_nats: LocalBroker, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRODUCERKIT_USERNAME", "alice")
    monkeypatch.setenv("PRODUCERKIT_PASSWORD", SECRET)
    url = f"jetstream://{secure_nats.host_port}?tls_ca_file={pki / 'ca.pem'}"
    async with pk.Producer(url, topic="orders.env", create_stream=True) as producer:
        delivery = await producer.produce(b"from the environment")
        assert delivery is not None and delivery.offset is not None
        assert "user='alice'" in repr(producer)


async def test_password_precedence_keyword_url_environment(
    secure_nats: LocalBroker, pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which password reaches the server: the keyword beats the URL's, which beats the
    environment's (the server accepts only alice's)."""
    monkeypatch.setenv("PRODUCERKIT_USERNAME", "alice")
    monkeypatch.setenv("PRODUCERKIT_PASSWORD", "wrong-from-env")
    host_port = secure_nats.host_port
    error, _ = await _refusal(f"nats://{host_port}", **_tls(pki))
    assert isinstance(error, pk.AuthenticationError), repr(error)  # the environment's is used
    async with pk.Producer(f"nats://alice:{SECRET}@{host_port}", **_tls(pki)) as producer:
        await producer.produce(b"the URL's password beats the environment's", topic="orders")
    error, _ = await _refusal(f"nats://alice:{SECRET}@{host_port}", password="wrong", **_tls(pki))
    assert isinstance(error, pk.AuthenticationError), repr(error)  # the keyword's is used
    async with pk.Producer(
        f"nats://alice:wrong@{host_port}", password=SECRET, **_tls(pki)
    ) as producer:
        await producer.produce(b"the keyword's password beats the URL's", topic="orders")


async def test_token(token_nats: LocalBroker) -> None:
    async with pk.Producer(f"nats://{token_nats.host_port}", token=TOKEN) as producer:
        await producer.produce(b"x", topic="anything")
    error, elapsed = await _refusal(f"nats://{token_nats.host_port}", token="wrong")
    assert isinstance(error, pk.AuthenticationError) and elapsed < 5
    error, _ = await _refusal(f"nats://{token_nats.host_port}")  # no token at all
    assert isinstance(error, pk.AuthenticationError)


async def test_mutual_tls(mtls_nats: LocalBroker, pki: Path) -> None:
    client = {
        "tls_cert_file": str(pki / "ca-client.pem"),
        "tls_key_file": str(pki / "ca-client.key"),
    }
    async with pk.Producer(f"nats://{mtls_nats.host_port}", **_tls(pki, **client)) as p:
        await p.produce(b"x", topic="mtls")
    error, elapsed = await _refusal(f"nats://{mtls_nats.host_port}", **_tls(pki))
    assert isinstance(error, pk.BrokerUnavailable) and elapsed < 5  # no client certificate


# ---------------------------------------------------------------------- NATS: refusals


@pytest.mark.parametrize("scheme", ["nats", "jetstream"])
async def test_wrong_password(secure_nats: LocalBroker, pki: Path, scheme: str) -> None:
    url = f"{scheme}://alice:wrong@{secure_nats.host_port}"
    error, elapsed = await _refusal(url, **_tls(pki))
    assert isinstance(error, pk.AuthenticationError), repr(error)
    assert elapsed < 5


async def test_untrusted_certificate(secure_nats: LocalBroker, pki: Path) -> None:
    error, elapsed = await _refusal(
        _alice_url(secure_nats, "nats"), tls_ca_file=str(pki / "other.pem")
    )
    assert isinstance(error, pk.TLSError), repr(error)
    assert "not trusted" in str(error) and elapsed < 5


async def test_missing_tls_options_against_tls_server(secure_nats: LocalBroker) -> None:
    error, elapsed = await _refusal(_alice_url(secure_nats, "nats"))
    assert isinstance(error, pk.TLSError), repr(error)
    assert elapsed < 5


async def test_tls_wanted_but_server_has_none_sends_no_password(
    plain_nats: LocalBroker, pki: Path
) -> None:
    """nats-py would upgrade only if the server asked; the password must not go out in clear."""
    error, elapsed = await _refusal(f"nats://alice:{SECRET}@{plain_nats.host_port}", **_tls(pki))
    assert isinstance(error, pk.TLSError), repr(error)
    assert elapsed < 5


@pytest.mark.parametrize("scheme", ["nats", "jetstream"])
async def test_forbidden_subject_fails_with_authorization_error(
    secure_nats: LocalBroker, pki: Path, scheme: str
) -> None:
    options = _tls(pki, create_stream=True) if scheme == "jetstream" else _tls(pki)
    allowed = f"orders.{uuid.uuid4().hex[:8]}"
    async with pk.Producer(
        _alice_url(secure_nats, scheme), topic=allowed, timeout=20, **options
    ) as producer:
        started = time.monotonic()
        for i in range(6):
            topic = "forbidden" if i % 2 else allowed
            await producer.produce(f"{i}".encode(), topic=topic, nonblocking=True)
        with pytest.raises(pk.ProduceError) as caught:
            await producer.flush()
        assert time.monotonic() - started < 5  # refused, not timed out
        failures = caught.value.failures
        assert sorted(f.value for f in failures) == [b"1", b"3", b"5"]
        assert all(isinstance(f.exception, pk.AuthorizationError) for f in failures)
        stats = producer.stats
        assert (stats.acked, stats.failed, stats.in_flight) == (3, 3, 0)
        # The connection stays usable, and a blocking produce raises the typed error.
        with pytest.raises(pk.AuthorizationError):
            await producer.produce(b"again", topic="forbidden")
        assert await producer.produce(b"still fine") is not None


# ---------------------------------------------------------------------- Kafka


async def test_kafka_tls_against_plaintext_listener(kafka_broker: LocalBroker, pki: Path) -> None:
    error, elapsed = await _refusal(kafka_broker.url, **_tls(pki))
    assert isinstance(error, pk.TLSError), repr(error)
    assert elapsed < 10


async def test_kafka_sasl_scram_refused(sasl_kafka: LocalBroker) -> None:
    url = f"kafka://alice:{SECRET}@{sasl_kafka.host_port}"
    error, elapsed = await _refusal(url, sasl_mechanism="SCRAM-SHA-256")
    assert isinstance(error, pk.AuthenticationError), repr(error)
    assert SECRET not in str(error) and elapsed < 10


async def test_kafka_without_credentials_on_authenticating_broker(
    sasl_kafka: LocalBroker,
) -> None:
    error, elapsed = await _refusal(sasl_kafka.url, timeout=4)
    assert isinstance(error, pk.BrokerUnavailable), repr(error)
    assert elapsed < 10


def test_kafka_settings_mapping(pki: Path):
    def settings(url: str, **options: Any) -> dict[str, Any]:
        from producerkit.backends.kafka import KAFKA
        from producerkit.backends.kafka.options import client_settings

        parsed = parse_url(url)
        checked = KAFKA.checked_options(
            _security.merge_credentials(
                parsed.username,
                parsed.password,
                {**parsed.options, **options},
                KAFKA.options,
                environ={},
            )
        )
        return client_settings(checked, timeout=5)

    plain = settings("kafka://h:9092")
    assert "security_protocol" not in plain and "sasl_plain_password" not in plain
    tls = settings(f"kafka://h:9092?tls_ca_file={pki / 'ca.pem'}")
    assert tls["security_protocol"] == "SSL" and isinstance(tls["ssl_context"], ssl.SSLContext)
    assert tls["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    sasl = settings(f"kafka://alice:{SECRET}@h:9092", sasl_mechanism="scram-sha-512")
    assert sasl["security_protocol"] == "SASL_PLAINTEXT"
    assert (sasl["sasl_mechanism"], sasl["sasl_plain_username"]) == ("SCRAM-SHA-512", "alice")
    assert sasl["sasl_plain_password"] == SECRET
    both = settings(
        "kafka://h:9092",
        username="alice",
        password=SECRET,
        tls_verify="false",
        tls_cert_file=str(pki / "ca-client.pem"),
        tls_key_file=str(pki / "ca-client.key"),
    )
    assert both["security_protocol"] == "SASL_SSL" and both["sasl_mechanism"] == "PLAIN"
    assert both["ssl_context"].verify_mode == ssl.CERT_NONE


# ---------------------------------------------------------------------- options and precedence


def test_option_validation(pki: Path):
    ca = str(pki / "ca.pem")
    bad: list[tuple[str, dict[str, Any]]] = [
        ("kafka://h", {"token": SECRET}),
        ("kafka://h", {"creds_file": ca}),
        ("nats://h", {"username": "a", "password": SECRET, "sasl_mechanism": "PLAIN"}),
        ("kafka://h", {"username": "a", "password": SECRET, "sasl_mechanism": "GSSAPI"}),
        ("kafka://h", {"password": SECRET}),
        ("nats://h", {"username": "a", "password": SECRET, "token": SECRET}),
        ("nats://h", {"tls_ca_file": "/no/such/ca.pem"}),
        ("nats://h", {"tls_key_file": ca}),
        ("nats://h", {"tls_verify": "maybe"}),
        ("nats://h", {"password": 12345}),
        (f"nats://h?password={SECRET}", {}),
    ]
    for url, options in bad:
        with pytest.raises(pk.ConfigurationError) as caught:
            pk.Producer(url, **options)
        assert SECRET not in str(caught.value) and "12345" not in str(caught.value), url


def test_precedence_keyword_url_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PRODUCERKIT_USERNAME", "env-user")
    monkeypatch.setenv("PRODUCERKIT_PASSWORD", "env-pw")

    def described(url: str, **kw: Any) -> str:
        """What repr() says of the producer's credentials (never a secret)."""
        return repr(pk.Producer(url, **kw))

    assert "user='env-user'" in described("nats://h")
    assert "user='url-user'" in described("nats://url-user:url-pw@h")
    assert "user='kw'" in described("nats://url-user:url-pw@h", username="kw", password="x")
    token = described("nats://h", token="t")  # a token: no env user/password
    assert " token " in token and "user=" not in token
    assert "user=" not in described("memory://")  # backends without credentials ignore them
    # (which password reaches the server: test_password_precedence_keyword_url_environment)


# ---------------------------------------------------------------------- redaction


def test_redact():
    redact = _security.redact
    assert redact(f"jetstream://alice:{SECRET}@h:4222") == "jetstream://alice:***@h:4222"
    assert redact(f"nats://{TOKEN}@h:4222") == "nats://***@h:4222"
    assert redact(f"kafka://h?password={SECRET}&acks=all") == "kafka://h?password=***&acks=all"
    assert redact(f"{{'token': '{TOKEN}', 'x': 1}}") == "{'token': '***', 'x': 1}"
    assert redact(f"said {SECRET} twice", secrets=[SECRET]) == "said *** twice"
    pem = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----"
    assert redact(f"key: {pem}.") == "key: ***."
    mapping = {"password": SECRET, "sasl_plain_password": SECRET, "url": f"nats://a:{SECRET}@h"}
    assert SECRET not in repr(redact(mapping))
    assert redact({"nested": [{"token": _security.Secret(TOKEN)}]}) == {
        "nested": [{"token": "***"}]
    }
    secret = _security.Secret(SECRET)
    assert repr(secret) == str(secret) == f"{secret}" == "***"
    assert pickle.loads(pickle.dumps(secret)).reveal() == SECRET  # Spark ships options pickled


def test_reprs_show_no_secret(pki: Path):
    url = f"jetstream://alice:{SECRET}@127.0.0.1:4222?tls_ca_file={pki / 'ca.pem'}"
    producer = pk.Producer(url, topic="orders")
    parsed = parse_url(f"nats://alice:{SECRET}@h?password={SECRET}")
    texts = [repr(producer), str(producer), repr(producer.settings), repr(parsed), str(parsed)]
    with pk.SyncProducer("memory://", topic="t") as sync:
        texts.append(repr(sync))
    for text in texts:
        assert SECRET not in text, text
    assert "tls user='alice'" in repr(producer)


# ---------------------------------------------------------------------- the leak test


async def test_secret_appears_nowhere(
    secure_nats: LocalBroker, pki: Path, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A full produce, refusals and failures at DEBUG on every logger, with all output captured."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(name) for name in ("", "producerkit", "aiokafka", "nats")]
    levels = [log.level for log in loggers]
    root = logging.getLogger()
    root.addHandler(handler)
    for log in loggers:
        log.setLevel(logging.DEBUG)
    texts: list[str] = []

    async def main() -> None:
        url = _alice_url(secure_nats, "jetstream")
        topic = f"orders.{uuid.uuid4().hex[:8]}"
        async with pk.Producer(url, topic=topic, create_stream=True, **_tls(pki)) as producer:
            texts.append(repr(producer))
            print(producer, producer.stats, producer.backend, producer.backend.options)
            for i in range(50):
                await producer.produce(f"v{i}".encode(), nonblocking=True)
            await producer.produce(b"no", topic="forbidden", nonblocking=True)
            try:
                await producer.flush()
            except pk.ProduceError as exc:
                texts.extend(_exception_texts(exc))
                texts.extend(repr(f) for f in exc.failures)
        for attempt in (
            _refusal(f"nats://alice:{SECRET}x@{secure_nats.host_port}", **_tls(pki)),
            _refusal(_alice_url(secure_nats, "nats"), tls_ca_file=str(pki / "other.pem")),
            _refusal(_alice_url(secure_nats, "nats")),
            _refusal(f"kafka://alice:{SECRET}@127.0.0.1:{free_port()}", timeout=2),
        ):
            error, _ = await attempt
            texts.extend(_exception_texts(error))
        for bad in ({"password": SECRET}, {"tls_verify": SECRET}, {"token": SECRET}):
            try:
                pk.Producer(f"kafka://h?x={SECRET}", **bad)
            except pk.ProducerkitError as exc:
                texts.extend(_exception_texts(exc))

    try:
        await main()
    finally:
        root.removeHandler(handler)
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)
    out, err = capfd.readouterr()
    assert any("nats" in record for record in records)  # DEBUG capture did see the clients
    everything = {
        "logs": "\n".join(records),
        "stdout": out,
        "stderr": err,
        "texts": "\n".join(texts),
    }
    for where, text in everything.items():
        assert SECRET not in text, f"the secret leaked into {where}"


def _exception_texts(exc: BaseException) -> list[str]:
    import traceback

    texts = ["".join(traceback.format_exception(exc)), repr(exc)]
    for failure in getattr(exc, "failures", ()):
        texts.extend(["".join(traceback.format_exception(failure.exception)), repr(failure)])
    return texts


def test_bench_json_and_output_show_no_secret(secure_nats: LocalBroker, pki: Path, tmp_path: Path):
    out = tmp_path / "bench.json"
    argv = [
        "-m", "producerkit", "bench", "--url", _alice_url(secure_nats, "jetstream"),
        "--topic", "orders.bench", "--num-records", "200", "--rate", "0",
        "--warmup-records", "10", "--json", str(out),
        "-o", f"tls_ca_file={pki / 'ca.pem'}", "--quiet",
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert SECRET not in run.stdout and SECRET not in run.stderr
    assert SECRET not in out.read_text()
    assert json.loads(out.read_text())  # it did write a result
