"""Chaos: open-loop keyed load through a fault proxy, random faults, then every message checked
against what the broker stored.

    python benches/chaos --minutes M --seed S
        --backend kafka|jetstream|kafka-cluster|kafka-apache|jetstream-cluster
        [--preset throughput] [--rate N] [--json PATH] [--plot PATH]

The broker is started here from the installed wheels, behind a ``BrokerFaults`` proxy that the
producer connects through: Tansu with memory storage (a topic of ``--partitions`` partitions,
created with aiokafka's admin client) or nats-server with JetStream on file storage in a temp dir
(``create_stream=True, stream_storage="file"``, each message with a unique ``msg_id``). Or
(``kafka-cluster``) librdkafka's mock cluster of 3 brokers in this process
(``producerkit.testing.KafkaCluster`` behind the recorders of ``judges.kafka_recorder``,
recording the idempotent Produce batches), a topic of
``--partitions`` partitions with replication 3, behind the cluster's own fault proxy. Or
(``kafka-apache``) three real Apache Kafka nodes (``producerkit.testing.ApacheKafka``, each a
broker and a KRaft controller, run from the Maven Central jars: Java 17+), a topic of
``--partitions`` partitions with replication 3 and ``min.insync.replicas`` 2, behind the fault
proxy in front of node 1 (Metadata rewritten: every connection passes through it). Or
(``jetstream-cluster``) three nats-servers routed as one JetStream cluster
(``producerkit.testing.JetStreamCluster``, not advertising each other to clients), the producer
given all three through the fault proxy (a listener each) and creating its stream R3 on file
storage (``create_stream=True, stream_replicas=3``); messages carry a ``msg_id`` in alternate
runs of ID_RUN (the others, without one, go in fast batches where they come in bursts).

1. Capacity: without faults, the producer publishes as fast as it can for ``--capacity-seconds``
   to a topic of its own; the load runs at half that rate (or at ``--rate``).
2. Load: message i is due at ``t0 + i / rate`` whatever happened to message i-1 (open loop: while
   produce() blocks the schedule runs on, and the messages due meanwhile are sent late, in a
   burst). Each has one of ``--keys`` keys, chosen at random (seeded); its value carries its id,
   its key and its sequence number within the key. ``produce(nonblocking=True)`` with the id as
   ``context``; ``on_delivery`` records each outcome (offset, or error type and
   ``possibly_stored``) with its ``time.monotonic()`` stamp, and each produce() call is timed.
3. Faults (seeded): after a quiet gap of 5-20 s, one of the proxy's stall, blackhole, reset,
   refuse, slow, or (JetStream: its file store survives) kill -9 of the broker and a restart,
   lasting 1-10 s, or on the cluster one of its own (``ClusterFaults``: every leader moved; a
   leader's broker down, its partitions moved 2 s later, up again 1-10 s after that; bursts of
   retriable Produce errors, rarely a sequence error), or on Apache Kafka one of its nodes'
   (``ApacheFaults``: kill -9 of a node leading partitions, restarted 1-10 s later, the window
   open until it is back in every ISR; every leader moved, a reassignment and a preferred
   election a partition), or on the JetStream cluster its servers' (``JetStreamFaults``: kill
   -9 of any server, restarted 1-10 s later, the window open until it is healthy again; the
   stream's leader stepped down); modes are drawn from a shuffled bag, so
   each comes before any repeats. None starts unless it ends ``timeout + 3`` s before the load
   does. Windows come from the proxy's log (and the cluster faults' own).
4. End: stop producing, clear the faults, close the producer (every message now has an outcome),
   stop the proxy, let the broker settle, and read everything back with another client straight
   from the broker (aiokafka consumers, a partition each, to the high watermark; their Fetch wait
   made for Tansu's memory store, see READ_WAIT / nats-py pull consumer). The cluster's mock
   keeps only the last 5 MB of each partition, so its topic is read while the load runs
   (``LiveReader``), and duplicates and per-key order are judged on the log Apache Kafka would
   have kept (``KafkaReplay``): the mock stores an idempotent producer's retried batch again and
   a batch past a sequence gap at once, where Kafka would not. Apache Kafka keeps everything and
   judges the producer's sequences itself: its topic is read at the end by a confluent-kafka
   consumer (librdkafka: a client apart from producerkit's) with ``isolation.level`` at
   ``read_committed``, every partition to its high watermark. The JetStream cluster's stream
   is read like one server's, straight from the servers.

Exit code 0 when every must-be-0 check holds (see ``report.CHECKS`` and docs/reliability.md,
"Chaos runs"), 1 otherwise.

The package, a module a job:

- ``workload``: the messages, the open-loop schedule, the ledger of outcomes, the sampler;
- ``faults``: the plan, the proxy's faults and each cluster's own;
- ``readback``: what the broker stored, read by clients apart from the producer;
- ``judges``: what was stored judged per backend (``judges.stored`` on every one;
  ``judges.kafka_idempotence`` where librdkafka's mock stored what Apache Kafka would not;
  ``judges.kafka_transactions``, what Kafka would serve a ``read_committed`` consumer of the
  mock; ``judges.kafka_recorder``, the recorders in front of the mock's brokers that both
  read, and the mock cluster behind them; ``judges.kafka_wire``, the protocol as they read
  it); tests/ judges with them too (tests/conftest.py puts ``benches/`` on ``sys.path``);
- ``report``: the checks, the summary, the plot;
- ``run``: one run from the command line (``__main__`` calls :func:`chaos.run.main`).
"""
