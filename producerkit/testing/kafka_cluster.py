"""A multi-broker Kafka cluster in this process, for tests: librdkafka's mock cluster.

:class:`KafkaCluster` starts the mock cluster librdkafka carries (``rdkafka_mock.h``), from the
librdkafka shared library bundled in the confluent-kafka wheel, through ctypes: N brokers with
ids 1..N, each on a loopback port of its own, speaking the Kafka protocol well enough for
aiokafka, confluent-kafka and producerkit to produce to it and read from it. Tests then move
partition leaders, take brokers down and up, slow a broker's responses, and make the next
requests of a kind fail with the Kafka error codes they name, which a single Tansu cannot do.

What the mock models: topics with partitions and leaders (a Metadata request creates an unknown
topic, 4 partitions; :meth:`KafkaCluster.create_topic` makes others), producer ids for idempotent
and transactional producers, transactions, coordinators, consumer groups and offsets. What it
does not: it checks sequence numbers only for transactional producers (an idempotent producer's
duplicate or gap is stored as it came), it does not hide a transaction's records from a
``read_committed`` consumer before the commit (librdkafka 2.16), and it does not fence a
producer whose transactional id another producer initialized again. A request failed by
:meth:`KafkaCluster.fail_requests` writes none of its records. What a ``read_committed``
consumer is served, fencing and idempotent deduplication are judged on Apache Kafka itself
(``producerkit.testing.apache_kafka.ApacheKafka``).

Nothing is imported until a cluster is made: confluent-kafka (``pip install
"producerkit[pytest]"``) is needed then, and its absence is a
:class:`~producerkit.errors.MissingDependencyError` with that install line.
"""

from __future__ import annotations

import ctypes
import difflib
import glob
import importlib.util
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, Self

from producerkit.errors import ConfigurationError, MissingDependencyError

if TYPE_CHECKING:
    from producerkit.testing.proxy import FaultProxy

__all__ = [
    "API_KEYS",
    "ERROR_CODES",
    "KafkaCluster",
    "KafkaClusterError",
    "KafkaRecord",
    "api_key",
    "error_code",
]

_INSTALL: Final = 'pip install "producerkit[pytest]"'

#: Kafka request types by name, to their API key: what :meth:`KafkaCluster.fail_requests` takes.
API_KEYS: Final[Mapping[str, int]] = {
    "Produce": 0,
    "Fetch": 1,
    "ListOffsets": 2,
    "Metadata": 3,
    "OffsetCommit": 8,
    "OffsetFetch": 9,
    "FindCoordinator": 10,
    "JoinGroup": 11,
    "Heartbeat": 12,
    "LeaveGroup": 13,
    "SyncGroup": 14,
    "ApiVersions": 18,
    "InitProducerId": 22,
    "AddPartitionsToTxn": 24,
    "AddOffsetsToTxn": 25,
    "EndTxn": 26,
    "TxnOffsetCommit": 28,
}

#: Kafka error codes by name (the protocol's names), as :meth:`KafkaCluster.fail_requests`
#: takes them; any other code may be given as an int.
ERROR_CODES: Final[Mapping[str, int]] = {
    "NONE": 0,
    "OFFSET_OUT_OF_RANGE": 1,
    "CORRUPT_MESSAGE": 2,
    "UNKNOWN_TOPIC_OR_PARTITION": 3,
    "LEADER_NOT_AVAILABLE": 5,
    "NOT_LEADER_OR_FOLLOWER": 6,
    "REQUEST_TIMED_OUT": 7,
    "BROKER_NOT_AVAILABLE": 8,
    "MESSAGE_TOO_LARGE": 10,
    "NETWORK_EXCEPTION": 13,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "NOT_COORDINATOR": 16,
    "NOT_ENOUGH_REPLICAS": 19,
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
    "TOPIC_AUTHORIZATION_FAILED": 29,
    "CLUSTER_AUTHORIZATION_FAILED": 31,
    "UNSUPPORTED_VERSION": 35,
    "TOPIC_ALREADY_EXISTS": 36,
    "OUT_OF_ORDER_SEQUENCE_NUMBER": 45,
    "DUPLICATE_SEQUENCE_NUMBER": 46,
    "INVALID_PRODUCER_EPOCH": 47,
    "INVALID_TXN_STATE": 48,
    "INVALID_PRODUCER_ID_MAPPING": 49,
    "CONCURRENT_TRANSACTIONS": 51,
    "TRANSACTION_COORDINATOR_FENCED": 52,
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": 53,
    "KAFKA_STORAGE_ERROR": 56,
    "UNKNOWN_PRODUCER_ID": 59,
    "FENCED_LEADER_EPOCH": 74,
    "UNKNOWN_LEADER_EPOCH": 75,
    "THROTTLING_QUOTA_EXCEEDED": 89,
    "PRODUCER_FENCED": 90,
}

