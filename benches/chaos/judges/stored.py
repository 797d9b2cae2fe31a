"""What the broker holds, read back and judged against the ledger, on every backend: copies of
each message, whether a copy sits where its Delivery said, per-key order among first copies."""

from __future__ import annotations

from typing import Any

from chaos.workload import EXAMPLES, WARM_UP, Ledger


class Stored:
    """What the broker holds, read back: copies per message id, whether a copy sits where its
    Delivery said, and per-key order among first copies. Filled by :meth:`visit` record by
    record, or at once by :meth:`from_positions` (the cluster's live read-back); then
    ``positions`` (partition -> the message id + 1 at each offset, 0: none of this run's) and
    each message's ``key`` and ``sequence`` are kept too, for :func:`kafka_view`."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.copies = bytearray(ledger.sent)
        self.at_offset = bytearray(ledger.sent)
        self.records = 0
        self.warm_ups = 0
        self.duplicates = 0
        self.unknown = 0
        self.order_violations = 0
        #: (id, stored offset, the id and stored offset of the later one it came after)
        self.order_examples: list[tuple[int, int, int, int]] = []
        self._last: dict[tuple[int, int], tuple[int, int, int]] = {}  # seq, id, offset
        self.positions: dict[int, Any] | None = None
        self.key: Any = None
        self.sequence: Any = None

    def visit(self, partition: int, offset: int, value: bytes) -> None:
        if value == WARM_UP:
            self.warm_ups += 1
            return
        self.records += 1
        try:
            i_text, key_text, seq_text, _ = value.split(b" ", 3)
            i, key, seq = int(i_text), int(key_text), int(seq_text)
        except ValueError:
            self.unknown += 1
            return
        ledger = self.ledger
        if not 0 <= i < ledger.sent:
            self.unknown += 1
            return
        if ledger.partition[i] == partition and ledger.offset[i] == offset + 1:
            self.at_offset[i] = 1
        copies = self.copies[i]
        if copies:
            self.duplicates += 1
            self.copies[i] = min(copies + 1, 255)
            return  # order is judged on first copies: a retry's second copy is a duplicate
        self.copies[i] = 1
        last = self._last.get((partition, key))
        if last is not None and seq < last[0]:
            self.order_violations += 1
            if len(self.order_examples) < EXAMPLES:
                self.order_examples.append((i, offset, last[1], last[2]))
        else:
            self._last[(partition, key)] = (seq, i, offset)

    @classmethod
    def from_positions(
        cls, ledger: Ledger, read: dict[str, Any], positions: dict[int, Any]
    ) -> Stored:
        """The same figures as :meth:`visit` gives, at once, from what the live read-back
        kept: ``positions`` (partition -> message id + 1 per offset, numpy), ``read``'s
        ``key``, ``sequence``, ``records``, ``warm_ups`` and ``unknown`` (ids past the
        messages sent count as unknown too)."""
        import numpy as np

        stored = cls(ledger)
        n = ledger.sent
        stored.positions, stored.key, stored.sequence = positions, read["key"], read["sequence"]
        stored.records, stored.warm_ups = read["records"], read["warm_ups"]
        stored.unknown = read["unknown"]
        everything = [ids[ids > 0].astype(np.int64) - 1 for ids in positions.values()]
        ids = np.concatenate(everything) if everything else np.zeros(0, np.int64)
        stored.unknown += int((ids >= n).sum())
        copies = np.bincount(ids[ids < n], minlength=n)[:n]
        stored.copies = bytearray(np.minimum(copies, 255).astype(np.uint8).tobytes())
        stored.duplicates = int(np.maximum(copies - 1, 0).sum())
        # A copy where the Delivery said: the message at its partition and offset is it.
        partition = np.frombuffer(ledger.partition, np.int8)[:n]
        offset = np.frombuffer(ledger.offset, np.uint32)[:n].astype(np.int64) - 1
        at = np.zeros(n, bool)
        for p, column in positions.items():
            mine = np.flatnonzero((partition == p) & (offset >= 0) & (offset < len(column)))
            at[mine] = column[offset[mine]] == mine + 1
        stored.at_offset = bytearray(at.astype(np.uint8).tobytes())
        # Per-key order among first copies, partition by partition, in offset order.
        key, sequence = np.asarray(read["key"]), np.asarray(read["sequence"])
        for _, column in sorted(positions.items()):
            where = np.flatnonzero((column > 0) & (column <= n))
            messages = column[where].astype(np.int64) - 1
            _, first = np.unique(messages, return_index=True)
            first.sort()
            firsts, at_offsets = messages[first], where[first]
            by_key = np.argsort(key[firsts], kind="stable")
            ordered = firsts[by_key]
            composite = (key[ordered].astype(np.int64) << 32) | sequence[ordered].astype(np.int64)
            highest = np.maximum.accumulate(composite)
            behind = np.flatnonzero(composite < np.concatenate(([-1], highest[:-1])))
            stored.order_violations += len(behind)
            for k in behind[: EXAMPLES - len(stored.order_examples)]:
                j = k - 1  # the highest before it, in its key's run
                while composite[j] != highest[k - 1]:
                    j -= 1
                stored.order_examples.append(
                    (
                        int(ordered[k]),
                        int(at_offsets[by_key[k]]),
                        int(ordered[j]),
                        int(at_offsets[by_key[j]]),
                    )
                )
        return stored
