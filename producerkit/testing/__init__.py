"""Tooling for tests and local development, not for producing: nothing here is imported by
``import producerkit``.

- :mod:`producerkit.testing.brokers`: local Kafka (Tansu) and NATS brokers started from the
  installed wheels (``producerkit[brokers]``), used by the test suite, ``producerkit dev``, the
  demo and the benchmarks.
- :mod:`producerkit.testing.proxy`: :class:`~producerkit.testing.proxy.DelayProxy`, a TCP proxy
  adding a round trip between a client and a broker (a WAN on loopback), or stalling it.

The pytest plugin (fixtures for these brokers) will live here too.
"""
