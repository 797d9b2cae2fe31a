"""The report: the checks (:data:`CHECKS`, each must be 0) worked out from the ledger and what
was read back, the summary printed, the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.faults import LEADER_VICTIM
from chaos.judges.stored import Stored
from chaos.workload import (
    ACKED,
    EXAMPLES,
    FAILED_STORED,
    FAILED_UNSTORED,
    ID_RUN,
    PENDING,
    RAISED,
    Ledger,
)

#: A produce() call may block at most this long past the producer's timeout.
BLOCK_LIMIT = 1.0


#: name -> what it counts; each must be 0 (``blocked_past_timeout_s``: at most BLOCK_LIMIT).
CHECKS = {
    "without_outcome": "messages with no outcome after close()",
    "double_outcomes": "outcomes reported twice for one message",
    "acked_missing": "acked, not found stored",
    "acked_wrong_offset": "acked and stored, but not at the partition/offset its Delivery gave",
    "failed_unstored_found": "failed possibly_stored=False (or raised by produce), found stored",
    "stored_unknown": "stored records that are no message of this run",
    "stats_mismatch": "producer.stats acked/failed differ from the outcomes counted here",
    "duplicates_stored": "extra stored copies (must be 0 on JetStream: msg_id; and on the"
    " cluster, those Kafka would store too: idempotence)",
    "order_violations": "a key's stored first copy after a later one (must be 0: Kafka defaults;"
    " on the cluster, in the log Kafka would have)",
}
#: The cluster's too (reported): what its mock stored that Apache Kafka would not have.
CLUSTER_CHECKS = {
    "duplicates_mock_only": "extra copies the mock stored and Kafka would not: a batch stored"
    " again under the same producer id, epoch, partition and sequence (deduplicated by Kafka),"
    " or one Kafka would refuse for its sequence",
    "order_violations_mock_log": "order violations in the log as the mock stored it",
    "duplicates_without_id": "the JetStream cluster's extra stored copies of messages without a"
    " msg_id (producerkit publishes none of them again: 0 expected, reported)",
}


def analyze(
    ledger: Ledger,
    stored: Stored,
    broker_count: int,
    windows: list[dict[str, Any]],
    stats_delta: tuple[int, int],
    timeout: float,
    strict_order: bool,
    dedupes: bool,
    view: dict[str, Any] | None = None,
    with_id: Any = None,
    leader_deaths: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The checks; with ``view`` (the cluster's kafka_view) duplicates and order are judged on
    the log Kafka would have, and the raw figures are reported beside them. With ``with_id``
    (a mask of the messages that carried a msg_id) duplicates are judged among those, and
    reported among the others. With ``leader_deaths`` (seconds since t0) the time from each to
    the first ack of a message sent after it."""
    import numpy as np

    n = ledger.sent
    status = np.frombuffer(ledger.status, np.uint8)[:n]
    copies = np.frombuffer(stored.copies, np.uint8)[:n]
    at_offset = np.frombuffer(stored.at_offset, np.uint8)[:n]
    error = np.frombuffer(ledger.error, np.uint8)[:n]
    send_at = np.frombuffer(ledger.send_at, np.float32)[:n].astype(np.float64)
    settle_at = np.frombuffer(ledger.settle_at, np.float32)[:n].astype(np.float64)
    acked = status == ACKED
    failed = (status == FAILED_UNSTORED) | (status == FAILED_STORED) | (status == RAISED)
    never_written = (status == FAILED_UNSTORED) | (status == RAISED)
    failures: dict[str, dict[str, int]] = {}
    for code, name in enumerate(ledger.error_names[1:], start=1):
        of_type = failed & (error == code)
        failures[name] = {
            "possibly_stored_false": int((of_type & (status == FAILED_UNSTORED)).sum()),
            "possibly_stored_true": int((of_type & (status == FAILED_STORED)).sum()),
            "raised_by_produce": int((of_type & (status == RAISED)).sum()),
            **({} if with_id is None else {"with_msg_id": int((of_type & with_id).sum())}),
        }
    without_offset = acked & (np.frombuffer(ledger.offset, np.uint32)[:n] == 0)
    counts = {
        "produced": n,
        "acked": int(acked.sum()),
        "failed": int(failed.sum()),
        "failed_possibly_stored_false": int((status == FAILED_UNSTORED).sum()),
        "failed_possibly_stored_true": int((status == FAILED_STORED).sum()),
        "raised_by_produce": int((status == RAISED).sum()),
        "acked_as_duplicate": ledger.duplicate_acks,
        # a Delivery without an offset (Kafka: DUPLICATE_SEQUENCE_NUMBER, the broker stored the
        # batch before and names no offset, as Java and librdkafka report it too): no wrong
        # offset, and acked_missing still checks that it was stored
        "acked_without_offset": int(without_offset.sum()),
        "stored_records": stored.records,
        "stored_records_broker_count": broker_count,
        "stored_distinct": int((copies > 0).sum()),
        "failed_possibly_stored_true_found": int(((status == FAILED_STORED) & (copies > 0)).sum()),
    }
    if with_id is not None:
        counts["with_msg_id"] = int(with_id.sum())
        counts["failed_with_msg_id"] = int((failed & with_id).sum())
    masks = {  # the checks about single messages, whose examples the report shows
        "without_outcome": status == PENDING,
        "acked_missing": acked & (copies == 0),
        "acked_wrong_offset": acked & (copies > 0) & (at_offset == 0) & ~without_offset,
        "failed_unstored_found": never_written & (copies > 0),
    }
    checks = {
        **{name: int(mask.sum()) for name, mask in masks.items()},
        "double_outcomes": ledger.double_outcomes,
        "stored_unknown": stored.unknown,
        "stats_mismatch": abs(stats_delta[0] - counts["acked"])
        + abs(stats_delta[1] - counts["failed"] + counts["raised_by_produce"]),
        "duplicates_stored": stored.duplicates,
        "order_violations": stored.order_violations,
    }
    if with_id is not None:
        extra = np.maximum(copies.astype(np.int64) - 1, 0)
        checks["duplicates_stored"] = int(extra[with_id].sum())
        checks["duplicates_without_id"] = int(extra[~with_id].sum())
    if view is not None:
        checks["duplicates_stored"] = view["duplicates"]
        checks["order_violations"] = view["order_violations"]
        checks["duplicates_mock_only"] = stored.duplicates - view["duplicates"]
        checks["order_violations_mock_log"] = stored.order_violations
    examples = {
        name: [ledger.describe(int(i)) for i in np.flatnonzero(mask)[:EXAMPLES]]
        for name, mask in masks.items()
        if mask.any()
    }
    if view is not None and view["order_examples"]:
        examples["order_violations"] = [
            {**ledger.describe(i), "copies": int(copies[i])} for i in view["order_examples"]
        ]
    if stored.order_examples:  # each with the message of the same key stored before it
        examples["order_violations" if view is None else "order_violations_mock_log"] = [
            {
                **ledger.describe(i),
                "stored_offset": offset,
                "copies": int(copies[i]),
                "after": {**ledger.describe(j), "stored_offset": at, "copies": int(copies[j])},
            }
            for i, offset, j, at in stored.order_examples
        ]
    enforced = {name for name in checks if name in CHECKS}
    enforced -= {"duplicates_stored", "order_violations"}
    if dedupes:
        enforced.add("duplicates_stored")
    if strict_order:
        enforced.add("order_violations")
    blocked = ledger.longest_call - timeout
    # Recovery: from a fault's end to the first ack of a message sent after it ended.
    first_ack_from = np.minimum.accumulate(np.where(acked, settle_at, np.inf)[::-1])[::-1]

    def to_next_ack(at: float) -> float:
        """From ``at`` to the first ack of a message sent after it (inf: none)."""
        index = int(np.searchsorted(send_at, at))
        return float(first_ack_from[index] - at) if index < n else math.inf

    recoveries = []
    after_load = 0  # faults that outlasted the load (a slow leader move): nothing to recover
    for window in windows:
        end = window["end"]
        after_load += int(np.searchsorted(send_at, end)) >= n
        recovery = to_next_ack(end)
        window["recovery_s"] = round(recovery, 3) if math.isfinite(recovery) else None
        if math.isfinite(recovery):
            recoveries.append(recovery)
    leader_death = None
    if leader_deaths is not None:
        delays = [to_next_ack(at) for at in leader_deaths]
        acked_after = [delay for delay in delays if math.isfinite(delay)]
        leader_death = {
            "p50": round(float(np.median(acked_after)), 3) if acked_after else None,
            "max": round(max(acked_after), 3) if acked_after else None,
            "kills_of_the_leader": len(delays),
            "without_an_ack_after": len(delays) - len(acked_after),
            "each_s": [round(d, 3) if math.isfinite(d) else None for d in delays],
        }
    seconds = math.ceil(max(send_at.max(initial=0), settle_at.max(initial=0))) + 1
    series = {
        "sent": np.bincount(send_at.astype(int), minlength=seconds).tolist(),
        "acked": np.bincount(settle_at[acked].astype(int), minlength=seconds).tolist(),
        "failed_possibly_stored_false": np.bincount(
            settle_at[never_written].astype(int), minlength=seconds
        ).tolist(),
        "failed_possibly_stored_true": np.bincount(
            settle_at[status == FAILED_STORED].astype(int), minlength=seconds
        ).tolist(),
    }
    return {
        "counts": counts,
        "failures_by_type": failures,
        "first_errors": dict(ledger.first_errors),
        "checks": {
            name: {
                "value": value,
                "enforced": name in enforced,
                "pass": value == 0 or name not in enforced,
            }
            for name, value in checks.items()
        },
        "blocked_past_timeout_s": {
            "value": round(blocked, 3),
            "longest_call_s": round(ledger.longest_call, 3),
            "at_s": round(ledger.longest_call_at, 1),
            "limit_s": BLOCK_LIMIT,
            "pass": blocked <= BLOCK_LIMIT,
        },
        "examples": examples,
        "latest_send_s": round(ledger.latest_send, 3),
        "recovery_s": {
            "p50": round(float(np.median(recoveries)), 3) if recoveries else None,
            "max": round(max(recoveries), 3) if recoveries else None,
            "faults": len(windows),
            # sent to after the fault's end, and none of it acked
            "unrecovered": len(windows) - len(recoveries) - after_load,
            "ended_after_load": after_load,
        },
        "leader_death_to_next_ack_s": leader_death,
        "per_second": series,
    }


