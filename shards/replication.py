"""A replica group's data path as two pure state machines: the `Leader` (one per
group this node leads) numbers the queue's journal records into entries, streams
them to the followers and keeps the commit index; a `Follower` (one per group this
node follows) fences old epochs, applies entries in index order and acknowledges
what it holds durably. Calls in, values out; no I/O and no clock: the shell (the
shard) passes the time in, carries the values over the inter-node link, writes
the in-sync set to etcd and feeds the answers back (docs/architecture.md).

Consensus stays in etcd: the epoch is the election's revision and the in-sync set
is written by the leader only, fenced. So unlike Raft there are no votes here:
the commit index is the lowest durable index over the in-sync set (the leader
included), defined only while that set is a majority of the members, and a
follower leaves the set (an etcd write) before the leader commits without it.

Each entry keeps the epoch whose leader created it, and each side keeps where
each of its epochs starts. Entries are created by one leader per epoch, in order,
so two logs holding an entry of the same epoch at the same index are equal up to
it (Raft's log matching): a follower's (last epoch, last index) tells the leader
whether its log is a prefix of the leader's. Otherwise (a tail of a deposed
leader's epoch), or when it needs entries no longer kept in RAM, the follower is
caught up by a snapshot of the leader's store, and only once it is out of the
in-sync set: an in-sync member never clears what it holds."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class Entry(NamedTuple):
    """One batch of the queue's journal records."""
    epoch: int  # the epoch whose leader created it
    records: object  # opaque here: the shell's journal records
    size: int  # bytes, for the bounds


class Limits(NamedTuple):
    """The bounds and timeouts of a group's replication."""
    keep_entries: int = 10_000  # entries kept in RAM for followers that lag
    keep_bytes: int = 64 << 20
    in_flight: int = 4 << 20  # bytes sent to a follower and not yet acknowledged
    silence: float = 3.0  # seconds a follower may stay behind where the log was then
    max_lag: int = 5_000  # entries a follower may lag and stay in sync
    retry: float = 5.0  # seconds without an answer before what is in flight goes again


# Leader -> follower, carried by the shell.
class Send(NamedTuple):
    """Entries first_index.. for a follower, fenced by the leader's epoch, and the
    epoch of our entry before them (0: unknown) for the follower to match."""
    node: str
    epoch: int
    first_index: int
    prev_epoch: int
    entries: list[Entry]


class Snapshot(NamedTuple):
    """The follower needs the leader's store: the shell reads it as of some index,
    calls `snapshot_started(node, index)`, and sends it in chunks (the follower's
    `snapshot_chunk`, the first marked, then `snapshot_end`) at its own pace, as
    the follower takes them; `snapshot_sent(node)` once all are sent, and the
    entries after it follow. A newer Snapshot for the node replaces one under way,
    and the shell stops one that is not `snapshotting` any more."""
    node: str
    epoch: int


# Follower -> leader, or to its own shell (Apply, Clear).
class Hello(NamedTuple):
    """What the follower holds: its whole log (last epoch and index) and what of it
    is durable. Sent on every (re)connect, and to every new leader."""
    epoch: int
    last_epoch: int
    last_index: int
    durable: int


class Apply(NamedTuple):
    """Write these records to the store, in this order."""
    records: object


class Clear(NamedTuple):
    """Drop the queue's rows, and mark the store as holding no log until a
    snapshot's end (a crash mid-snapshot must not recover a half)."""


class Ack(NamedTuple):
    """The follower holds every entry up to `upto` durably."""
    epoch: int
    upto: int


class Refused(NamedTuple):
    """Entries of an epoch older than the newest this follower has seen."""
    epoch: int  # the newest seen: the sender is deposed


class Resend(NamedTuple):
    """A gap: the follower needs the entries from `from_index`."""
    epoch: int
    from_index: int


class Reset(NamedTuple):
    """The follower's log diverges from the leader's: it needs a snapshot."""
    epoch: int


