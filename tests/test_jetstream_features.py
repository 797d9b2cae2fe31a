"""JetStream expectations, refusal codes, duplicates and PubAcks reported a read at a time.

The behaviour tests run on the session's nats-server on both client paths (fast and public).
``produce(expect=...)`` and the raw ``Nats-Expected-*`` headers it stands for are both used.
"""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import producerkit as pk
from producerkit.backends import _clients
from producerkit.backends.nats.errors import EXPECTATION_CODES, translate
from producerkit.backends.nats.pubacks import is_plain, puback_duplicate, puback_error
from producerkit.jetstream import EXPECTED_HEADERS
from producerkit.testing.pytest_plugin import NatsSessionBroker

# --------------------------------------------------------------------------- Expect


def test_expect_gives_the_nats_expected_headers() -> None:
    expect = pk.Expect(
        stream="ORDERS", last_sequence=0, last_subject_sequence=41, last_msg_id="order-7"
    )
    assert expect.header_pairs() == (
        ("Nats-Expected-Stream", b"ORDERS"),
        ("Nats-Expected-Last-Sequence", b"0"),
        ("Nats-Expected-Last-Subject-Sequence", b"41"),
        ("Nats-Expected-Last-Msg-Id", b"order-7"),
    )
    assert pk.Expect(last_subject_sequence=3).header_pairs() == (
        ("Nats-Expected-Last-Subject-Sequence", b"3"),
    )
    assert pk.Expect().header_pairs() == ()
    assert {name for name, _ in expect.header_pairs()} == set(EXPECTED_HEADERS)


@pytest.mark.parametrize(
    "arguments",
    [
        {"last_sequence": -1},
        {"last_sequence": 2**64},
        {"last_sequence": True},
        {"last_sequence": "3"},
        {"last_subject_sequence": 1.0},
        {"stream": ""},
        {"stream": "orders.eu"},
        {"stream": "my stream"},
        {"stream": "a>"},
        {"stream": 7},
        {"last_msg_id": ""},
        {"last_msg_id": "a\r\nb"},
        {"last_msg_id": 12},
    ],
)
def test_a_bad_expectation_is_a_message_error_at_construction(arguments: dict[str, Any]) -> None:
    with pytest.raises(pk.MessageError, match=r"Expect\("):
        pk.Expect(**arguments)


def test_expect_is_frozen() -> None:
    expect = pk.Expect(last_sequence=1)
    with pytest.raises(AttributeError):
        expect.last_sequence = 2  # type: ignore[misc]


# --------------------------------------------------------------------------- codes and PubAcks


def refusal(code: int, description: str) -> bytes:
    return b'{"error":{"code":400,"err_code":%d,"description":"%s"},"stream":"S","seq":0}' % (
        code,
        description.encode(),
    )


@pytest.mark.parametrize(
    ("code", "description"),
    [
        (10071, "wrong last sequence: 2"),
        (10164, "wrong last sequence"),
        (10070, "wrong last msg ID: permission-maximum"),  # the id's words must not count
        (10060, "expected stream does not match"),
    ],
)
def test_a_failed_expectation_is_expectation_failed_with_its_code(
    code: int, description: str
) -> None:
    error = puback_error("orders", refusal(code, description), None)
    assert type(error) is pk.ExpectationFailed
    assert isinstance(error, pk.DeliveryError)
    assert error.code == code
    assert description in str(error)


def test_other_refusals_keep_their_code() -> None:
    error = puback_error("orders", refusal(10077, "store failed"), None)
    assert type(error) is pk.DeliveryError and error.code == 10077
    no_stream = puback_error("orders", b"", {"Status": "503"})
    assert type(no_stream) is pk.DeliveryError and no_stream.code is None
    assert pk.DeliveryError("plain").code is None


def test_nats_py_api_errors_keep_their_code() -> None:
    import nats.js.errors

    error = translate(nats.js.errors.BadRequestError(code=400, err_code=10071, description="x"))
    assert type(error) is pk.ExpectationFailed and error.code == 10071
    other = translate(nats.js.errors.APIError(code=500, err_code=10077, description="y"))
    assert type(other) is pk.DeliveryError and other.code == 10077
    no_code = translate(nats.js.errors.APIError())
    assert type(no_code) is pk.DeliveryError and no_code.code is None


