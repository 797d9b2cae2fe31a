"""ProducerMetrics(latency_every="auto"), the default: every ack's latency while there are at most
AUTO_LATENCIES_PER_SECOND a second, then one in n, n set each second from the last second's acks,
never more than that many a second; the acked counter stays exact."""

from __future__ import annotations

import pytest

import producerkit as pk

sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
sdk_export = pytest.importorskip("opentelemetry.sdk.metrics.export")
otel = pytest.importorskip("producerkit.otel")


def totals(reader: object) -> dict[str, float]:
    found: dict[str, float] = {}
    data = reader.get_metrics_data()  # type: ignore[attr-defined]
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "count", None) or point.value
                    found[metric.name] = found.get(metric.name, 0) + value
    return found


def outcome(first: int, count: int, settled_at: float) -> pk.Outcome:
    numbers = tuple(range(first, first + count))
    return pk.Outcome(numbers, (settled_at - 0.001,) * count, settled_at, "t", 0, 0)


def test_auto_records_every_latency_at_low_rates_then_samples() -> None:
    reader = sdk_export.InMemoryMetricReader()
    metrics = otel.ProducerMetrics(sdk_metrics.MeterProvider(metric_readers=[reader]))
    rate = 5 * otel.AUTO_LATENCIES_PER_SECOND  # acks a second, in batches of 500
    number = 1
    for second in range(3):
        for batch in range(rate // 500):
            metrics(outcome(number, 500, 100.0 + second + batch * 500 / rate))
            number += 500
    found = totals(reader)
    assert found["producerkit.messages.acked"] == 3 * rate  # the counter is exact
    # The first second records its first AUTO_LATENCIES_PER_SECOND acks; the next two one in
    # five, as many again: never more than that many a second.
    recorded = found["producerkit.ack.latency"]
    assert recorded == pytest.approx(3 * otel.AUTO_LATENCIES_PER_SECOND, rel=0.02)


def test_auto_records_every_latency_of_a_short_burst() -> None:
    reader = sdk_export.InMemoryMetricReader()
    metrics = otel.ProducerMetrics(sdk_metrics.MeterProvider(metric_readers=[reader]))
    for batch in range(20):
        metrics(outcome(1 + batch * 500, 500, 50.0 + batch * 0.01))
    assert totals(reader)["producerkit.ack.latency"] == 10_000


def test_latency_every_rejects_other_words() -> None:
    with pytest.raises(ValueError, match="latency_every"):
        otel.ProducerMetrics(latency_every="sometimes")  # type: ignore[arg-type]
