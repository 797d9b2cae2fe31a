"""Tooling for tests and local development, not for producing: nothing here is imported by
``import producerkit``.

- :mod:`producerkit.testing.brokers`: local Kafka (Tansu) and NATS brokers started from the
  installed wheels (``producerkit[brokers]``), used by the test suite, ``producerkit dev``, the
  demo and the benchmarks; :class:`~producerkit.testing.brokers.BrokerFaults` adds a fault proxy
  in front of one and can kill and restart it.
- :mod:`producerkit.testing.proxy`: :class:`~producerkit.testing.proxy.FaultProxy`, a TCP proxy
  between a client and a broker that adds a round trip (a WAN on loopback) and injects faults:
  stall, blackhole, refuse, slow, reset.
- :mod:`producerkit.testing.kafka_cluster`: ``KafkaCluster``, a Kafka cluster of several
  brokers in the test process (librdkafka's mock, from the confluent-kafka wheel): leaders
  that move, brokers that go down, request errors on demand.
- :mod:`producerkit.testing.apache_kafka`: :class:`~producerkit.testing.apache_kafka.ApacheKafka`,
  real Apache Kafka nodes (KRaft, one or several) run from the Maven Central jars (Java needed):
  what Tansu and the mock do not enforce (``read_committed``, fencing, idempotent
  deduplication, transaction timeouts), with nodes to kill, stop and restart and leaders to move.
- :mod:`producerkit.testing.nats_cluster`:
  :class:`~producerkit.testing.nats_cluster.JetStreamCluster`, three nats-servers routed as one
  JetStream cluster (R1/R3 streams, leaders to step down, servers to ``kill -9`` and restart).
- :mod:`producerkit.testing.pytest_plugin`: the pytest plugin (``producerkit[pytest]``): these
  brokers as fixtures, with their faults, and ``produce_benchmark``.

What judges this project's own tests (the mock cluster's ``read_committed`` view, its
recorders, the chaos bench's model of Kafka's idempotence) is not here: it lives with the
tests and benches of the repository (``benches/chaos/judges``), and ships in no wheel.
"""
