"""Publisher confirms for one channel, as a small pure tracker.

Each published message gets the next sequence number and the number of
acceptances it needs (one per shard holding a target queue). Resolved messages
are answered once per loop turn: everything below the lowest still-pending
number goes out as runs of `multiple=true` acks/nacks, the rest one by one.
"""

from __future__ import annotations

ACK = True
NACK = False


class ConfirmTracker:
    def __init__(self) -> None:
        self.next_seq = 1
        self._pending: dict[int, int] = {}  # seq -> acceptances still needed
        self._failed: set[int] = set()  # pending seqs that will be nacked
        self._resolved: dict[int, bool] = {}  # seq -> ACK/NACK, not yet sent
        self._low = 1  # lowest seq that may still be pending

    def publish(self, parts: int) -> int:
        """Record a publish needing `parts` acceptances (0: confirm at once)."""
        seq = self.next_seq
        self.next_seq += 1
        if parts:
            self._pending[seq] = parts
        else:
            self._resolved[seq] = ACK
        return seq

    def accept(self, seq: int) -> None:
        remaining = self._pending.get(seq)
        if remaining is None:
            return
        if remaining > 1:
            self._pending[seq] = remaining - 1
            return
        del self._pending[seq]
        self._resolved[seq] = NACK if seq in self._failed else ACK
        self._failed.discard(seq)

    def reject(self, seq: int) -> None:
        """A target refused the message: it will be nacked once all parts answer."""
        if seq in self._pending:
            self._failed.add(seq)
            self.accept(seq)

    def fail_all(self) -> None:
        """Nack everything still pending (the shard holding it is gone)."""
        for seq in list(self._pending):
            self._failed.add(seq)
            self._pending[seq] = 1
            self.accept(seq)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def take_replies(self) -> list[tuple[bool, int, bool]]:
        """(ack?, delivery-tag, multiple) answers to send now, in order."""
        if not self._resolved:
            return []
        while self._low < self.next_seq and self._low not in self._pending:
            self._low += 1
        replies: list[tuple[bool, int, bool]] = []
        run_kind = None
        run_end = 0
        for seq in sorted(self._resolved):
            kind = self._resolved[seq]
            if seq < self._low:
                # Everything below _low is resolved, so a run can be one multiple answer.
                if run_kind is not None and kind is not run_kind:
                    replies.append((run_kind, run_end, True))
                run_kind, run_end = kind, seq
            else:
                if run_kind is not None:
                    replies.append((run_kind, run_end, True))
                    run_kind = None
                replies.append((kind, seq, False))
        if run_kind is not None:
            replies.append((run_kind, run_end, True))
        self._resolved.clear()
        return replies