def test_the_code_survives_pickling() -> None:
    error = pickle.loads(pickle.dumps(pk.ExpectationFailed("wrong last sequence", code=10071)))
    assert type(error) is pk.ExpectationFailed and error.code == 10071
    assert str(error) == "wrong last sequence"


def test_a_duplicate_puback_is_read_as_one() -> None:
    assert puback_duplicate(b'{"stream":"S","seq":2,"duplicate": true}')
    assert puback_duplicate(b'{"stream":"S","seq":2,"duplicate":true}')
    assert not puback_duplicate(b'{"stream":"S","seq":2}')
    assert not puback_duplicate(b'{"stream":"duplicate","seq":2}')
    assert not is_plain(b'{"stream":"S","seq":2,"duplicate": true}')
    assert not is_plain(refusal(10071, "wrong last sequence: 2"))
    assert not is_plain(b"")
    assert is_plain(b'{"stream":"S","seq":2}')
    assert {10060, 10070, 10071, 10164} == EXPECTATION_CODES


# --------------------------------------------------------------------------- retry_kwargs


def failure_with(exception: BaseException) -> pk.Failure:
    headers = {"trace": b"t1", **dict(pk.Expect(last_subject_sequence=4).header_pairs())}
    return pk.Failure(b"v", b"k", "orders.1", headers, None, "id-1", exception)


def test_retry_kwargs_keeps_the_expectations_of_a_message_that_may_have_been_stored() -> None:
    kwargs = failure_with(pk.ProduceTimeout("late")).retry_kwargs()
    assert kwargs == {
        "key": b"k",
        "topic": "orders.1",
        "headers": {"trace": b"t1", "Nats-Expected-Last-Subject-Sequence": b"4"},
        "msg_id": "id-1",
    }


def test_retry_kwargs_never_resends_a_conflict_blindly() -> None:
    conflict = pk.ExpectationFailed("wrong last sequence: 9", code=10071)
    failure = failure_with(conflict)
    with pytest.raises(pk.ExpectationFailed, match="not resent") as raised:
        failure.retry_kwargs()
    assert raised.value.code == 10071 and raised.value.__cause__ is conflict
    kwargs = failure.retry_kwargs(drop_expectations=True)
    assert kwargs["headers"] == {"trace": b"t1"}
    assert kwargs["msg_id"] == "id-1"
    only_expectations = pk.Failure(
        b"v", None, "t", dict(pk.Expect(last_sequence=1).header_pairs()), None, None, conflict
    )
    assert only_expectations.retry_kwargs(drop_expectations=True)["headers"] is None


# --------------------------------------------------------------------------- on nats-server


@pytest.fixture(params=[_clients.FAST, _clients.PUBLIC])
def client_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv(_clients.PATH_VARIABLE, request.param)
    yield request.param


@pytest.fixture
def jetstream_url(nats_broker: NatsSessionBroker) -> str:
    return nats_broker.jetstream_url


def subject() -> str:
    return f"js-{uuid.uuid4().hex[:12]}"


@pytest.mark.anyio
async def test_a_wrong_expected_last_sequence_fails_with_code_10071(
    jetstream_url: str, client_path: str
) -> None:
    topic = subject()

    async with pk.Producer(jetstream_url, topic=topic, create_stream=True) as producer:
        assert producer.backend.client_path == client_path
        first = await producer.produce(b"1", expect=pk.Expect(last_sequence=0))
        assert first is not None and first.offset == 1
        with pytest.raises(pk.ExpectationFailed) as raised:
            await producer.produce(b"2", expect=pk.Expect(last_sequence=0))
        assert raised.value.code == 10071
        # Nonblocking: the failure is in flush()'s ProduceError, and not resent blindly.
        await producer.produce(b"3", expect=pk.Expect(last_sequence=7), nonblocking=True)
        with pytest.raises(pk.ProduceError) as flushed:
            await producer.flush()
        (failure,) = flushed.value.failures
        assert isinstance(failure.exception, pk.ExpectationFailed)
        assert failure.exception.code == 10071
        assert failure.headers == {"Nats-Expected-Last-Sequence": b"7"}
        with pytest.raises(pk.ExpectationFailed):
            failure.retry_kwargs()
        retried = await producer.produce(
            failure.value, **failure.retry_kwargs(drop_expectations=True)
        )
        assert retried is not None and retried.offset == 2
        stats = producer.stats
        assert (stats.acked, stats.failed, stats.in_flight) == (2, 2, 0)


