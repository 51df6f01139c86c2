"""Publisher confirms for one channel, as a small pure tracker.

Each published message gets the next sequence number and the set of shards
that must accept it (those holding a target queue). Resolved messages
are answered once per loop turn: everything below the lowest still-pending
number goes out as runs of `multiple=true` acks/nacks, the rest one by one.
"""

from __future__ import annotations

ACK = True
NACK = False


class ConfirmTracker:
    def __init__(self) -> None:
        self.next_seq = 1
        self._pending: dict[int, set[int]] = {}  # seq -> shards still to accept it
        self._failed: set[int] = set()  # pending seqs that will be nacked
        self._resolved: dict[int, bool] = {}  # seq -> ACK/NACK, not yet sent
        self._low = 1  # lowest seq that may still be pending
        self.acked = 0  # messages acked by the replies taken so far

    def publish(self, shards) -> int:
        """Record a publish that these shards must accept (none: confirm at once)."""
        seq = self.next_seq
        self.next_seq += 1
        if shards:
            self._pending[seq] = set(shards)
        else:
            self._resolved[seq] = ACK
        return seq

    def accept(self, seq: int, shard: int) -> None:
        remaining = self._pending.get(seq)
        if remaining is None:
            return
        remaining.discard(shard)
        if not remaining:
            del self._pending[seq]
            self._resolved[seq] = NACK if seq in self._failed else ACK
            self._failed.discard(seq)

    def reject(self, seq: int, shard: int) -> None:
        """A shard refused the message: it is nacked once every shard has answered."""
        if seq in self._pending:
            self._failed.add(seq)
            self.accept(seq, shard)

    def fail_shard(self, shard: int) -> None:
        """A shard is gone: nack what it had not accepted yet."""
        for seq in [s for s, shards in self._pending.items() if shard in shards]:
            self.reject(seq, shard)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def has_answers(self) -> bool:
        """Some resolved publishes wait for take_replies."""
        return bool(self._resolved)

    def take_replies(self) -> list[tuple[bool, int, bool]]:
        """(ack?, delivery-tag, multiple) answers to send now, in order."""
        if not self._resolved:
            return []
        self.acked += sum(self._resolved.values())  # ACK is True
        if not self._pending:
            self._low = self.next_seq
        while self._low < self.next_seq and self._low not in self._pending:
            self._low += 1
        if max(self._resolved) < self._low and NACK not in self._resolved.values():
            # the common case, all acks below every pending seq: one multiple ack
            replies: list[tuple[bool, int, bool]] = [(ACK, max(self._resolved), True)]
            self._resolved.clear()
            return replies
        replies = []
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