def print_summary(report: dict[str, Any]) -> None:
    config, result = report["config"], report["result"]
    counts = result["counts"]
    print(
        f"\nchaos {config['backend']}{' preset=' + config['preset'] if config['preset'] else ''}"
        f" seed={config['seed']} minutes={config['minutes']:g} rate={config['rate']:,.0f}/s"
        + (f" (capacity {config['capacity']:,.0f}/s)" if config["capacity"] else " (--rate)")
    )
    print(
        f"produced {counts['produced']:,}  acked {counts['acked']:,}  failed {counts['failed']:,}"
        f" (possibly_stored false {counts['failed_possibly_stored_false']:,},"
        f" true {counts['failed_possibly_stored_true']:,}, of them found stored"
        f" {counts['failed_possibly_stored_true_found']:,}; raised by produce"
        f" {counts['raised_by_produce']:,})"
        + (
            f"; acked without an offset {counts['acked_without_offset']:,}"
            if counts["acked_without_offset"]
            else ""
        )
    )
    if "with_msg_id" in counts:
        print(
            f"with a msg_id {counts['with_msg_id']:,} (in runs of {ID_RUN:,}), of them failed"
            f" {counts['failed_with_msg_id']:,}"
        )
    for name, by in sorted(result["failures_by_type"].items()):
        print(f"  {name}: {by}")
        first = result.get("first_errors", {}).get(name)
        if first:
            print(f"    the first: {first}")
    print(
        f"stored records {counts['stored_records']:,} (distinct {counts['stored_distinct']:,});"
        f" the broker's count {counts['stored_records_broker_count']:,}"
    )
    print("faults:")
    for w in report["faults"]:
        recovery = "-" if w["recovery_s"] is None else f"{w['recovery_s']:.2f}s"
        print(
            f"  {w['mode']:9} {w['start']:7.1f}s .. {w['end']:7.1f}s"
            f"  recovery {recovery:>7}  {w['detail']}"
        )
    cluster = report.get("cluster")
    if cluster and "leader_at_end" in cluster:
        print(
            f"JetStream cluster: {cluster['brokers']} nats-servers, an R{cluster['replication']}"
            f" file stream; server faults done {cluster['faults_done']}; the stream's leader at"
            f" the end n{cluster['leader_at_end']}; acked in fast batches"
            f" {cluster['fast_ingest_acked']:,}"
        )
    elif cluster and "min_insync_replicas" in cluster:
        print(
            f"Apache Kafka {cluster['version']}: {cluster['brokers']} nodes, replication"
            f" {cluster['replication']}, min.insync.replicas {cluster['min_insync_replicas']};"
            f" node faults done {cluster['faults_done']}; leaders at the end"
            f" {cluster['leaders_at_end']}"
        )
    elif cluster:
        epochs = cluster["producer_ids_epochs"]
        print(
            f"cluster: {cluster['brokers']} brokers, replication {cluster['replication']};"
            f" {cluster['produce_batches']:,} idempotent Produce batches, answered"
            f" {cluster['produce_answers']}; errors pushed {cluster['errors_pushed']};"
            f" {len(epochs)} producer id/epoch pairs {epochs[:6]}"
        )
        print(
            f"  records the mock stored, by what Kafka would have done with their batch:"
            f" {cluster['records_by_verdict']} ({cluster['sequence_gaps']} sequence gaps Kafka"
            f" would answer OUT_OF_ORDER_SEQUENCE_NUMBER); stored only where Kafka would not:"
            f" {cluster['stored_only_in_batches_kafka_refuses']:,} messages; in no batch"
            f" recorded: {cluster['unbatched_records']:,}; live read at most"
            f" {cluster['read_max_lag_records']:,} records behind and"
            + (
                " the mock dropped none"
                if cluster["read_margin_records"] is None
                else f" {cluster['read_margin_records']:,} ahead of the oldest the mock kept"
            )
        )
    rec = result["recovery_s"]
    print(
        f"recovery p50 {rec['p50']}s max {rec['max']}s ({rec['unrecovered']} without an ack after)"
    )
    death = result.get("leader_death_to_next_ack_s")
    if death is not None:
        print(
            f"from a leader's death to the next ack: p50 {death['p50'] or '-'} s"
            f" max {death['max'] or '-'} s"
            f" ({death['kills_of_the_leader']} kills of the leader's server,"
            f" {death['without_an_ack_after']} without an ack after)"
        )
    blocked = result["blocked_past_timeout_s"]
    print(
        f"longest produce() call {blocked['longest_call_s']:.3f}s at t={blocked['at_s']}s:"
        f" {blocked['value']:+.3f}s past the timeout (limit +{BLOCK_LIMIT:g}s)"
        f" {'ok' if blocked['pass'] else 'FAIL'}"
    )
    print(f"latest send behind schedule {result['latest_send_s']:.3f}s")
    print(
        f"RSS start {report['rss_mb']['start']} MB, end {report['rss_mb']['end']} MB"
        f" (of which the harness's ledger {report['rss_mb']['ledger']} MB);"
        f" the broker's {report['rss_mb']['broker_end']} MB"
    )
    print("checks:")
    for name, check in result["checks"].items():
        verdict = ("ok" if check["pass"] else "FAIL") if check["enforced"] else "(reported)"
        meaning = CHECKS.get(name) or CLUSTER_CHECKS[name]
        print(f"  {name:26} {check['value']:>8,}  {verdict:10}  {meaning}")
    for name, examples in result["examples"].items():
        print(f"  {name}, the first {len(examples)}:")
        for example in examples[:5]:
            print(f"    {example}")
    if report["harness_error"]:
        print(f"HARNESS ERROR (the run is void): {report['harness_error']}")
    print("PASS" if report["pass"] else "FAIL")