#: librdkafka's own code for "drop the connection" (RD_KAFKA_RESP_ERR__TRANSPORT): given to
#: :meth:`KafkaCluster.fail_requests` as ``"DISCONNECT"``, the broker closes the connection the
#: request came on instead of answering it.
_TRANSPORT: Final = -195

#: The APIs :meth:`KafkaCluster.reset` clears the injected errors of, besides those a test used.
_RESET_APIS: Final = tuple(API_KEYS.values())

_RD_KAFKA_PRODUCER: Final = 0


class KafkaClusterError(ConfigurationError):
    """The mock cluster refused a call: ``code`` is librdkafka's error code, ``name`` its name
    (``TOPIC_ALREADY_EXISTS``, ``_INVALID_ARG``...)."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name


@dataclass(frozen=True)
class KafkaRecord:
    """One record :meth:`KafkaCluster.read` read back. ``headers`` are in order, repeats kept;
    ``timestamp`` is in epoch milliseconds."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp: int | None = None


def _library_path() -> str:
    """The librdkafka shared library of the installed confluent-kafka wheel."""
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is None or spec.origin is None:
        raise MissingDependencyError(
            f"KafkaCluster runs librdkafka's mock cluster from confluent-kafka: {_INSTALL}"
        )
    site = os.path.dirname(os.path.dirname(spec.origin))
    found = sorted(
        glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*"))
        + glob.glob(os.path.join(site, "confluent_kafka", ".dylibs", "librdkafka*.dylib"))
        + glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.dll"))
    )
    if not found:
        raise MissingDependencyError(
            "KafkaCluster found no librdkafka bundled with confluent-kafka (one built from "
            f"source against a system librdkafka has none): {_INSTALL}, from a wheel"
        )
    return found[0]


@cache
def _librdkafka() -> ctypes.CDLL:
    """librdkafka, loaded once, with the signatures of the functions used here."""
    lib = ctypes.CDLL(_library_path())
    vp, cp, i32, i16 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int16
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        "rd_kafka_conf_destroy": (None, [vp]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_err2name": (cp, [ctypes.c_int]),
        "rd_kafka_err2str": (cp, [ctypes.c_int]),
        "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
        "rd_kafka_mock_cluster_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_partition_set_leader": (ctypes.c_int, [vp, cp, i32, i32]),
        "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, i32]),
        "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, i32]),
        "rd_kafka_mock_broker_set_rtt": (ctypes.c_int, [vp, i32, ctypes.c_int]),
        "rd_kafka_mock_push_request_errors_array": (
            None,
            [vp, i16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)],
        ),
        "rd_kafka_mock_clear_request_errors": (None, [vp, i16]),
        "rd_kafka_mock_coordinator_set": (ctypes.c_int, [vp, cp, cp, i32]),
        "rd_kafka_mock_broker_set_host_port": (None, [vp, i32, cp, ctypes.c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _header_pairs(
    headers: Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]] | None,
) -> list[tuple[str, bytes | None]]:
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return [(name, _as_bytes(value)) for name, value in pairs]


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word.upper(), [c.upper() for c in choices], n=1)
    if not close:
        return ""
    original = next(c for c in choices if c.upper() == close[0])
    return f" (did you mean {original!r}?)"


def api_key(api: str | int) -> int:
    """The API key of a request type given by name (``"Produce"``, see :data:`API_KEYS`;
    case-insensitive) or as the key itself."""
    if isinstance(api, int) and not isinstance(api, bool):
        if not 0 <= api <= 0x7FFF:
            raise ConfigurationError(f"a Kafka API key is 0..32767, got {api}")
        return api
    if isinstance(api, str):
        for name, key in API_KEYS.items():
            if name.lower() == api.lower():
                return key
        raise ConfigurationError(
            f"unknown Kafka API {api!r}{_did_you_mean(api, API_KEYS)}: "
            f"one of {', '.join(API_KEYS)}, or its API key as an int"
        )
    raise ConfigurationError(f"a Kafka API is a name or an int, not {type(api).__name__}")