class _History:
    """Where each epoch's entries start in a log, and the entries kept in RAM."""

    def __init__(self, starts: Iterable[tuple[int, int]], last_index: int,
                 kept: Sequence[Entry], limits: Limits):
        self.starts = list(starts)  # (epoch, first index), oldest first
        self.last_index = last_index
        self.kept: deque[Entry] = deque(kept)  # entries up to last_index
        self.kept_bytes = sum(e.size for e in kept)
        self.limits = limits

    @property
    def first_kept(self) -> int:
        return self.last_index - len(self.kept) + 1

    @property
    def last_epoch(self) -> int:
        return self.epoch_at(self.last_index) or 0

    def epoch_at(self, index: int) -> int | None:
        """The epoch of the entry at `index`; None if this log does not know it."""
        found = None
        for epoch, start in self.starts:
            if start > index:
                break
            found = epoch
        return found

    def append(self, entry: Entry) -> None:
        self.last_index += 1
        if not self.starts or self.starts[-1][0] != entry.epoch:
            self.starts.append((entry.epoch, self.last_index))
        self.kept.append(entry)
        self.kept_bytes += entry.size
        self.trim(0)

    def trim(self, upto: int) -> None:
        """Forget the kept entries up to `upto`, and the oldest beyond the bounds."""
        while self.kept and (self.first_kept <= upto or len(self.kept) > self.limits.keep_entries
                             or self.kept_bytes > self.limits.keep_bytes):
            self.kept_bytes -= self.kept.popleft().size

    def entry(self, index: int) -> Entry:
        return self.kept[index - self.first_kept]


# A follower's state at the leader.
LOST = "lost"  # no link, or not said hello yet
STREAM = "stream"  # its log is a prefix of ours: entries go
WANT = "want"  # needs a snapshot, once out of the in-sync set
LOADING = "loading"  # a snapshot was asked for, not started yet


class _Peer:
    def __init__(self, now: float):
        self.state = LOST
        self.durable = 0  # the highest index it acknowledged in this epoch
        self.sent = 0  # the highest index sent
        self.floor = 0  # what a retry goes back to: its durable index or its snapshot's
        self.in_flight: deque[tuple[int, int]] = deque()  # (last index, bytes) per Send
        self.in_flight_bytes = 0
        self.greet = False  # matched (a hello, a snapshot): a Send tells it so, if empty
        self.loading = False  # a snapshot's chunks are still being sent: no Send yet
        self.heard_at = now  # its last answer, for the retry
        self.caught_up_at = now  # when it last held everything, for the in-sync set

    def rewind(self, to: int) -> None:
        self.sent = to
        self.in_flight.clear()
        self.in_flight_bytes = 0


