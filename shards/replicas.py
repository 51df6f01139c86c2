"""A shard's replicated quorum queues: the I/O shell around replication.py's cores,
one `Leader` per group led here and one `Follower` per group followed here
(docs/quorum-replication.md). The root says which (ReplicaRole), carries the
frames between the groups' shards on the nodes (ReplicaFrame, msgpack it does not
read) and writes the in-sync set to etcd (InSyncProposal, InSyncWritten).

A led queue is a Queue that serves; the persister's writes of it in a turn
(persister.py: PUT, DELETE, COUNTS, DELIVERED, DELIVERED_UPTO) become that turn's
entry when its commit begins, and the confirms of the publishes into it wait
until the commit index reaches that entry (behind them, every later confirm of
their channels). A followed queue is rows only, written as the entries come and
acknowledged once a commit made them durable. Each side keeps where its log
stands (storage.shardstore.Position) in its rows' commit, so a restart finds it."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence

import msgspec

from warren.storage.shardstore import Position, StoredQueue

from .message import RichMessage
from .persister import COUNTS, DELIVERED, PUT
from .records import (
    ROLE_FOLLOWER,
    ROLE_LEADER,
    Confirmed,
    ConsumerCancelled,
    CreateQueue,
    InSyncProposal,
    InSyncWritten,
    Rejected,
    ReplicaFrame,
    ReplicaRole,
    gateway_of,
)
from .replication import (
    Ack,
    Apply,
    Clear,
    Entry,
    Follower,
    Leader,
    Limits,
    Refused,
    Resend,
    Reset,
    Send,
    Snapshot,
)

log = logging.getLogger("warren.shard")

TIMER = "replicas"  # the shard's timer key: retries, in-sync proposals, hellos again
TICK = 0.5  # seconds between them
CHUNK_BYTES = 1 << 20  # a snapshot's frame carries about this much content
# A snapshot's chunks sent and not yet taken by the follower, at most: what it
# costs in RAM on the way (the shard's outbox, the root, the link) stays bounded
# however large the queue, and each chunk's content is read from the store as it
# goes.
SNAPSHOT_WINDOW = 4
RECORD_BYTES = 16  # what a record costs beyond its content, for the entries' bounds

# A frame's payload: msgpack [kind, ...] with the fields of replication.py's message;
# TOOK (epoch, index, chunk number) is the shells' own: a snapshot's chunk taken.
SEND, CHUNK, END, HELLO, ACK, REFUSED, RESEND, RESET, TOOK = range(9)
_TO_FOLLOWER = (SEND, CHUNK, END)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class _Sending:
    """A snapshot on its way to one follower: the chunks still to read, how many
    went, and the last the follower took."""

    __slots__ = ("index", "last_epoch", "chunks", "sent", "took")

    def __init__(self, index: int, last_epoch: int, chunks: Iterator[list[tuple]]):
        self.index = index
        self.last_epoch = last_epoch
        self.chunks = chunks
        self.sent = 0
        self.took = -1


class Replicas:
    """The shard's replica groups by qid. Bound to its shard, whose queues, outbox,
    timers and persister it works with."""

    def __init__(self, shard, limits: Limits = Limits()):
        self.shard = shard
        self.persister = shard.persister
        self.limits = limits
        self.leaders: dict[int, Leader] = {}
        self.followers: dict[int, Follower] = {}
        self.records: dict[int, StoredQueue] = {}  # a followed queue's record
        self.members: dict[int, list[str]] = {}  # a followed group's, for its hellos
        self.leader_node: dict[int, str] = {}  # where a follower's acks go
        # Confirms into led queues: (channel, seq) -> [[qid, entry index or None]],
        # the index set when their commit begins; `fresh` are those not set yet.
        self.tags: dict[tuple[int, int], list[list]] = {}
        self.fresh: list[tuple[int, int]] = []
        # Confirms whose commit is durable here, in their order: [channel, seq,
        # accepted, waits]; and how many of each channel's are among them.
        self.held: deque[list] = deque()
        self.channels: dict[int, int] = {}
        self.applied: dict[int, int] = {}  # followed qid -> last index written this turn
        self.inflight: tuple[dict, dict] | None = None  # (appended, applied) of the commit
        self.carried: tuple[dict, dict] = ({}, {})  # of commits that failed: the next covers
        self.spill: list | None = None  # events of a commit's start or end (_emit)
        self.deferred: dict[int, ReplicaRole] = {}  # promotions waiting for the commit
        self.sending: dict[tuple[int, str], _Sending] = {}  # (qid, follower) -> its snapshot
        for qid, (stored, position) in self.persister.replicas.items():
            self.records[qid] = stored
            last_epoch = position.starts[-1][0] if position.starts else 0
            self.followers[qid] = Follower(str(qid), "", last_epoch, position.last_index,
                                           history=position.starts, limits=limits)
            if not position.last_index:  # a snapshot cut off by a crash: no half kept
                self.persister.clear_replica(qid, stored)

    def active(self) -> bool:
        """Whether the commits have anything to do here."""
        return bool(self.leaders or self.followers or self.tags or self.held)

    # -- commands ----------------------------------------------------------------

    def handle(self, cmd, now: float) -> None:
        kind = type(cmd)
        if kind is ReplicaFrame:
            self._frame(cmd.qid, cmd.node, _decode(cmd.payload), now)
        elif kind is ReplicaRole:
            self._role(cmd, now)
        elif kind is InSyncWritten:
            leader = self.leaders.get(cmd.qid)
            if leader is not None and leader.epoch == cmd.epoch:
                leader.isr_written(cmd.nodes)
                self._committed(leader)
                self._sends(cmd.qid, leader)  # a snapshot waits for its follower to be out
        self._schedule(now)

    def figures(self, qid: int) -> list[int]:
        """What QueueInfoReply's row of a queue this shard leads adds (records.py)."""
        leader = self.leaders.get(qid)
        return [0, 0, *leader.status()] if leader is not None else []

    def create(self, cmd: CreateQueue) -> None:
        """A followed queue's record (CreateQueue): its rows come with the entries."""
        follower = self.followers[cmd.qid]
        self.records[cmd.qid] = StoredQueue(cmd.spec, cmd.arguments)
        self.persister.create_replica(cmd, _position(follower))

    def deleted(self, qid: int) -> None:
        """The queue was deleted (led here: its Queue is gone already): its group
        goes, and the confirms that waited for it leave as the queue took them."""
        self.persister.replicated.discard(qid)
        self.persister.entries.pop(qid, None)
        self._stop_sending(qid)
        if self.leaders.pop(qid, None) is not None:
            self._settle_waits(qid, None)
        if self.followers.pop(qid, None) is not None:
            self.persister.delete_queue(qid)
        for table in (self.records, self.members, self.leader_node, self.applied):
            table.pop(qid, None)

    def _settle_waits(self, qid: int, accepted: bool | None) -> None:
        """The confirms that wait for the queue's entries wait no more: nacked if
        not `accepted`, else as the queue took them."""
        for waits in self.tags.values():
            if any(wait[0] == qid for wait in waits):
                waits[:] = [[qid, -1]] if accepted is False else [  # -1: nacked
                    wait for wait in waits if wait[0] != qid]
        for item in self.held:
            if any(wait[0] == qid for wait in item[3]):
                if accepted is False:
                    item[2] = False
                    item[3] = []
                else:
                    item[3] = [wait for wait in item[3] if wait[0] != qid]
        for record in self._release():
            self._emit(record)

    def _role(self, cmd: ReplicaRole, now: float) -> None:
        qid = cmd.qid
        self.deferred.pop(qid, None)
        if cmd.role == ROLE_LEADER:
            self._lead(cmd, now)
            return
        leader = self.leaders.get(qid)
        if leader is not None and cmd.role == ROLE_FOLLOWER and cmd.epoch < leader.epoch:
            return  # of an election before ours
        if qid in self.leaders or (cmd.role == ROLE_FOLLOWER and qid in self.shard.queues):
            self._depose(qid, cmd.me)
        if cmd.role != ROLE_FOLLOWER:
            self.followers.pop(qid, None)
            for table in (self.members, self.leader_node, self.applied):
                table.pop(qid, None)
            return
        follower = self.followers.get(qid)
        if follower is None:
            follower = self.followers[qid] = Follower(str(qid), cmd.me, 0, 0, limits=self.limits)
        follower.me = cmd.me
        self.members[qid] = cmd.members
        self._hello(qid, follower, cmd.epoch)

    def _hello(self, qid: int, follower: Follower, epoch: int) -> None:
        """Say what we hold to every other member: the leader among them listens."""
        hello = follower.hello(epoch)
        payload = _encode((HELLO, *hello))
        for node in self.members.get(qid, ()):
            if node != follower.me:
                self._emit(ReplicaFrame(qid, node, payload))

    def _lead(self, cmd: ReplicaRole, now: float) -> None:
        qid = cmd.qid
        leader = self.leaders.get(qid)
        if leader is not None and cmd.epoch == leader.epoch and \
                frozenset(cmd.members) != leader.members:  # a member added or removed
            leader.regroup(cmd.members, cmd.in_sync)
            self._committed(leader)
            self._sends(qid, leader)
            return
        if leader is not None and cmd.epoch <= leader.epoch:
            return
        if leader is not None:  # elected again: the same queue, a new epoch
            self._append(qid, leader)
            new = Leader(str(qid), cmd.epoch, cmd.members, cmd.in_sync, cmd.me,
                         leader.log.last_index, durable=leader.durable,
                         history=leader.log.starts, kept=list(leader.log.kept), now=now,
                         limits=self.limits)
        elif qid in self.shard.queues:  # a queue of this shard's, replicated from now on
            self.followers.pop(qid, None)
            new = Leader(str(qid), cmd.epoch, cmd.members, cmd.in_sync, cmd.me, 0, now=now,
                         limits=self.limits)
            records = [record for chunk in self._rows(qid, CHUNK_BYTES) for record in chunk]
            if records:  # what it holds already is the first entry
                self.carried[0][qid] = self._append_records(qid, new, records)
        elif qid in self.followers and qid in self.records:
            if self.shard.commits.inflight is not None:
                # its rows are being written in the committer thread: once they are
                self.deferred[qid] = cmd
                return
            follower = self.followers.pop(qid)
            follower.me = cmd.me
            new = follower.lead(cmd.epoch, cmd.members, cmd.in_sync, now, self.limits)
            self._serve(qid, now)
        else:
            log.error("shard %d: told to lead queue %d, whose record it does not hold",
                      self.shard.index, qid)
            return
        log.info("shard %d: leads queue %d in epoch %d", self.shard.index, qid, cmd.epoch)
        self.leaders[qid] = new
        self.persister.replicated.add(qid)
        self.persister.set_position(qid, _position(new))

    def _serve(self, qid: int, now: float) -> None:
        """A followed queue, led here now: its Queue from its rows (every unacked
        message ready again, marked redelivered, its counts kept)."""
        shard = self.shard
        queue = self.persister.promote(qid, self.records.pop(qid), now)
        self.members.pop(qid, None)
        self.leader_node.pop(qid, None)
        self.applied.pop(qid, None)
        shard.queues[qid] = queue
        shard.ram_bytes += queue.ram_bytes
        shard.timers.schedule(qid, queue.next_deadline())

    def _depose(self, qid: int, me: str) -> None:
        """No longer the leader: the Queue goes (its rows stay, a replica's), its
        consumers are cancelled as a deleted queue's are, and the confirms that
        wait for its entries are nacked."""
        shard = self.shard
        leader = self.leaders.pop(qid, None)
        self.persister.replicated.discard(qid)
        self._stop_sending(qid)
        queue = shard.queues.pop(qid, None)
        if leader is not None:
            self._append(qid, leader)
            follower = Follower(str(qid), me, leader.log.last_epoch, leader.log.last_index,
                                history=leader.log.starts, limits=self.limits)
            follower.durable_index = min(leader.durable, leader.log.last_index)
        else:
            follower = Follower(str(qid), me, 0, 0, limits=self.limits)
        self.followers[qid] = follower
        self.persister.set_position(qid, _position(follower))
        if leader is not None:
            log.info("shard %d: no longer leads queue %d", shard.index, qid)
        if queue is not None:
            self.records[qid] = StoredQueue(queue.spec, queue.arguments)
            for holder in list(queue.consumers):
                self._emit(ConsumerCancelled(holder, qid))
            shard.timers.cancel(qid)
            shard.ram_bytes -= queue.ram_bytes
        self._settle_waits(qid, False)

    # -- frames --------------------------------------------------------------------

    def _frame(self, qid: int, node: str, frame: list, now: float) -> None:
        kind = frame[0]
        leader = self.leaders.get(qid)
        if leader is not None:
            leader.now = now
            if kind == HELLO:
                leader.hello(node, *frame[1:])
            elif kind == ACK:
                leader.acked(node, *frame[1:])
            elif kind == RESEND:
                leader.resend(node, *frame[1:])
            elif kind == RESET:
                leader.reset(node, *frame[1:])
            elif kind == REFUSED:
                leader.refused(node, *frame[1:])
            elif kind == TOOK:
                sending = self.sending.get((qid, node))
                if sending is not None and frame[1:3] == [leader.epoch, sending.index]:
                    sending.took = max(sending.took, frame[3])
                    self._pace(qid, leader, node)
            elif frame[1] > leader.epoch:  # entries of a newer leader: we are deposed
                leader.refused(node, frame[1])
            else:
                self._send(qid, node, (REFUSED, leader.epoch))
            self._committed(leader)
            self._sends(qid, leader)
            self._propose(qid, leader, now)
            return
        follower = self.followers.get(qid)
        if follower is None or kind not in _TO_FOLLOWER or qid not in self.records:
            return  # not ours, for the leader we no longer are, or before our record
        out: Sequence[Clear | Apply | Ack | Refused | Resend | Reset]
        if kind == SEND:
            out = follower.entries(frame[1], frame[2], frame[3],
                                   [Entry(*entry) for entry in frame[4]])
        elif kind == CHUNK:
            out = follower.snapshot_chunk(frame[1], frame[2], frame[3], frame[4])
            if out and type(out[-1]) is Apply and len(frame) > 5:
                # the leader sends more as we take them (one before the window
                # came sends its chunks numberless, all at once)
                self._send(qid, node, (TOOK, frame[1], frame[2], frame[5]))
        else:
            out = follower.snapshot_end(frame[1], frame[2], frame[3])
        written = False
        for step in out:
            if type(step) is Apply:
                self.persister.apply(qid, step.records)
                written = True
            elif type(step) is Clear:
                self.persister.clear_replica(qid, self.records[qid])
                written = True
            else:
                self._send(qid, node, _follower_frame(step))
        if not (out and type(out[0]) is Refused):
            self.leader_node[qid] = node
        if written or kind == END:
            self.persister.set_position(qid, _position(follower))
            self.applied[qid] = follower.log.last_index

    def _send(self, qid: int, node: str, frame: tuple) -> None:
        self._emit(ReplicaFrame(qid, node, _encode(frame)))

    def _sends(self, qid: int, leader: Leader) -> None:
        """What the leader has for its followers, snapshots read from the queue."""
        for key in [key for key in self.sending if key[0] == qid]:
            if not leader.snapshotting(key[1]):  # cut off: its follower said hello
                del self.sending[key]
        snapshots = False
        for send in leader.take_sends():
            if type(send) is Send:
                self._send(qid, send.node, (SEND, send.epoch, send.first_index, send.prev_epoch,
                                            [tuple(entry) for entry in send.entries]))
            elif type(send) is Snapshot:
                snapshots = self._snapshot(qid, leader, send.node) or snapshots
        if snapshots:  # the entries after them, or an empty Send that lets it ack
            self._sends(qid, leader)

    def _snapshot(self, qid: int, leader: Leader, node: str) -> bool:
        """The queue's rows as of the leader's last entry, in chunks sent as the
        follower takes them. A chunk read later holds the rows as they are then,
        and the entries after the snapshot's index write every change since again,
        to the same end (as do writes of this turn not yet in an entry)."""
        index = leader.log.last_index
        last_epoch = leader.snapshot_started(node, index)
        if last_epoch is None:
            return False
        self.sending[(qid, node)] = _Sending(index, last_epoch, self._rows(qid, CHUNK_BYTES))
        return self._pace(qid, leader, node)

    def _stop_sending(self, qid: int) -> None:
        for key in [key for key in self.sending if key[0] == qid]:
            del self.sending[key]

    def _pace(self, qid: int, leader: Leader, node: str) -> bool:
        """Send the snapshot's next chunks while fewer than SNAPSHOT_WINDOW are
        untaken. True once its end went: the entries after it may go."""
        sending = self.sending.get((qid, node))
        if sending is None:
            return False
        if not leader.snapshotting(node):  # replaced, cut off, or deposed
            del self.sending[(qid, node)]
            return False
        while sending.sent - sending.took <= SNAPSHOT_WINDOW:
            records = next(sending.chunks, None)
            if records is None:
                del self.sending[(qid, node)]
                self._send(qid, node, (END, leader.epoch, sending.index, sending.last_epoch))
                leader.snapshot_sent(node)
                return True
            self._send(qid, node, (CHUNK, leader.epoch, sending.index, sending.sent == 0,
                                   records, sending.sent))
            sending.sent += 1
        return False

    def _rows(self, qid: int, limit: int) -> Iterator[list[tuple]]:
        """The led queue's rows as records, about `limit` bytes of content at a time
        (at least one, maybe empty): its stored messages, their content read back
        from the store where it left RAM, and their delivery marks."""
        queue = self.shard.queues[qid]
        handed = {seq for held in queue.holdings.values() for seq in held}
        messages = [m for held in queue.holdings.values() for m in held.values()]
        messages += list(queue.ready) + list(queue.returned)
        messages = sorted((m for m in messages if m.stored), key=lambda m: m.seq)
        store = self.persister.store_of(qid)
        start = 0
        while True:
            chunk: list = []
            size = 0
            while start < len(messages) and (size < limit or not chunk):
                chunk.append(messages[start])
                size += len(messages[start].content[3]) if messages[start].content else 0
                start += 1
            read = iter(store.read_many([(qid, m.seq) for m in chunk if m.content is None]))
            records: list[tuple] = []
            for msg in chunk:
                content = msg.content
                if content is None:
                    found = next(read)
                    content = (found.exchange, found.routing_key, bytes(found.properties),
                               bytes(found.body)) if found is not None else ("", "", b"", b"")
                rich = type(msg) is RichMessage and not queue.tracked
                records.append((PUT, msg.seq, content, rich))
                counts = getattr(msg, "acquired", 0) or getattr(msg, "delivery_count", 0)
                if counts:
                    records.append((COUNTS, msg.seq, msg.delivery_count, msg.acquired))
                elif msg.redelivered or msg.seq in handed:
                    records.append((DELIVERED, msg.seq, rich))
            yield records
            if start >= len(messages):
                return

    def _propose(self, qid: int, leader: Leader, now: float) -> None:
        nodes = leader.isr_proposal(now)
        if nodes is not None:
            self._emit(InSyncProposal(qid, leader.epoch, sorted(nodes)))

    # -- commits and confirms --------------------------------------------------------

    def tag(self, cmd) -> None:
        """A confirmed publish went into these queues: led ones hold its confirm."""
        waits = [[qid, None] for qid in cmd.qids if qid in self.leaders]
        if waits:
            key = (cmd.confirm_channel, cmd.confirm_seq)
            self.tags[key] = waits
            self.fresh.append(key)

    def _emit(self, event) -> None:
        """An event for the gateway (the root, for frames): with the commit's
        confirms while a commit begins or ends, else with the turn's events."""
        if self.spill is not None:
            self.spill.append(event)
        else:
            self.shard.outbox.add(event)

    def begin_commit(self) -> list:
        """A commit begins: this turn's writes of each led queue become its entry,
        and the confirms of the turn learn which entry they wait for. The frames
        that carry the entries, to send now (not behind the next turn)."""
        self.spill = []
        appended, applied = self.carried
        self.carried = ({}, {})
        entries = self.persister.entries
        if entries:
            self.persister.entries = {}
            for qid, records in entries.items():
                leader = self.leaders.get(qid)
                if leader is not None and records:
                    appended[qid] = self._append_records(qid, leader, records)
        for key in self.fresh:
            for wait in self.tags.get(key, ()):
                if wait[1] is None:
                    leader = self.leaders.get(wait[0])
                    wait[1] = leader.log.last_index if leader is not None else -1
        self.fresh = []
        if self.applied:
            applied.update(self.applied)
            self.applied = {}
        self.inflight = (appended, applied)
        out, self.spill = self.spill, None
        return out

    def _append(self, qid: int, leader: Leader) -> None:
        """This turn's writes of the queue, if any, as an entry now: the next commit
        makes it durable here (for whichever core holds the queue then)."""
        records = self.persister.entries.pop(qid, None)
        if records:
            self.carried[0][qid] = self._append_records(qid, leader, records)

    def _append_records(self, qid: int, leader: Leader, records: list) -> int:
        size = sum(RECORD_BYTES + (len(rec[2][2]) + len(rec[2][3]) if rec[0] == PUT else 0)
                   for rec in records)
        index = leader.append(records, size)
        self.persister.set_position(qid, _position(leader))
        self._sends(qid, leader)
        return index

    def committed(self, commit, ok: bool) -> list:
        """A commit ended (durable if `ok`): the followers it made durable ack, the
        leaders count it, and the confirms riding on it that wait for entries, or
        behind such, are held (`commit.confirms` keeps the others). The acks and
        the confirms released now, to send."""
        appended, applied = self.inflight or ({}, {})
        self.inflight = None
        self.spill = []
        if self.deferred:
            deferred, self.deferred = self.deferred, {}
            for cmd in deferred.values():
                self._lead(cmd, time.monotonic())
        if not ok:
            self.carried[0].update(appended)
            self.carried[1].update(applied)
        else:
            for qid, index in applied.items():
                self._durable(qid, index)
            for qid, index in appended.items():
                leader = self.leaders.get(qid)
                if leader is not None:
                    leader.durable_here(index)
                    leader.take_committed()
                else:
                    self._durable(qid, index)
        if self.tags or self.held:
            kept = []
            for confirm in commit.confirms:
                channel, seq, accepted = confirm
                waits = self.tags.pop((channel, seq), None)
                if waits is None and channel not in self.channels:
                    kept.append(confirm)
                    continue
                if not ok or (waits and any(wait[1] == -1 for wait in waits)):
                    accepted, waits = False, []
                self.held.append([channel, seq, accepted, waits or []])
                self.channels[channel] = self.channels.get(channel, 0) + 1
            commit.confirms = kept
        out, self.spill = self.spill, None
        return out + self._release()

    def _durable(self, qid: int, index: int) -> None:
        follower = self.followers.get(qid)
        node = self.leader_node.get(qid)
        if follower is not None:
            for ack in follower.durable(index):
                if node is not None:
                    self._send(qid, node, (ACK, ack.epoch, ack.upto))

    def _committed(self, leader: Leader) -> None:
        if leader.take_committed() is not None:
            for record in self._release():
                self._emit(record)

    def _release(self) -> list:
        """The held confirms whose entries the commit index reached, in order."""
        done: list[list] = []
        leaders = self.leaders
        while self.held:
            item = self.held[0]
            if any(wait[0] not in leaders or leaders[wait[0]].commit_index < wait[1]
                   for wait in item[3]):
                break
            done.append(self.held.popleft())
            left = self.channels[item[0]] - 1
            if left:
                self.channels[item[0]] = left
            else:
                del self.channels[item[0]]
        if not done:
            return []
        out = []
        for accepted, record in ((True, Confirmed), (False, Rejected)):
            picked = [item for item in done if item[2] is accepted]
            if picked:
                out.append(record([item[0] for item in picked], [item[1] for item in picked]))
        return out

    def forget(self, gateway: int) -> None:
        """A gateway died: its channels' confirms go to nobody."""
        self.tags = {key: waits for key, waits in self.tags.items()
                     if gateway_of(key[0]) != gateway}
        self.held = deque(item for item in self.held if gateway_of(item[0]) != gateway)
        self.channels = {channel: count for channel, count in self.channels.items()
                         if gateway_of(channel) != gateway}

    # -- time ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Retries and in-sync proposals of the leaders; hellos again from followers
        no leader answered yet (it may have been told it leads after our hello)."""
        for qid, leader in self.leaders.items():
            self._propose(qid, leader, now)
            self._sends(qid, leader)
        for qid, follower in self.followers.items():
            if follower.matched != follower.epoch and qid in self.members:
                self._hello(qid, follower, follower.epoch)
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        wanted = self.leaders or any(f.matched != f.epoch and qid in self.members
                                     for qid, f in self.followers.items())
        self.shard.timers.schedule(TIMER, now + TICK if wanted else None)


def _position(core: Leader | Follower) -> Position:
    return Position([(epoch, start) for epoch, start in core.log.starts], core.log.last_index)


def _follower_frame(step) -> tuple:
    kind = type(step)
    if kind is Ack:
        return (ACK, step.epoch, step.upto)
    if kind is Refused:
        return (REFUSED, step.epoch)
    if kind is Resend:
        return (RESEND, step.epoch, step.from_index)
    if kind is Reset:
        return (RESET, step.epoch)
    raise ValueError(f"no frame for {step!r}")
