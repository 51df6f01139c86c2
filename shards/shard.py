"""A shard's queues and what their commands do, as a pure state machine: commands
in (`run`), effects out (the outbox's events, the persister's writes, the group
commit's confirms). The shard process (main.py) is the I/O shell around it.
pip install compiles this module as it is (warren.shards._shard, typed by
_shard.pxd), the build the compiled loop uses."""

from __future__ import annotations

import logging
import time

from . import build
from .effects import CountsChanged, Delivered, Destroyed, Persist, Refused, Remove
from .groupcommit import Commit, GroupCommit
from .model import Queue
from .outbox import Outbox as PureOutbox
from .persister import Persister

# Records by name: a compiled module would look each up in `records` at every use.
from .records import (
    Alarm,
    Cancel,
    Consume,
    ConsumerTimedOut,
    CreateQueue,
    DeleteQueue,
    Deliver,
    GatewayLost,
    Get,
    GetReply,
    InSyncWritten,
    Publish,
    PublishCost,
    QueueInfo,
    QueueInfoReply,
    Refusal,
    ReleaseHolders,
    ReplicaFrame,
    ReplicaRole,
    Reply,
    Stop,
    Sync,
    gateway_of,
)
from .replicas import TIMER as REPLICAS_TIMER
from .replicas import Replicas
from .stats import StatsLog
from .streams import TIMER as STREAMS_TIMER
from .timers import TimerHeap

Outbox = build.twin(PureOutbox, "warren.shards._outbox", "Outbox")

# Ready messages beyond which a queue with consumers counts as behind them (a few
# delivery windows): with several gateways, its publishers' credit then waits.
BEHIND_AT = 10_000
# A queue whose consumers each take at most their prefetch per round trip of
# their acks, and which has a backlog, makes publishing into it dearer: a publish
# spends one more unit of credit for every BACKLOG_STEP ready messages, up to
# MAX_PUBLISH_COST times its own cost, so its publishers slow towards the pace
# its consumers take and the backlog stops growing (docs/architecture.md, Flow
# control). A queue without consumers is a buffer: the memory alarm bounds it.
BACKLOG_STEP = 200
MAX_PUBLISH_COST = 30
STORE_RETRY = "store retry"  # the timer for writing again what a full store refused
STORE_CHECKPOINT = "store checkpoint"  # the timer for writing the journals to LMDB

log = logging.getLogger("warren.shard")


