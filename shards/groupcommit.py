"""Group commit's bookkeeping, without I/O: which publisher confirms wait for
which commit, and the shard's one count of what its commits did.

Everything durable that a shard turn produced goes into one commit (the
persister writes it, the committer thread runs it). The confirms of the
publishes behind those writes are gathered here and leave with that commit:
acks once it is durable, nacks if it failed. A publish that a queue turned away
(x-overflow reject-publish) or that failed in the shard is a nack whatever
the commit's fate; it still waits for the commit, so a channel's answers keep
their order.
"""

from __future__ import annotations

from . import records as r

LATENCY_SAMPLES = 1000  # confirm latencies kept per commit (enough for percentiles)


class Commit:
    """One commit: the confirms riding on it, (channel, seq, accepted) in publish
    order; when it started; and its writes (the persister's PendingCommit)."""

    __slots__ = ("confirms", "started", "writes")

    def __init__(self, confirms: list[tuple[int, int, bool]], started: float, writes=None):
        self.confirms = confirms
        self.started = started
        self.writes = writes


class GroupCommit:
    def __init__(self):
        self.gathering: list[tuple[int, int, bool]] = []  # confirms for the next commit
        self.inflight: Commit | None = None  # the commit the committer thread runs
        # Cumulative, for QueueInfo and the statistics log:
        self.fsyncs = 0
        self.messages = 0
        # Since the last statistics record: fsyncs by messages per fsync (keyed by
        # power-of-two upper bound), and seconds from commit start to confirm.
        self.fsync_batch: dict[int, int] = {}
        self.confirm_latencies: list[float] = []

    def confirm(self, channel: int, seq: int, accepted: bool = True) -> None:
        """A confirmed publish is done in this shard: answer it with the next commit."""
        self.gathering.append((channel, seq, accepted))

    def take(self, now: float, writes=None) -> Commit:
        """The confirms gathered so far leave with a commit starting now."""
        commit, self.gathering = Commit(self.gathering, now, writes), []
        return commit

    def begin(self, now: float, writes) -> Commit:
        """The gathered confirms leave with `writes`, committed in another thread."""
        self.inflight = self.take(now, writes)
        return self.inflight

    def end(self) -> Commit:
        """The commit in flight has ended (durable or not)."""
        commit, self.inflight = self.inflight, None
        return commit

    def forget(self, gateway: int) -> None:
        """A gateway died: the confirms of its channels go to nobody, whether they
        wait for the next commit or ride on the one in flight (its thread never
        reads them)."""
        def kept(confirms):
            return [c for c in confirms if r.gateway_of(c[0]) != gateway]

        self.gathering = kept(self.gathering)
        if self.inflight is not None:
            self.inflight.confirms = kept(self.inflight.confirms)

    def finished(self, commit: Commit, stored: bool, sizes: list[int], now: float) -> list:
        """`commit` ended: count its fsyncs (`sizes`: records per store transaction)
        and return its confirm records, Confirmed if `stored`, else Rejected."""
        for messages in sizes:
            self.fsyncs += 1
            self.messages += messages
            bucket = 1 << max(messages - 1, 0).bit_length()
            self.fsync_batch[bucket] = self.fsync_batch.get(bucket, 0) + 1
        accepted_channels, accepted_seqs, refused_channels, refused_seqs = [], [], [], []
        for channel, seq, accepted in commit.confirms:
            if accepted:
                accepted_channels.append(channel)
                accepted_seqs.append(seq)
            else:
                refused_channels.append(channel)
                refused_seqs.append(seq)
        records = []
        if accepted_seqs:
            self.confirm_latencies.extend(
                [now - commit.started] * min(len(accepted_seqs), LATENCY_SAMPLES))
            records.append((r.Confirmed if stored else r.Rejected)(accepted_channels,
                                                                   accepted_seqs))
        if refused_seqs:
            records.append(r.Rejected(refused_channels, refused_seqs))
        return records

    def take_interval(self) -> tuple[dict[int, int], list[float]]:
        """The fsync batch sizes and confirm latencies since the last call."""
        taken = self.fsync_batch, self.confirm_latencies
        self.fsync_batch, self.confirm_latencies = {}, []
        return taken