class Leader:
    """The leader of one replica group in one epoch."""

    def __init__(self, group: str, epoch: int, members: Iterable[str], isr: Iterable[str],
                 me: str, last_index: int, *, durable: int | None = None,
                 history: Iterable[tuple[int, int]] = (), kept: Sequence[Entry] = (),
                 now: float = 0.0, limits: Limits = Limits()):
        """`last_index`: what our store holds, `durable` of it (all by default);
        `history`: where each epoch's entries start in it; `kept`: its last entries."""
        self.group = group
        self.epoch = epoch
        self.members = frozenset(members)
        self.isr = frozenset(isr) | {me}  # as written in etcd
        self.me = me
        self.limits = limits
        self.log = _History(history, last_index, kept, limits)
        self.log.starts.append((epoch, last_index + 1))
        self.durable = last_index if durable is None else durable  # of our own store
        self.commit_index = 0
        self.deposed = False  # a newer epoch was seen: nothing more is sent or committed
        self.now = now
        self.pending: frozenset[str] | None = None  # the in-sync set being written
        # (time, last index) at each tick: a follower that holds what the log held at
        # a time counts as caught up at that time, so under a steady flood a follower
        # a batch or two behind stays in sync, and one that stops answering does not.
        self.marks: deque[tuple[float, int]] = deque()
        self.peers = {node: _Peer(now) for node in self.members - {me}}
        self._moved = False

    def append(self, records: object, size: int) -> int:
        for peer in self.peers.values():
            if peer.durable >= self.log.last_index:
                peer.caught_up_at = self.now
        self.log.append(Entry(self.epoch, records, size))
        return self.log.last_index

    def take_sends(self) -> list[Send | Snapshot]:
        out: list[Send | Snapshot] = []
        if self.deposed:
            return out
        for node, peer in self.peers.items():
            if peer.state == STREAM and not peer.loading and (
                    peer.sent < self.log.last_index or peer.greet):
                if peer.sent + 1 < self.log.first_kept:
                    peer.state = WANT  # behind the kept entries
                else:
                    send = self._batch(node, peer)
                    if send is not None:
                        out.append(send)
            if peer.state == WANT and node not in self.isr and self.pending is None:
                peer.state = LOADING
                out.append(Snapshot(node, self.epoch))
        return out

    def _batch(self, node: str, peer: _Peer) -> Send | None:
        entries: list[Entry] = []
        size = 0
        index = peer.sent + 1
        while index <= self.log.last_index:
            entry = self.log.entry(index)
            # at least one entry when nothing is in flight, however large
            if peer.in_flight_bytes + size + entry.size > self.limits.in_flight and (
                    peer.in_flight_bytes or entries):
                break
            entries.append(entry)
            size += entry.size
            index += 1
        if not entries and not peer.greet:
            return None
        peer.greet = False
        send = Send(node, self.epoch, peer.sent + 1, self.log.epoch_at(peer.sent) or 0, entries)
        peer.sent = index - 1
        peer.in_flight.append((peer.sent, size))
        peer.in_flight_bytes += size
        return send

    def durable_here(self, index: int) -> None:
        self.durable = max(self.durable, index)
        self._advance()

    def hello(self, node: str, epoch: int, last_epoch: int, last_index: int,
              durable: int) -> None:
        """A follower (re)connects: stream from its last index if its log is a
        prefix of ours and what follows is still kept, else snapshot it."""
        peer = self.peers.get(node)
        if epoch > self.epoch:
            self.deposed = True
        if peer is None or epoch < self.epoch or self.deposed:
            return
        peer.heard_at = self.now
        peer.loading = False  # (a snapshot under way is cut off: it starts afresh)
        prefix = last_index == 0 or (last_index <= self.log.last_index
                                     and self.log.epoch_at(last_index) == last_epoch)
        if prefix and last_index + 1 >= self.log.first_kept:
            peer.state = STREAM
            peer.durable = peer.floor = durable
            peer.rewind(last_index)
            peer.greet = True
            self._caught_up(peer)
            self._advance()
        else:
            peer.state = WANT
            peer.durable = 0

    def snapshot_started(self, node: str, index: int) -> int | None:
        """The shell read our store as of `index` (best our last index: entries
        before the kept ones mean another snapshot) for this follower: entries go
        from index + 1, behind the snapshot's chunks. Returns the epoch of our entry
        at `index` for `snapshot_end`; None: no snapshot is wanted any more."""
        peer = self.peers[node]
        if peer.state != LOADING or self.deposed:
            return None
        peer.state = STREAM
        peer.loading = True
        peer.durable = -1  # nothing known until it acks the snapshot
        peer.floor = index  # acks below it are of the log the snapshot replaced
        peer.rewind(index)
        peer.greet = True
        peer.heard_at = self.now
        return self.log.epoch_at(index) or 0

    def snapshotting(self, node: str) -> bool:
        """Whether the snapshot the shell sends this follower is still wanted."""
        peer = self.peers.get(node)
        return peer is not None and peer.loading and peer.state == STREAM \
            and not self.deposed

    def snapshot_sent(self, node: str) -> None:
        """Every chunk of the snapshot is sent: the entries after it go now."""
        peer = self.peers.get(node)
        if peer is not None:
            peer.loading = False

    def acked(self, node: str, epoch: int, index: int) -> None:
        peer = self.peers.get(node)
        if epoch != self.epoch or peer is None or peer.state != STREAM:
            return  # stale, or of a log we have not matched yet
        peer.heard_at = self.now
        if index > peer.durable and index >= peer.floor:
            peer.durable = peer.floor = index
            peer.sent = max(peer.sent, index)
            while peer.in_flight and peer.in_flight[0][0] <= index:
                peer.in_flight_bytes -= peer.in_flight.popleft()[1]
            self._caught_up(peer)
            self._advance()
            self.log.trim(min(p.durable for p in self.peers.values()))

    def resend(self, node: str, epoch: int, from_index: int) -> None:
        peer = self.peers.get(node)
        if epoch == self.epoch and peer is not None and peer.state == STREAM:
            peer.heard_at = self.now
            if from_index - 1 < peer.floor:
                peer.state = WANT  # it lost what we matched (a snapshot that did not arrive)
            else:
                peer.rewind(min(peer.sent, from_index - 1))

    def reset(self, node: str, epoch: int) -> None:
        peer = self.peers.get(node)
        if epoch == self.epoch and peer is not None:
            peer.state = WANT

    def refused(self, node: str, epoch: int) -> None:
        if epoch > self.epoch:
            self.deposed = True

    def follower_lost(self, node: str) -> None:
        peer = self.peers.get(node)
        if peer is not None:
            peer.state = LOST
            peer.rewind(peer.sent)
            peer.caught_up_at = -math.inf  # out of the in-sync set as soon as it lags

    def tick(self, now: float) -> None:
        """Send again what a follower has not answered for `retry` seconds."""
        self.now = now
        marks = self.marks
        marks.append((now, self.log.last_index))
        while len(marks) > 1 and marks[1][0] <= now - self.limits.silence:
            marks.popleft()
        for peer in self.peers.values():
            self._caught_up(peer)
            if peer.in_flight and now - peer.heard_at > self.limits.retry:
                peer.heard_at = now
                peer.rewind(peer.floor)

    def _caught_up(self, peer: _Peer) -> None:
        if peer.state != STREAM:
            return
        if peer.durable >= self.log.last_index:
            peer.caught_up_at = self.now
            return
        for at, index in reversed(self.marks):
            if peer.durable >= index:
                peer.caught_up_at = max(peer.caught_up_at, at)
                return

    def isr_proposal(self, now: float) -> frozenset[str] | None:
        """The in-sync set as it should be (None: as it is, or a write is under
        way). The shell writes it to etcd, fenced by the epoch, then calls
        `isr_written` with what etcd holds (this, or the old set if it failed)."""
        self.tick(now)
        if self.deposed or self.pending is not None:
            return None
        wanted = {self.me}
        for node, peer in self.peers.items():
            lag = self.log.last_index - peer.durable
            if node in self.isr:
                out = (peer.state in (WANT, LOADING)
                       or (peer.state == STREAM and lag > self.limits.max_lag)
                       or (lag > 0 and now - peer.caught_up_at > self.limits.silence))
            else:
                out = peer.state != STREAM or lag > 0
            if not out:
                wanted.add(node)
        if wanted == self.isr:
            return None
        self.pending = frozenset(wanted)
        return self.pending

    def isr_written(self, nodes: Iterable[str]) -> None:
        self.isr = frozenset(nodes) | {self.me}
        self.pending = None
        self._advance()

    def _advance(self) -> None:
        if self.deposed or 2 * len(self.isr) <= len(self.members):
            return
        # a member being added counts already: it held everything when proposed
        held = [self.durable] + [self.peers[n].durable
                                 for n in self.isr | (self.pending or frozenset())
                                 if n in self.peers]
        index = min(held)
        if index > self.commit_index:
            self.commit_index = index
            self._moved = True

    def regroup(self, members: Iterable[str], isr: Iterable[str]) -> None:
        """The group's members changed in this epoch. The shell removed a leaving
        member from the in-sync set (etcd's, `isr`) before telling us, so the
        commit index never rests on it; a new member starts out of the set and
        counts once caught up and added, as any lagging follower."""
        self.members = frozenset(members) | {self.me}
        self.isr = (frozenset(isr) & self.members) | {self.me}
        for node in self.members - {self.me} - self.peers.keys():
            self.peers[node] = _Peer(self.now)
        for node in self.peers.keys() - self.members:
            del self.peers[node]
        if self.pending is not None:
            self.pending &= self.members
        self._advance()

    def status(self) -> list[int]:
        """For the status a user sees: the epoch, the commit index, then each
        member's index in sorted order of names (our log's last, the others'
        durable as they acknowledged it; 0 while unknown)."""
        held = [self.log.last_index if node == self.me else max(self.peers[node].durable, 0)
                for node in sorted(self.members | {self.me})]
        return [self.epoch, self.commit_index, *held]

    def take_committed(self) -> int | None:
        """The commit index, if it moved since the last call."""
        moved, self._moved = self._moved, False
        return self.commit_index if moved else None