@pytest.mark.anyio
async def test_each_expectation_is_checked_by_the_server(
    jetstream_url: str, client_path: str
) -> None:
    topic = subject()

    async def produce(producer: pk.Producer, expect: pk.Expect, **kwargs: Any) -> int | None:
        try:
            delivery = await producer.produce(b"v", expect=expect, **kwargs)
        except pk.ExpectationFailed as error:
            return error.code
        assert delivery is not None
        return 0

    async with pk.Producer(jetstream_url, topic=topic, create_stream=True) as producer:
        stream = topic  # create_stream names the stream after its subject
        assert await produce(producer, pk.Expect(last_subject_sequence=0), msg_id="a") == 0
        assert await produce(producer, pk.Expect(last_subject_sequence=0)) == 10071
        assert await produce(producer, pk.Expect(last_subject_sequence=1)) == 0
        assert await produce(producer, pk.Expect(last_msg_id="zz")) == 10070
        assert await produce(producer, pk.Expect(stream="ANOTHER")) == 10060
        assert await produce(producer, pk.Expect(stream=stream, last_sequence=2)) == 0
        with pytest.raises(pk.ExpectationFailed) as raised:  # raw headers: the same check
            await producer.produce(b"v", headers={"Nats-Expected-Last-Sequence": "2"})
        assert raised.value.code == 10071


@pytest.mark.anyio
async def test_a_repeated_msg_id_is_a_duplicate_delivery(
    jetstream_url: str, client_path: str
) -> None:
    topic = subject()

    async with pk.Producer(jetstream_url, topic=topic, create_stream=True) as producer:
        first = await producer.produce(b"v", msg_id="order-1")
        again = await producer.produce(b"v", msg_id="order-1")
        other = await producer.produce(b"w", msg_id="order-2")
        assert first is not None and again is not None and other is not None
        assert (first.offset, first.duplicate) == (1, False)
        assert (again.offset, again.duplicate) == (1, True)
        assert (other.offset, other.duplicate) == (2, False)
        # Nonblocking duplicates are acked (counted once each), not failed.
        for _ in range(50):
            await producer.produce(b"v", msg_id="order-1", nonblocking=True)
        await producer.flush()
        assert (producer.stats.acked, producer.stats.failed) == (53, 0)


@pytest.mark.anyio
async def test_pubacks_read_together_are_one_outcome_per_subject(
    jetstream_url: str, client_path: str
) -> None:
    """Messages to two subjects, alternating: the hook sees every message once, in fewer
    Outcomes than messages, and each Outcome holds one subject's messages only."""
    topics = (subject(), subject())
    outcomes: list[pk.Outcome] = []
    count = 4000

    async with pk.Producer(
        jetstream_url, topic=topics[0], create_stream=True, on_outcome=outcomes.append
    ) as producer:
        for topic in topics:  # the streams first, so that nothing below waits for one
            await producer.produce(b"warm-up", topic=topic)
        outcomes.clear()
        first = producer.stats.produced + 1  # the number of the first message below
        for i in range(count):
            await producer.produce(b"%d" % i, topic=topics[i % 2], nonblocking=True)
        await producer.flush()
    numbers = sorted(number for outcome in outcomes for number in outcome.numbers)
    assert numbers == list(range(first, first + count))
    assert all(outcome.acked for outcome in outcomes)
    assert len(outcomes) < count
    for outcome in outcomes:
        parity = (outcome.numbers[0] - first) % 2
        assert outcome.topic == topics[parity]
        assert all((number - first) % 2 == parity for number in outcome.numbers)