class Shard:
    """Commands in, effects out; the queues hold all the logic."""

    def __init__(self, index: int, persister: Persister, stats: StatsLog, gateways: int = 1):
        self.index = index
        self.persister = persister
        self.stats = stats
        started = time.monotonic()
        stats.event("shard_started")
        self.queues: dict[int, Queue] = {q.qid: q for q in persister.recover(time.monotonic())}
        stats.event("shard_recovered", recovery_seconds=round(time.monotonic() - started, 6),
                    queues=len(self.queues),
                    messages=sum(q.ready_count for q in self.queues.values()))
        self.holder_queues: dict[int, set[int]] = {}  # who holds what where, for channel close
        self.outbox = Outbox(gateways)
        self.lost: list[tuple[int, GatewayLost]] = []  # (origin, report), handled last
        self.commits = GroupCommit()
        # When queues have timed work (message TTL, x-expires, consumer timeouts).
        self.timers = TimerHeap()
        for queue in self.queues.values():
            self._schedule(queue)
        self.running = True
        self.stored_ok = True  # did the last commit succeed (else: the disk alarm)
        self.alarms: set[str] = set()
        self.ram_bytes = sum(q.ram_bytes for q in self.queues.values())  # content in RAM
        # Gateways whose publishes this turn fed a queue whose consumers are behind:
        # their credit waits for the other gateways (gatewayrings.py).
        self.behind: set[int] = set()
        self.paced = gateways > 1
        self.costs: dict[int, int] = {}  # qid -> publish cost above 1 the gateways were told
        # Stream queues live beside the queues (shards/streams.py): only commands
        # for a qid that is not a queue's look there, so queues pay nothing for them.
        self.streams = persister.streams
        self.streams.bind(self.outbox, self.timers)
        stats.streams = self.streams
        # Replicated quorum queues (shards/replicas.py): a led one is a queue as any
        # other, but for its confirms (tagged only while this shard leads a group)
        # and the commits, which look there only while it has replica groups.
        self.replicas = Replicas(self)

    def take_events(self) -> list[list]:
        """This turn's events but confirms, per gateway, with stored content read back."""
        turn = self.outbox.take()
        if self.persister.content_out:  # else every event carries its content
            for events in turn:
                if events:
                    self.persister.fill(events)
        return turn

    def take_lost(self) -> list[tuple[int, GatewayLost]]:
        """This turn's GatewayLost reports with the gateway each came from: handled
        after the turn's other commands, which may include the lost gateway's last."""
        lost, self.lost = self.lost, []
        return lost

    def gateway_lost(self, origin: int, cmd: GatewayLost, now: float) -> None:
        """A gateway died: release its holders as its channels' close would, and
        drop what waits for it (events, the confirms of its channels). The one
        that replaces it hears of the alarms in force."""
        holders = [h for h in self.holder_queues if gateway_of(h) == cmd.gateway]
        if holders:
            self.handle(ReleaseHolders(holders), now)
        self.outbox.drop(cmd.gateway)
        self.commits.forget(cmd.gateway)
        self.replicas.forget(cmd.gateway)
        for resource in sorted(self.alarms):  # for the gateway that replaces it
            self.outbox.add_to(cmd.gateway, Alarm(resource, True))
        self.outbox.origin = origin
        self.outbox.add(Reply(cmd.req))

    # -- commits and confirms ------------------------------------------------------

    def has_commit_work(self, now: float) -> bool:
        if self.commits.gathering:
            return True
        persister = self.persister
        if not persister.open_batches and persister.checkpoint_at is None:
            return False  # every turn of a transient load: no call into the persister
        return persister.writes_due(now)

    def start_commit(self, committer, now: float) -> list:
        """With no commit in flight and commit work (the loop asks has_commit_work
        first): hand the writes gathered so far to the committer, with the confirms
        that must wait for them. Confirms of a turn that wrote nothing are returned
        to be sent at once."""
        replicas = self.replicas.active()
        frames = self.replicas.begin_commit() if replicas else []
        if not self.persister.has_writes(now):
            commit = self.commits.take(now)
            held = self.replicas.committed(commit, True) if replicas else []
            return self.commits.finished(commit, True, [], now) + held + frames
        committer.submit(self.commits.begin(now, self.persister.begin_commit()).writes)
        return frames

    def finish_commit(self) -> list:
        """The commit in flight is durable (or failed): its confirms, to send."""
        commit = self.commits.end()
        self.persister.finish_commit(commit.writes, self._evict)
        return self._committed(commit)

    def commit_now(self, started: float | None = None) -> list:
        """Commit in this thread (no commit in flight) and return the confirms."""
        commit = self.commits.take(time.monotonic() if started is None else started)
        frames = self.replicas.begin_commit() if self.replicas.active() else []
        commit.writes = self.persister.commit(self._evict)
        return self._committed(commit) + frames

    def _committed(self, commit: Commit) -> list:
        """After a commit: its confirms (nacks if it failed)."""
        self.stored_ok = commit.writes.ok
        self.timers.schedule(STORE_RETRY, self.persister.retry_at)
        self.timers.schedule(STORE_CHECKPOINT, self.persister.checkpoint_at)
        held = self.replicas.committed(commit, commit.writes.ok) if self.replicas.active() else []
        return self.commits.finished(commit, commit.writes.ok, commit.writes.sizes,
                                     time.monotonic()) + held

    def _evict(self, qid: int, msg) -> None:
        queue = self.queues.get(qid)
        if queue is not None:
            before = queue.ram_bytes
            queue.evict(msg)
            self.ram_bytes += queue.ram_bytes - before

    def _apply(self, queue: Queue, cmd, now: float) -> bool:
        """Apply a command to a queue; False if the queue refused a publish."""
        before = queue.ram_bytes
        accepted = self._step(queue, before, queue.apply(cmd, now))
        if _has_timers(queue):
            self._schedule(queue)
        return accepted

    def _step(self, queue: Queue, before: int, effects: list) -> bool:
        """Carry out the effects of one step of a queue's state machine, taken when
        the bodies it held in RAM were `before` bytes, and follow the change in
        them. False if it refused a publish."""
        accepted = self._effects(effects)
        self.ram_bytes += queue.ram_bytes - before
        return accepted

    # -- timers ------------------------------------------------------------------

    def run_timers(self, now: float) -> None:
        """Give the queues whose timers are due their tick. A due store retry or
        checkpoint only wakes the loop, which then commits."""
        for key in self.timers.due(now):
            queue = self.queues.get(key) if type(key) is int else None
            if queue is None:
                if key == STREAMS_TIMER:
                    self.streams.tick(now)
                elif key == REPLICAS_TIMER:
                    self.replicas.tick(now)
                continue
            deadline = queue.next_deadline()  # the timer may be early (timers.py)
            if deadline is not None and deadline <= now:
                before = queue.ram_bytes
                self._step(queue, before, queue.tick(now))
            self._schedule(queue)

    def _schedule(self, queue: Queue) -> None:
        self.timers.schedule(queue.qid, None if queue.deleted else queue.next_deadline())

    def check_resources(self, memory_limit: int, stored: bool) -> bool:
        """Raise or clear this shard's alarms (publishers are blocked while any is on);
        True if one changed (its event is in the outbox). Asked every turn."""
        alarms, changed = self.alarms, False
        if memory_limit and (self.ram_bytes > memory_limit) != ("memory" in alarms):
            self._alarm("memory", self.ram_bytes > memory_limit)
            changed = True
        if stored == ("disk" in alarms):
            self._alarm("disk", not stored)
            changed = True
        return changed

    def _alarm(self, resource: str, active: bool) -> None:
        """An alarm turns on or off."""
        if active:
            self.alarms.add(resource)
        else:
            self.alarms.discard(resource)
        self.outbox.add(Alarm(resource, active))
        self.stats.event("alarm", resource=resource, state="on" if active else "off",
                         ram_bytes=self.ram_bytes)

    def run(self, cmd, now: float) -> None:
        """Handle one command (run_all)."""
        self.run_all((cmd,), now)

    def run_all(self, commands, now: float) -> None:
        """Handle a batch of commands; one that fails (a bug) is answered and logged,
        and the shard goes on serving everyone else. (One call a batch, not one a
        command: a steady turn's batch holds a command or two.)"""
        for cmd in commands:
            try:
                self.handle(cmd, now)
            except Exception:
                log.exception("shard %d: %s failed", self.index, type(cmd).__name__)
                req = getattr(cmd, "req", 0)
                if type(cmd) is Get:
                    self.outbox.add(GetReply(req, cmd.qid, refused=Refusal.FAILED))
                elif req:
                    self.outbox.add(Reply(req, Refusal.FAILED))
                elif type(cmd) is Publish and cmd.confirm_channel:
                    self.commits.confirm(cmd.confirm_channel, cmd.confirm_seq, accepted=False)

    def handle(self, cmd, now: float) -> None:
        kind = type(cmd)
        if kind is Publish:
            accepted = True  # by every queue (x-overflow reject-publish turns it away)
            for qid in cmd.qids:
                queue = self.queues.get(qid)
                if queue is None:
                    if qid in self.streams.streams:
                        self.persister.append(qid, cmd)
                    elif qid in self.replicas.followers:
                        accepted = False  # routed before the leader moved: nacked, not lost
                    continue
                if queue.straight and queue.consumers:
                    # What _apply does with the one Deliver of the queue's short way
                    # (nothing ready, so nobody is behind; its timers stay as they
                    # were), without its steps: most of a turn at a steady rate.
                    before = queue.ram_bytes
                    deliver = queue.publish_straight(cmd, now)
                    if deliver is not None:
                        self.outbox.add(deliver)
                        self.ram_bytes += queue.ram_bytes - before
                        continue
                if not self._apply(queue, cmd, now):
                    accepted = False
                if queue.consumers and queue.ready_count >= BACKLOG_STEP:
                    self._price(qid, queue)
                    if self.paced and queue.ready_count >= BEHIND_AT:
                        self.behind.add(self.outbox.origin)
            if cmd.confirm_channel:
                if self.replicas.leaders:
                    self.replicas.tag(cmd)
                self.commits.confirm(cmd.confirm_channel, cmd.confirm_seq, accepted)
        elif kind is CreateQueue:
            if cmd.spec.queue_type == "stream":
                if cmd.qid not in self.streams.streams:
                    self.persister.create_stream(cmd)
                    self.stats.event("queue_declared", vhost=cmd.spec.vhost,
                                     queue=cmd.spec.name, durable=True)
            elif cmd.qid in self.replicas.followers:
                self.replicas.create(cmd)
            elif cmd.qid not in self.queues:
                queue = self.queues[cmd.qid] = Queue(cmd)
                if queue.stored:
                    self.persister.create_queue(queue)
                self.stats.event("queue_declared", vhost=cmd.spec.vhost, queue=cmd.spec.name,
                                 durable=cmd.spec.durable)
            self.outbox.add(Reply(cmd.req))
        elif kind is ReleaseHolders:
            qids: set[int] = set()
            for holder in cmd.holders:
                qids |= self.holder_queues.pop(holder, set())
            for qid in qids:
                queue = self.queues.get(qid)
                if queue is not None:
                    self._apply(queue, cmd, now)
                elif qid in self.streams.streams:
                    self.streams.apply(qid, cmd, now)
        elif kind is QueueInfo:
            wanted = cmd.qids or list(self.queues) + list(self.streams.streams)
            self.outbox.add(QueueInfoReply(cmd.req, [
                _queue_figures(self.queues[qid]) + self.replicas.figures(qid)
                if qid in self.queues
                else self.streams.figures(qid) for qid in wanted
                if qid in self.queues or qid in self.streams.streams],
                self.commits.fsyncs, self.commits.messages,
                [] if cmd.qids else list(self.replicas.records)))
        elif kind is Stop:
            self.running = False
        elif kind is Sync:
            self.outbox.add(Reply(cmd.req))
        elif kind is GatewayLost:
            if not 0 < cmd.gateway < self.outbox.gateways or cmd.gateway == self.outbox.origin:
                raise ValueError(f"no gateway {cmd.gateway} to lose")
            self.lost.append((self.outbox.origin, cmd))
        elif kind is ReplicaFrame or kind is ReplicaRole or kind is InSyncWritten:
            self.replicas.handle(cmd, now)
        else:
            queue = self.queues.get(cmd.qid)
            if queue is None:
                if cmd.qid in self.streams.streams:
                    self._stream_command(cmd, now)
                elif kind is DeleteQueue and cmd.qid in self.replicas.followers:
                    self.replicas.deleted(cmd.qid)  # a member of the deleted queue's group
                    self.outbox.add(Reply(cmd.req))
                else:
                    self._missing_queue(cmd)
                return
            if kind is Consume or kind is Get:
                self.holder_queues.setdefault(cmd.holder, set()).add(cmd.qid)
            if kind is Consume:
                self.stats.event("consumer_added", vhost=queue.spec.vhost, queue=queue.spec.name,
                                 consumer_tag=cmd.tag, timeout_ms=cmd.timeout_ms)
            elif kind is Cancel:
                self.stats.event("consumer_cancelled", vhost=queue.spec.vhost,
                                 queue=queue.spec.name)
            self._apply(queue, cmd, now)

    def _stream_command(self, cmd, now: float) -> None:
        kind = type(cmd)
        spec = self.streams.streams[cmd.qid].spec
        if kind is Consume:
            self.holder_queues.setdefault(cmd.holder, set()).add(cmd.qid)
            self.stats.event("consumer_added", vhost=spec.vhost, queue=spec.name,
                             consumer_tag=cmd.tag, timeout_ms=cmd.timeout_ms)
        elif kind is Cancel:
            self.stats.event("consumer_cancelled", vhost=spec.vhost, queue=spec.name)
        self.streams.apply(cmd.qid, cmd, now)
        if cmd.qid not in self.streams.streams:  # deleted
            self.persister.delete_queue(cmd.qid)
            self.stats.event("queue_deleted", vhost=spec.vhost, queue=spec.name)

    def reprice(self) -> None:
        """After a turn: tell the gateways what publishing into each queue that had
        a backlog costs now that its consumers (or a purge, or its deletion) took
        some of it."""
        for qid in list(self.costs):
            self._price(qid, self.queues.get(qid))

    def _price(self, qid: int, queue: Queue | None) -> None:
        cost = 1
        if queue is not None and queue.consumers and all(
                consumer.prefetch and not consumer.no_ack for consumer in queue.consumers.values()):
            cost = min(MAX_PUBLISH_COST, 1 + queue.ready_count // BACKLOG_STEP)
        if cost != self.costs.get(qid, 1):
            if cost > 1:
                self.costs[qid] = cost
            else:
                del self.costs[qid]
            self.outbox.add(PublishCost(qid, cost))

    def _missing_queue(self, cmd) -> None:
        # The queue went away (deleted, or auto-deleted) after the gateway sent this.
        req = getattr(cmd, "req", None)
        if req is None:
            return
        if type(cmd) is Get:
            self.outbox.add(GetReply(req, cmd.qid, refused=Refusal.NO_QUEUE))
        else:
            self.outbox.add(Reply(req, Refusal.NO_QUEUE))

    def _effects(self, effects: list) -> bool:
        """Carry out a queue's effects; False if it refused a publish."""
        persister = self.persister
        accepted = True
        for effect in effects:
            kind = type(effect)
            if kind is Deliver:
                self.outbox.add(effect)
            elif kind is Persist:
                persister.persist(effect.qid, effect.messages, effect.rich)
            elif kind is Remove:
                persister.remove(effect.qid, effect.seqs)
            elif kind is Delivered:
                persister.mark_delivered(effect.qid, effect.seq, effect.rich, effect.in_order)
            elif kind is Refused:
                accepted = False
            elif kind is CountsChanged:
                persister.update_counts(effect.qid, effect.seq, effect.delivery_count,
                                        effect.acquired)
            elif kind is Destroyed:
                queue = self.queues.pop(effect.qid, None)
                persister.delete_queue(effect.qid)
                self.timers.cancel(effect.qid)
                if self.replicas.leaders:
                    self.replicas.deleted(effect.qid)
                if queue is not None:
                    self.stats.event("queue_deleted", vhost=queue.spec.vhost, queue=queue.spec.name)
            else:
                if kind is ConsumerTimedOut:
                    queue = self.queues.get(effect.qid)
                    if queue is not None:
                        self.stats.event("consumer_timed_out", vhost=queue.spec.vhost,
                                         queue=queue.spec.name, messages=len(effect.seqs),
                                         timeout_ms=effect.timeout_ms)
                self.outbox.add(effect)
        return accepted


def _queue_figures(queue: Queue) -> list[int]:
    c = queue.counters
    return [queue.qid, queue.ready_count, queue.unacked_count, len(queue.consumers),
            queue.ram_bytes, c.published, c.delivered, c.redelivered, c.acked, c.rejected,
            c.expired, c.dead_lettered]


def _has_timers(queue: Queue) -> bool:
    return queue.may_expire or queue.expires_after is not None or bool(queue.lock_heap)