class Follower:
    """This node's replica of one group: it follows whoever leads."""

    def __init__(self, group: str, me: str, last_epoch: int, last_index: int, *,
                 history: Iterable[tuple[int, int]] | None = None, limits: Limits = Limits()):
        self.group = group
        self.me = me
        self.epoch = last_epoch  # the newest seen
        if history is None:
            history = [(last_epoch, last_index)] if last_index else []
        self.log = _History(history, last_index, (), limits)
        self.durable_index = last_index
        self.loading: int | None = None  # the index of the snapshot being loaded
        # the epoch whose leader matched our log (a Send or a snapshot taken): only
        # then are our acks of its log, not of a tail it will replace
        self.matched = 0

    def hello(self, epoch: int) -> Hello:
        """Say what we hold to the leader of `epoch` (from etcd): older epochs are
        refused from now on. Mid-snapshot we hold no log."""
        self.epoch = max(self.epoch, epoch)
        return Hello(self.epoch, self.log.last_epoch, self.log.last_index, self.durable_index)

    def entries(self, epoch: int, first_index: int, prev_epoch: int, entries: Sequence[Entry]
                ) -> list[Clear | Apply | Ack | Refused | Resend | Reset]:
        """A Send: apply what continues our log. Each entry is checked against the
        one before it (Raft's log matching), so a stale or duplicated Send cannot
        graft the leader's entries onto a tail it does not have."""
        if epoch < self.epoch:
            return [Refused(self.epoch)]
        self.epoch = epoch
        out: list[Clear | Apply | Ack | Refused | Resend | Reset] = []
        if self.loading is not None:
            if first_index != 1:
                return out  # behind a snapshot under way
            self.loading = None  # a snapshot cut off, and the leader streams from the start
            out.append(Clear())
        if first_index > self.log.last_index + 1:
            return [Resend(epoch, self.log.last_index + 1)]
        if not self._matches(first_index - 1, prev_epoch):
            self.matched = 0
            return [Reset(epoch)]  # a tail the leader does not have
        cleared = len(out)
        for index, entry in enumerate(entries, first_index):
            if index <= self.log.last_index:
                if not self._matches(index, entry.epoch):
                    self.matched = 0
                    out.append(Reset(epoch))
                    return out
                continue  # a duplicate
            self.log.append(entry)
            out.append(Apply(entry.records))
        self.matched = epoch
        if len(out) == cleared:
            out.append(Ack(epoch, self.durable_index))  # our ack may have been lost
        return out

    def _matches(self, index: int, epoch: int) -> bool:
        """Whether our entry at `index` is of `epoch`, or either is unknown."""
        held = self.log.epoch_at(index) if 0 < index <= self.log.last_index else None
        return held is None or not epoch or held == epoch

    def durable(self, index: int) -> list[Ack]:
        """The shell's group commit made everything applied up to `index` durable."""
        if self.loading is not None or index <= self.durable_index:
            return []
        self.durable_index = min(index, self.log.last_index)
        if self.matched != self.epoch:
            return []
        return [Ack(self.epoch, self.durable_index)]

    def snapshot_chunk(self, epoch: int, index: int, first: bool,
                       records: object) -> list[Clear | Apply | Refused]:
        """A chunk of the leader's store as of `index`; the first starts a load
        afresh (a snapshot cut off and started again must not add up)."""
        if epoch < self.epoch:
            return [Refused(self.epoch)]
        self.epoch = epoch
        out: list[Clear | Apply | Refused] = []
        if first:
            self.loading = index
            self.log = _History([], 0, (), self.log.limits)
            self.durable_index = 0
            out.append(Clear())
        elif self.loading != index:
            return out  # of a snapshot given up
        out.append(Apply(records))
        return out

    def snapshot_end(self, epoch: int, index: int, last_epoch: int) -> list[Refused]:
        """The snapshot as of `index` (its entry there of `last_epoch`) is loaded;
        the shell's next group commit makes it durable (then `durable`)."""
        if epoch < self.epoch:
            return [Refused(self.epoch)]
        if self.loading == index:
            self.loading = None
            self.matched = epoch
            self.log = _History([(last_epoch, index)], index, (), self.log.limits)
        return []

    def lead(self, epoch: int, members: Iterable[str], isr: Iterable[str], now: float,
             limits: Limits | None = None) -> Leader:
        """This node won the election of `epoch`: lead from what we hold, the kept
        entries included, so followers just behind need no snapshot."""
        return Leader(self.group, epoch, members, isr, self.me, self.log.last_index,
                      durable=self.durable_index, history=self.log.starts, kept=list(self.log.kept),
                      now=now, limits=limits or self.log.limits)