def error_code(error: str | int) -> int:
    """The Kafka error code given by name (``"NOT_LEADER_OR_FOLLOWER"``, see
    :data:`ERROR_CODES`; case-insensitive; ``"DISCONNECT"`` drops the connection) or as the
    code itself."""
    if isinstance(error, int) and not isinstance(error, bool):
        return error
    if isinstance(error, str):
        name = error.upper()
        if name == "DISCONNECT":
            return _TRANSPORT
        if name in ERROR_CODES:
            return ERROR_CODES[name]
        raise ConfigurationError(
            f"unknown Kafka error {error!r}{_did_you_mean(error, [*ERROR_CODES, 'DISCONNECT'])}"
            ": a name of producerkit.testing.kafka_cluster.ERROR_CODES, or the code as an int"
        )
    raise ConfigurationError(f"a Kafka error is a name or an int, not {type(error).__name__}")


class KafkaCluster:
    """librdkafka's mock Kafka cluster of ``brokers`` brokers (ids 1..N), started at once.

    Give a client :attr:`url` (producerkit) or :attr:`bootstrap` (aiokafka, confluent-kafka).
    Every method may be called from any thread (the mock runs on librdkafka's threads; a call
    returns once the mock applied it); a blocking one (:meth:`read`, :meth:`partition_leaders`)
    belongs in a thread when called from async code (``anyio.to_thread.run_sync``).
    :meth:`close` (or leaving a ``with`` block) stops it; a closed cluster refuses every call.

    :meth:`advertise` puts a listener of your own (a proxy, a recorder) in a broker's place:
    Metadata and FindCoordinator answers, and :attr:`bootstrap`, name it from then on.

    The mock draws each producer id it grants at random (a multiple of 1,000 below 900,000,000)
    and never checks that it is free: the more producers a cluster has served, the likelier a
    new transactional producer gets an id another producer holds, and then has its next
    request refused ``INVALID_PRODUCER_ID_MAPPING``. A cluster for each test (as the pytest
    plugin's ``kafka_cluster``) keeps that unlikely; a cluster serving a long run is not fit
    for transactions.
    """

    def __init__(self, brokers: int = 3) -> None:
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise ConfigurationError(f"a KafkaCluster needs at least 1 broker, got {brokers!r}")
        self._lib = _librdkafka()
        self._lock = threading.Lock()
        self._failed_apis: set[int] = set()
        self._changed = False  # since the last reset: a broker down, a round trip, errors
        self._faults: FaultProxy | None = None
        self._rk: int | None
        self._mcluster: int | None
        self._rk, self._mcluster = self._start(brokers)
        raw = self._lib.rd_kafka_mock_cluster_bootstraps(self._mcluster)
        #: The brokers' ``host:port``, comma-separated, in broker id order: for a plain client.
        self.bootstrap: str = raw.decode()
        #: The mock brokers' own ``host:port``, in broker id order: where they listen, whatever
        #: :meth:`advertise` made Metadata answers name (the same as :attr:`bootstrap` until
        #: then).
        self.mock_addresses: tuple[str, ...] = tuple(self.bootstrap.split(","))
        #: The brokers' ids, as librdkafka numbers them: 1..N.
        self.broker_ids: tuple[int, ...] = tuple(range(1, brokers + 1))

    def advertise(self, broker: int, host: str, port: int) -> None:
        """Name ``host:port`` in ``broker``'s place in Metadata, FindCoordinator and leader
        hints, and in :attr:`bootstrap`: a listener of your own in front of the broker (a
        proxy forwarding to its :attr:`mock_addresses` entry, which it keeps listening on)."""
        self._check_broker(broker)
        self._call("rd_kafka_mock_broker_set_host_port", broker, host.encode(), port)
        addresses = self.bootstrap.split(",")
        addresses[broker - 1] = f"{host}:{port}"
        self.bootstrap = ",".join(addresses)

    def _start(self, brokers: int) -> tuple[int, int]:
        lib = self._lib
        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # The handle only hosts the cluster: it connects nowhere, so keep it from warning that
        # it has no bootstrap.servers.
        for name, value in (("client.id", b"producerkit-kafka-cluster"), ("log_level", b"3")):
            lib.rd_kafka_conf_set(conf, name.encode(), value, errstr, len(errstr))
        rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not rk:
            lib.rd_kafka_conf_destroy(conf)
            raise KafkaClusterError(
                f"librdkafka could not make the cluster's handle: {errstr.value.decode()}",
                -1,
                "_FAIL",
            )
        mcluster = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mcluster:
            lib.rd_kafka_destroy(rk)
            raise KafkaClusterError(
                f"librdkafka could not start a mock cluster of {brokers} brokers "
                "(no free loopback port?)",
                -1,
                "_FAIL",
            )
        return rk, mcluster

    # ------------------------------------------------------------------ addresses

    @property
    def url(self) -> str:
        """``kafka://host:port,host:port,...``: every broker, for a producerkit producer."""
        return f"kafka://{self.bootstrap}"

    @property
    def host_port(self) -> str:
        """The same as :attr:`bootstrap` (as the session brokers name it)."""
        return self.bootstrap

    def broker_address(self, broker: int) -> str:
        """``host:port`` of one broker."""
        self._check_broker(broker)
        return self.bootstrap.split(",")[broker - 1]

    @property
    def closed(self) -> bool:
        return self._mcluster is None

    # ------------------------------------------------------------------ topics and leaders

    def create_topic(self, name: str, partitions: int = 4, replication: int | None = None) -> None:
        """Make topic ``name`` with ``partitions`` partitions, each on ``replication`` brokers
        (default: up to 3), partition ``p`` led by broker ``p % N + 1`` (N brokers), so a test
        knows where each partition is. A topic that exists already is a
        :class:`KafkaClusterError` (``TOPIC_ALREADY_EXISTS``)."""
        replicas = min(3, len(self.broker_ids)) if replication is None else replication
        if partitions < 1:
            raise ConfigurationError(f"a topic needs at least 1 partition, got {partitions}")
        if not 1 <= replicas <= len(self.broker_ids):
            raise ConfigurationError(
                f"replication must be 1..{len(self.broker_ids)} (the brokers), got {replicas}"
            )
        code = self._call("rd_kafka_mock_topic_create", name.encode(), partitions, replicas)
        self._raise_for(code, f"creating topic {name!r}")
        for partition in range(partitions):
            self.set_leader(name, partition, self.broker_ids[partition % len(self.broker_ids)])

    def set_leader(self, topic: str, partition: int, broker: int | None) -> None:
        """Make ``broker`` the leader of ``topic`` [``partition``] (None: no leader at all).
        Clients learn it from their next Metadata: a request to the old leader is answered
        NOT_LEADER_OR_FOLLOWER, which makes them ask. An unknown topic is created (with
        ``partition + 1`` partitions)."""
        if broker is not None:
            self._check_broker(broker)
        code = self._call(
            "rd_kafka_mock_partition_set_leader",
            topic.encode(),
            partition,
            -1 if broker is None else broker,
        )
        self._raise_for(code, f"setting the leader of {topic!r} [{partition}]")

    def move_leaders(self, topic: str, broker: int) -> None:
        """Make ``broker`` the leader of every partition of ``topic``."""
        for partition in self.partition_leaders(topic):
            self.set_leader(topic, partition, broker)

    def partition_leaders(self, topic: str, timeout: float = 10.0) -> dict[int, int]:
        """Partition -> leader broker id of ``topic`` (-1: no leader), as a client's Metadata
        request sees it. Blocks up to ``timeout`` seconds; an unknown topic is a
        :class:`KafkaClusterError` (``UNKNOWN_TOPIC_OR_PART``)."""
        metadata = self._topic_metadata(topic, timeout)
        return {p: metadata.partitions[p].leader for p in sorted(metadata.partitions)}

    # ------------------------------------------------------------------ brokers

    def broker_down(self, broker: int) -> None:
        """Take ``broker`` down: its connections are closed and new ones refused, on the same
        port, until :meth:`broker_up`. Leaders do not move (see :meth:`set_leader`)."""
        self._check_broker(broker)
        self._changed = True
        self._raise_for(self._call("rd_kafka_mock_broker_set_down", broker), f"broker {broker}")

    def broker_up(self, broker: int) -> None:
        """Let ``broker`` accept connections again."""
        self._check_broker(broker)
        self._raise_for(self._call("rd_kafka_mock_broker_set_up", broker), f"broker {broker}")

    def set_rtt(self, broker: int | None, ms: int) -> None:
        """Delay every response of ``broker`` (None: of every broker) by ``ms`` milliseconds,
        until changed (0 ends it)."""
        if broker is not None:
            self._check_broker(broker)
        if ms < 0:
            raise ConfigurationError(f"a round trip is at least 0 ms, got {ms}")
        self._changed = True
        code = self._call("rd_kafka_mock_broker_set_rtt", -1 if broker is None else broker, ms)
        self._raise_for(code, f"setting the rtt of broker {broker}")

    def set_coordinator(
        self, key_type: Literal["transaction", "group"], key: str, broker: int
    ) -> None:
        """Make ``broker`` the coordinator of transactional id (or group id) ``key``."""
        if key_type not in ("transaction", "group"):
            raise ConfigurationError(f"key_type is 'transaction' or 'group', not {key_type!r}")
        code = self._call("rd_kafka_mock_coordinator_set", key_type.encode(), key.encode(), broker)
        self._raise_for(code, f"setting the {key_type} coordinator of {key!r}")

    # ------------------------------------------------------------------ request errors

    def fail_requests(self, api: str | int, errors: Sequence[str | int]) -> None:
        """Answer the next ``len(errors)`` requests of ``api`` (``"Produce"``,
        ``"InitProducerId"``...: see :data:`API_KEYS`; or an API key), on any broker, with
        these errors in order (names of :data:`ERROR_CODES`, or codes as ints). A failed
        request is not applied: a Produce failed so stores none of its records. They stack
        after errors still pending for ``api``; :meth:`clear_request_errors` drops them."""
        key = api_key(api)
        if isinstance(errors, (str, bytes)):
            raise ConfigurationError("errors is a list of error names or codes, not one string")
        codes = [error_code(error) for error in errors]
        if not codes:
            return
        array = (ctypes.c_int * len(codes))(*codes)
        with self._lock:
            self._failed_apis.add(key)
            self._changed = True
        self._call("rd_kafka_mock_push_request_errors_array", key, len(codes), array)

    def clear_request_errors(self, api: str | int) -> None:
        """Drop the errors still pending for ``api`` (see :meth:`fail_requests`)."""
        self._call("rd_kafka_mock_clear_request_errors", api_key(api))

    # ------------------------------------------------------------------ faults, reset

    @property
    def faults(self) -> FaultProxy:
        """A :class:`~producerkit.testing.proxy.FaultProxy` in front of the cluster (started the
        first time it is asked for): give a client :attr:`faulty_url`, and every connection of
        it, to each broker Metadata names, passes through the proxy's faults."""
        with self._lock:
            if self._faults is None:
                from producerkit.testing.proxy import FaultProxy

                host, _, port = self.broker_address(1).rpartition(":")
                self._faults = FaultProxy("kafka", host, int(port)).start()
            return self._faults

    @property
    def faulty_url(self) -> str:
        """``kafka://`` through :attr:`faults`."""
        return f"kafka://{self.faults.host_port}"

    def reset(self) -> None:
        """Undo what tests did to the brokers: every broker up, no added round trip, no pending
        request errors (of :data:`API_KEYS` and of any API :meth:`fail_requests` was given),
        the fault proxy's faults ended. Topics, their records and their leaders stay as they
        are. Cheap when nothing changed since the last reset; nothing on a closed cluster."""
        with self._lock:
            if self._mcluster is None:
                return
            changed, self._changed = self._changed, False
            apis = set(_RESET_APIS) | self._failed_apis
            self._failed_apis.clear()
            faults = self._faults
        if changed:
            for broker in self.broker_ids:
                self._call("rd_kafka_mock_broker_set_up", broker)
            self._call("rd_kafka_mock_broker_set_rtt", -1, 0)
            for key in sorted(apis):
                self._call("rd_kafka_mock_clear_request_errors", key)
        if faults is not None:
            faults.clear()

    # ------------------------------------------------------------------ reading back

    def read(self, topic: str, timeout: float = 10.0) -> list[KafkaRecord]:
        """Every record of ``topic`` up to each partition's end as it is now, in partition and
        offset order, read with a plain confluent-kafka consumer (no group: every partition
        assigned from its beginning). Blocks up to ``timeout`` seconds, then
        ``TimeoutError``. An unknown topic is a :class:`KafkaClusterError`.

        It is the log as the mock stores it: every record written, those of open and aborted
        transactions too (the mock serves them to a ``read_committed`` consumer as well; Apache
        Kafka, ``producerkit.testing.apache_kafka.ApacheKafka``, does not)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        self._check_open()
        deadline = time.monotonic() + timeout
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "producerkit-kafka-cluster-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 20,
                "log_level": 3,
            }
        )
        records: list[KafkaRecord] = []
        try:
            # The consumer's own metadata first: assigned a partition whose leader it does not
            # know yet, it would look its offsets up only half a second later.
            metadata = self._topic_metadata(topic, timeout, consumer)
            partitions = sorted(metadata.partitions)
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
            pending = set(partitions)
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"read {len(records)} records of {topic!r} in {timeout} s; partitions "
                        f"{sorted(pending)} did not reach their end"
                    )
                message = consumer.poll(min(left, 0.5))
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        continue
                    if not error.fatal():
                        continue  # transient: the consumer retries by itself
                    raise KafkaClusterError(
                        f"reading {topic!r}: {error.str()}", error.code(), error.name()
                    )
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None  # a record, not an event
                timestamp_type, timestamp = message.timestamp()
                records.append(
                    KafkaRecord(
                        partition=partition,
                        offset=offset,
                        key=_as_bytes(message.key()),
                        value=_as_bytes(message.value()),
                        headers=_header_pairs(message.headers()),
                        timestamp=timestamp if timestamp_type else None,
                    )
                )
        finally:
            consumer.close()
        records.sort(key=lambda record: (record.partition, record.offset))
        return records

    def _topic_metadata(self, topic: str, timeout: float, client: Any = None) -> Any:
        """confluent-kafka's TopicMetadata of ``topic``, as ``client`` (default: an admin
        client) sees it, by a request that does not create the topic."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        self._check_open()
        if client is None:
            client = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap,
                    "allow.auto.create.topics": False,
                    "log_level": 3,
                }
            )
        try:
            metadata = client.list_topics(topic, timeout=timeout).topics[topic]
        except KafkaException as exc:
            error = exc.args[0]
            raise KafkaClusterError(
                f"no metadata for {topic!r}: {error.str()}", error.code(), error.name()
            ) from exc
        if metadata.error is not None:
            error = metadata.error
            raise KafkaClusterError(
                f"no topic {topic!r} in the cluster: {error.str()}", error.code(), error.name()
            )
        return metadata

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop the fault proxy, then the cluster (its brokers close every connection). Safe
        to call again."""
        with self._lock:
            mcluster, rk, faults = self._mcluster, self._rk, self._faults
            self._mcluster = self._rk = None
            self._faults = None
        if faults is not None:
            faults.stop()
        if mcluster is not None:
            self._lib.rd_kafka_mock_cluster_destroy(mcluster)
        if rk is not None:
            self._lib.rd_kafka_destroy(rk)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.bootstrap
        return f"<KafkaCluster {len(self.broker_ids)} brokers {state}>"

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._mcluster is None:
            raise ConfigurationError("this KafkaCluster is closed")

    def _check_broker(self, broker: int) -> None:
        if broker not in self.broker_ids:
            raise ConfigurationError(
                f"no broker {broker!r}: this cluster's are {list(self.broker_ids)}"
            )

    def _call(self, function: str, *args: Any) -> Any:
        mcluster = self._mcluster
        if mcluster is None:
            raise ConfigurationError("this KafkaCluster is closed")
        return getattr(self._lib, function)(mcluster, *args)

    def _raise_for(self, code: int, doing: str) -> None:
        if code:
            name = self._lib.rd_kafka_err2name(code).decode()
            text = self._lib.rd_kafka_err2str(code).decode()
            raise KafkaClusterError(f"{doing}: {name} ({code}): {text}", code, name)