def plot(report: dict[str, Any], output: Path) -> None:
    """Send and ack rates, in flight and failures per second over time, faults shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, samples = report["result"]["per_second"], report["samples"]
    fig, (rate_ax, flight_ax, fail_ax) = plt.subplots(
        3, 1, figsize=(12, 8), sharex=True, gridspec_kw={"height_ratios": [2, 1.2, 1.2]}
    )
    xs = list(range(len(series["sent"])))
    rate_ax.plot(xs, series["sent"], label="sent/s", linewidth=1.2)
    rate_ax.plot(xs, series["acked"], label="acked/s", linewidth=1.2)
    flight_ax.plot([s["t"] for s in samples], [s["in_flight"] for s in samples], color="tab:purple")
    fail_ax.bar(
        xs,
        series["failed_possibly_stored_false"],
        width=1.0,
        color="tab:red",
        label="possibly_stored=False",
    )
    fail_ax.bar(
        xs,
        series["failed_possibly_stored_true"],
        width=1.0,
        bottom=series["failed_possibly_stored_false"],
        color="tab:orange",
        label="possibly_stored=True",
    )
    colors = {
        "stall": "tab:blue",
        "blackhole": "black",
        "refuse": "tab:red",
        "slow": "tab:green",
        "kill": "tab:brown",
        "reset": "tab:pink",
        "leaders": "tab:olive",
        "step_down": "tab:olive",
        "broker_down": "tab:brown",
        "errors": "tab:cyan",
    }
    for w in report["faults"]:
        leader_killed = w["mode"] == "kill" and LEADER_VICTIM in w["detail"]
        color = "darkred" if leader_killed else colors.get(w["mode"], "grey")
        for ax in (rate_ax, flight_ax, fail_ax):
            if w["end"] > w["start"]:
                ax.axvspan(w["start"], w["end"], color=color, alpha=0.15, linewidth=0)
            else:
                ax.axvline(w["start"], color=color, alpha=0.6, linestyle=":")
        rate_ax.annotate(  # inside the window, at its top
            "kill leader" if leader_killed else w["mode"],
            (w["start"], 0.98),
            xycoords=("data", "axes fraction"),
            xytext=(2, 0),
            textcoords="offset points",
            fontsize=7,
            rotation=90,
            va="top",
            ha="left",
            color=color,
        )
    config = report["config"]
    name = config["backend"] + (f" preset={config['preset']}" if config["preset"] else "")
    rate_ax.set_title(f"chaos: {name}, seed {config['seed']}, {config['rate']:,.0f} msg/s offered")
    rate_ax.set_ylabel("messages/s")
    rate_ax.legend(loc="lower left", fontsize=8)
    flight_ax.set_ylabel("in flight")
    fail_ax.set_ylabel("failed/s")
    fail_ax.set_xlabel("seconds since the load started")
    fail_ax.legend(loc="upper left", fontsize=8)
    for ax in (rate_ax, flight_ax, fail_ax):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)
