"""A queue as a pure state machine.

`Queue.apply(command, now)` takes one ring record (shards.records) and returns the
effects as plain data: records for the gateway (Deliver, Reply, ...) and storage
effects for the shard (effects.py). No I/O, no clock reads: time only arrives as
`now`. The shard process is the thin shell that feeds commands in and carries effects
out. A queue holds messages (message.py) and consumers (consumers.py).

Message life cycle: ready -> checked out (held by a consumer, or by a channel after
basic.get) -> settled. A returned (requeued) message goes back to its original
position: messages leave the ready deque in sequence order, so every checked-out
message is older than every message still in the deque, and a small heap of returned
messages, served first, restores the original order.

A message leaves without being delivered when it expires (x-message-ttl or its own
expiration, noticed at the head of the queue), when x-max-length or x-max-length-bytes
drops it from the head, or when a consumer rejects it without requeueing; with
x-dead-letter-exchange it is then handed back to the gateway (DeadLettered) to be
republished there."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import build
from . import message as pure_message
from .consumers import Roster as PureRoster
from .effects import CountsChanged, Delivered, Destroyed, Persist, Refused, Remove
from .ready import PriorityReady as PurePriorityReady

# Records by name: a compiled module would look each up in `records` at every use.
from .records import (
    SETTLE_ACK,
    SETTLE_REQUEUE,
    SETTLE_RETURN,
    Cancel,
    ConfigureQueue,
    Consume,
    ConsumerCancelled,
    ConsumerTimedOut,
    CreateQueue,
    DeadLettered,
    DeleteQueue,
    Deliver,
    Get,
    GetReply,
    Grant,
    Publish,
    PurgeQueue,
    QueueDeleted,
    QueueStatus,
    Refusal,
    ReleaseHolders,
    Renew,
    Reply,
    Settle,
)

if TYPE_CHECKING:  # either build has the pure one's types
    from .consumers import Roster
    from .message import CONTENT_OVERHEAD, NO_CONTENT, Message, RichMessage, own_limits
    from .ready import PriorityReady
else:  # the compiled build works with its compiled siblings (the roster: _queue.pxd)
    Roster = build.twin(PureRoster, "warren.shards._consumers", "Roster")
    message = build.twin(pure_message, "warren.shards._message")
    Message, RichMessage, own_limits = message.Message, message.RichMessage, message.own_limits
    CONTENT_OVERHEAD, NO_CONTENT = message.CONTENT_OVERHEAD, message.NO_CONTENT
    PriorityReady = build.twin(PurePriorityReady, "warren.shards._ready", "PriorityReady")


def ram_size(content: tuple) -> int:
    """RAM held by a message's content (exchange, routing key, properties, body)."""
    return len(content[2]) + len(content[3]) + CONTENT_OVERHEAD


class QueueCounters:
    """Running totals for the shard's statistics log."""

    __slots__ = ("published", "published_bytes", "delivered", "redelivered", "acked",
                 "rejected", "requeued", "expired", "dead_lettered", "dropped", "timeouts")

    def __init__(self):
        self.published = self.published_bytes = self.delivered = self.redelivered = 0
        self.acked = self.rejected = self.requeued = 0
        self.expired = self.dead_lettered = self.dropped = self.timeouts = 0


class Queue:
    def __init__(self, c: CreateQueue):
        self.qid = c.qid
        self.spec = c.spec
        self.stored = c.spec.stored  # durable and not exclusive (dies with its connection)
        self.next_seq = 1
        self.returned: list[Any] = []  # heap of requeued messages (rich in a priority queue)
        self.holdings: dict[int, dict[int, Message]] = {}  # holder -> seq -> message
        self.roster = Roster()
        # The roster's, held here too for the per-message path and the shard's timers.
        self.consumers = self.roster.consumers
        self.locks = self.roster.locks
        self.lock_heap = self.roster.lock_heap
        self.had_consumer = self.deleted = False
        self.counters = QueueCounters()
        self.ram_bytes = 0  # content held in RAM (transient, or stored but not yet committed)
        self.ready_bytes = 0  # bodies of ready messages (tracked queues only)
        self.now = 0.0  # the time of the command being applied
        self.last_used: float | None = None  # for x-expires
        self.configure(c.arguments)
        self.ready: Any = PriorityReady() if self.max_priority is not None else deque()

    def configure(self, arguments: dict) -> None:
        """Take the queue's arguments (validated by the gateway)."""
        self.arguments = arguments
        ttl = arguments.get("x-message-ttl")
        expires = arguments.get("x-expires")
        self.message_ttl = ttl / 1000 if ttl is not None else None
        self.expires_after = expires / 1000 if expires is not None else None
        self.max_length = arguments.get("x-max-length")
        self.max_bytes = arguments.get("x-max-length-bytes")
        self.overflow = arguments.get("x-overflow", "drop-head")
        self.max_priority = arguments.get("x-max-priority")
        self.dead_letters = bool(arguments.get("x-dead-letter-exchange") is not None)
        self.quorum = arguments.get("x-queue-type") == "quorum"
        self.roster.single_active = arguments.get("x-single-active-consumer") is True
        # RabbitMQ 4 gives quorum queues a delivery limit of 20 by default; -1: none.
        limit = arguments.get("x-delivery-limit", 20 if self.quorum else -1)
        self.delivery_limit = limit if limit >= 0 else None
        # Tracked queues keep every message as a RichMessage.
        self.tracked = (self.message_ttl is not None or self.max_bytes is not None
                        or self.max_priority is not None or self.quorum)
        self.may_expire = self.message_ttl is not None
        # A publish may go straight to a waiting consumer (apply's short way).
        self.straight = not self.tracked and self.max_length is None

    # -- queries ---------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returned)

    @property
    def unacked_count(self) -> int:
        return sum(len(h) for h in self.holdings.values())

    def next_deadline(self) -> float | None:
        """When `tick` has work: the head message's expiry, or the moment an unused
        queue expires. None when there is nothing to wait for."""
        deadline = None
        if self.may_expire:
            msg = self._peek_next()
            deadline = getattr(msg, "expires", None)
        if self.expires_after is not None and not self.consumers and self.last_used is not None:
            unused = self.last_used + self.expires_after
            deadline = unused if deadline is None else min(deadline, unused)
        lock = self.roster.next_lock()
        if lock is not None:
            deadline = lock if deadline is None else min(deadline, lock)
        return deadline

    # -- commands --------------------------------------------------------------

    def apply(self, cmd, now: float) -> list:
        """Apply one command; return its effects. Unknown commands are ignored."""
        if type(cmd) is Publish and self.straight and self.consumers:
            deliver = self.publish_straight(cmd, now)
            if deliver is not None:
                return [deliver]
        handler = self._handlers.get(type(cmd))
        if handler is None or self.deleted:
            return []
        self.now = now
        if self.last_used is None or type(cmd) in _USES:
            self.last_used = now
        effects: list = []
        handler(self, cmd, effects)
        if self.may_expire and not self.deleted:
            self._expire(effects)
        return effects

    def tick(self, now: float) -> list:
        """Time passed: expire messages at the head, delete the queue if unused."""
        if self.deleted:
            return []
        self.now = now
        if self.last_used is None:
            self.last_used = now
        effects: list = []
        if self.may_expire:
            self._expire(effects)
        if self.lock_heap:
            self._time_out_locks(now, effects)
        if (self.expires_after is not None and not self.consumers
                and now >= self.last_used + self.expires_after):
            self._destroy(effects)
            effects.append(QueueDeleted(self.qid))
        return effects

    def _time_out_locks(self, now: float, effects: list) -> None:
        """Return the messages whose lock ended to the queue; their consumers enter
        timeout status until they settle them (or are cancelled)."""
        for holder, seqs in self.roster.due(now).items():
            held = self.holdings.get(holder, {})
            for seq in seqs:
                msg = held.pop(seq, None)
                if msg is not None:
                    self._return(msg, failed=False, effects=effects)
            if not held:
                self.holdings.pop(holder, None)
            consumer = self.consumers.get(holder)
            if consumer is not None:
                consumer.timed_out.update(seqs)
                self.counters.timeouts += 1
                effects.append(ConsumerTimedOut(holder, self.qid, seqs,
                                                int((consumer.timeout or 0) * 1000)))
        self._dispatch(effects)

    def _renew(self, cmd: Renew, effects: list) -> None:
        held = self.holdings.get(cmd.holder)
        if held:
            self.roster.renew(cmd.holder, cmd.seqs or list(held), self.now)

    def _publish(self, cmd: Publish, effects: list) -> None:
        size = len(cmd.body)
        content = (cmd.exchange, cmd.routing_key, cmd.properties, cmd.body)
        if self.overflow != "drop-head" and (
                (self.max_length is not None and self.ready_count >= self.max_length)
                or (self.max_bytes is not None and self.ready_bytes >= self.max_bytes)):
            effects.append(Refused(self.qid))
            self.counters.dropped += 1
            if self.overflow == "reject-publish-dlx":
                self._dead_letter(Message(0, content), "maxlen", effects)
            return
        msg = self._new_message(content, cmd.persistent, cmd.expiration, cmd.priority, size)
        self.ready.append(msg)
        if self.tracked:
            self.ready_bytes += size
        self.counters.published += 1
        self.counters.published_bytes += size
        self.ram_bytes += ram_size(content)
        if msg.stored:  # rich: it expires by itself in a queue that tracks none
            effects.append(Persist(self.qid, [msg], not self.tracked and type(msg) is RichMessage))
        self._dispatch(effects)
        if self.max_length is not None or self.max_bytes is not None:
            self._drop_over_limit(effects)

    def publish_straight(self, cmd: Publish, now: float) -> Deliver | None:
        """A transient message for a queue with nothing ready and a consumer that can
        take it goes out at once: what _publish, _dispatch and _hand_out would do,
        without the message passing through the ready deque (most of the per-message
        work at a steady rate). None when it must take the long way. Only for a
        queue that is `straight` and has consumers; its one effect is the Deliver,
        and it leaves the queue's timers as they were."""
        if (self.ready or self.returned or cmd.expiration >= 0
                or (self.stored and cmd.persistent)):
            return None
        consumer = self.roster.next_consumer(self.holdings)
        if consumer is None:
            return None
        self.now = now  # (its consumer's arrival set last_used)
        seq = self.next_seq
        self.next_seq = seq + 1
        counters = self.counters
        counters.published += 1
        counters.published_bytes += len(cmd.body)
        counters.delivered += 1
        consumer.credit -= 1
        if not consumer.no_ack:
            content = (cmd.exchange, cmd.routing_key, cmd.properties, cmd.body)
            self.holdings.setdefault(consumer.holder, {})[seq] = Message(seq, content)
            self.ram_bytes += ram_size(content)
        return Deliver(consumer.holder, self.qid, seq, False, cmd.exchange, cmd.routing_key,
                       cmd.properties, cmd.body)

    def _new_message(self, content: tuple, persistent: bool, expiration: int, priority: int,
                     size: int) -> Message:
        seq = self.next_seq
        self.next_seq += 1
        # A quorum queue keeps every message, as RabbitMQ's do (whatever the
        # delivery mode): its replicas hold what its publishers were confirmed.
        stored = self.stored and (persistent or self.quorum)
        if not self.tracked and expiration < 0:
            return Message(seq, content, stored)
        return self._rich_message(seq, content, stored, False, expiration, priority, size,
                                  self.now)

    def _rich_message(self, seq: int, content: tuple | None, stored: bool, redelivered: bool,
                      expiration: int, priority: int, size: int, now: float,
                      delivery_count: int = 0, acquired: int = 0) -> RichMessage:
        """Its expiry from the queue's TTL and its own `expiration` (ms, -1: none),
        whichever ends first, counted from `now`; its priority capped by the queue's."""
        ttl = self.message_ttl
        if expiration >= 0:
            ttl = expiration / 1000 if ttl is None else min(ttl, expiration / 1000)
            self.may_expire = True
        return RichMessage(seq, content, stored, redelivered,
                           None if ttl is None else now + ttl, size,
                           min(priority, self.max_priority) if self.max_priority else 0,
                           delivery_count, acquired)

    def enqueue_recovered(self, msg: Message) -> None:
        """Recovery from storage: append a stored message in sequence order."""
        self.ready.append(msg)
        self.next_seq = max(self.next_seq, msg.seq + 1)

    def recovered_message(self, seq: int, delivered: bool, properties: bytes | None,
                          size: int, now: float, delivery_count: int = 0,
                          acquired: int = 0) -> Message:
        """A stored message read back at recovery. Tracked queues need its
        properties and size; its time to live starts again at recovery."""
        if properties is None:
            return Message(seq, None, True, delivered)
        if self.tracked:
            self.ready_bytes += size
        expiration, priority = own_limits(properties)
        return self._rich_message(seq, None, True, delivered, expiration, priority, size, now,
                                  delivery_count, acquired)

    def _status(self, cmd: QueueStatus, effects: list) -> None:
        effects.append(Reply(cmd.req, message_count=self.ready_count,
                             consumer_count=len(self.consumers)))

    def _consume(self, cmd: Consume, effects: list) -> None:
        if self.roster.add(cmd) is None:
            effects.append(Reply(cmd.req, Refusal.EXCLUSIVE_USE))
            return
        self.had_consumer = True
        effects.append(Reply(cmd.req, consumer_count=len(self.consumers)))
        self._dispatch(effects)

    def _cancel(self, cmd: Cancel, effects: list) -> None:
        self.roster.remove(cmd.holder)
        effects.append(Reply(cmd.req))
        self._maybe_auto_delete(effects)

    def _get(self, cmd: Get, effects: list) -> None:
        msg = self._take_next(effects)
        if msg is None:
            effects.append(GetReply(cmd.req, self.qid))
            return
        # The reply takes the content first: a no-ack get settles the message at once.
        reply = GetReply(cmd.req, self.qid, msg.seq, msg.redelivered,
                         *(msg.content or NO_CONTENT), self.ready_count,
                         delivery_count=getattr(msg, "delivery_count", 0))
        self._hand_out(msg, None if cmd.no_ack else cmd.holder, effects)
        effects.append(reply)

    def _settle(self, cmd: Settle, effects: list) -> None:
        consumer = self.consumers.get(cmd.holder)
        if consumer is not None and consumer.timed_out:
            # settling its timed-out messages (already back in the queue) ends the
            # consumer's timeout status
            consumer.timed_out.difference_update(cmd.seqs)
        held = self.holdings.get(cmd.holder)
        if not held:
            self._dispatch(effects)
            return
        removed: list[int] = []  # stored messages settled: one Remove for them all
        locks = self.locks
        for seq in cmd.seqs:
            msg = held.pop(seq, None)
            if msg is None:
                continue
            if locks:
                locks.pop((cmd.holder, seq), None)
            if cmd.outcome == SETTLE_REQUEUE or cmd.outcome == SETTLE_RETURN:
                self._return(msg, cmd.outcome == SETTLE_REQUEUE, effects)
            elif cmd.outcome == SETTLE_ACK:
                self.counters.acked += 1
                self._settled(msg, effects, removed)
            else:
                self.counters.rejected += 1
                self._dead_letter(msg, "rejected", effects)
                self._settled(msg, effects, removed)
        if removed:
            effects.append(Remove(self.qid, removed))
        if not held:
            del self.holdings[cmd.holder]
        self._dispatch(effects)

    def _grant(self, cmd: Grant, effects: list) -> None:
        consumer = self.consumers.get(cmd.holder)
        if consumer is not None:
            consumer.credit = cmd.credit if cmd.reset else consumer.credit + cmd.credit
            self._dispatch(effects)

    def _release(self, cmd: ReleaseHolders, effects: list) -> None:
        for holder in cmd.holders:
            self.roster.remove(holder)
            for seq, msg in self.holdings.pop(holder, {}).items():
                self.locks.pop((holder, seq), None)
                self._return(msg, True, effects)  # the consumer was lost: a failed delivery
        self._maybe_auto_delete(effects)
        self._dispatch(effects)

    def _purge(self, cmd: PurgeQueue, effects: list) -> None:
        count = self._drop_ready(effects)
        effects.append(Reply(cmd.req, message_count=count))

    def _delete(self, cmd: DeleteQueue, effects: list) -> None:
        if cmd.if_unused and self.consumers:
            effects.append(Reply(cmd.req, Refusal.IN_USE))
            return
        if cmd.if_empty and self.ready_count:
            effects.append(Reply(cmd.req, Refusal.NOT_EMPTY))
            return
        count = self.ready_count
        # delete-ok goes out before the consumers' basic.cancel, as RabbitMQ sends them
        effects.append(Reply(cmd.req, message_count=count))
        self._destroy(effects)

    def _configure(self, cmd: ConfigureQueue, effects: list) -> None:
        self.configure(cmd.arguments)
        if self.max_length is not None or self.max_bytes is not None:
            self._drop_over_limit(effects)

    _handlers: dict[type, Callable[[Queue, Any, list], None]] = {
        ConfigureQueue: _configure,
        Renew: _renew,
        Publish: _publish,
        QueueStatus: _status,
        Consume: _consume,
        Cancel: _cancel,
        Get: _get,
        Settle: _settle,
        Grant: _grant,
        ReleaseHolders: _release,
        PurgeQueue: _purge,
        DeleteQueue: _delete,
    }

    # -- internals -------------------------------------------------------------

    def _peek_next(self) -> Message | None:
        returned, ready = self.returned, self.ready
        if returned and (not ready or self.max_priority is None
                         or returned[0].priority >= ready[0].priority):
            return returned[0]
        return ready[0] if ready else None

    def _pop_next(self) -> Message | None:
        """The next ready message: requeued ones first (they are older), or in a
        priority queue the oldest of the highest priority."""
        returned, ready = self.returned, self.ready
        if returned and (not ready or self.max_priority is None
                         or returned[0].priority >= ready[0].priority):
            msg = heapq.heappop(returned)
        elif ready:
            msg = ready.popleft()
        else:
            return None
        if self.tracked:
            self.ready_bytes -= getattr(msg, "size", 0)  # plain ones predate a policy
        return msg

    def _take_next(self, effects: list) -> Message | None:
        """The next message to hand out; expired ones met on the way are dropped.
        One published this very instant is still deliverable (x-message-ttl 0
        reaches a waiting consumer, as in RabbitMQ)."""
        while True:
            msg = self._pop_next()
            if msg is None or not self.may_expire:
                return msg
            expires = getattr(msg, "expires", None)
            if expires is None or expires >= self.now:
                return msg
            self._expired(msg, effects)

    def _expire(self, effects: list) -> None:
        """Drop the expired messages at the head."""
        now = self.now
        while (msg := self._peek_next()) is not None:
            expires = getattr(msg, "expires", None)
            if expires is None or expires > now:
                return
            self._pop_next()
            self._expired(msg, effects)

    def _expired(self, msg: Message, effects: list) -> None:
        self.counters.expired += 1
        self._dead_letter(msg, "expired", effects)
        self._settled(msg, effects)

    def _drop_over_limit(self, effects: list) -> None:
        """x-overflow drop-head: drop (or dead-letter) from the head until within limits."""
        while ((self.max_length is not None and self.ready_count > self.max_length)
               or (self.max_bytes is not None and self.ready_bytes > self.max_bytes)) and (
                msg := self._pop_next()) is not None:
            self.counters.dropped += 1
            self._dead_letter(msg, "maxlen", effects)
            self._settled(msg, effects)

    def _dead_letter(self, msg: Message, reason: str, effects: list) -> None:
        if self.dead_letters:
            self.counters.dead_lettered += 1
            effects.append(DeadLettered(self.qid, msg.seq, reason,
                                        *(msg.content or NO_CONTENT)))

    def _hand_out(self, msg: Message, holder: int | None, effects: list) -> None:
        """A message goes out: to `holder` until settled, or settled now (no-ack)."""
        self.counters.delivered += 1
        if msg.redelivered:
            self.counters.redelivered += 1
        if holder is None:
            self._settled(msg, effects)
            return
        self.holdings.setdefault(holder, {})[msg.seq] = msg
        if self.quorum:
            self.roster.lock(holder, msg.seq, self.now)
        if msg.stored and not msg.redelivered:
            effects.append(Delivered(self.qid, msg.seq,
                                     not self.tracked and type(msg) is RichMessage,
                                     type(self.ready) is not PriorityReady))

    def _return(self, msg: Message, failed: bool, effects: list) -> None:
        """Back to the queue. Quorum queues count it: every return in `acquired`, a
        failed one (reject, consumer lost) in `delivery_count`; past the delivery
        limit the message is dead-lettered or dropped instead."""
        self.counters.requeued += 1
        msg.redelivered = True
        if self.quorum and type(msg) is RichMessage:
            msg.acquired += 1
            if failed:
                msg.delivery_count += 1
            if self.delivery_limit is not None and msg.delivery_count > self.delivery_limit:
                self._dead_letter(msg, "delivery_limit", effects)
                self._settled(msg, effects)
                return
            if msg.stored:
                effects.append(CountsChanged(self.qid, msg.seq, msg.delivery_count,
                                             msg.acquired))
        if self.tracked:
            self.ready_bytes += getattr(msg, "size", 0)
        heapq.heappush(self.returned, msg)

    def _settled(self, msg: Message, effects: list, removed: list[int] | None = None) -> None:
        """The message is gone. Its content leaves RAM now, so a commit that wrote it
        meanwhile has nothing left to evict. A stored one is removed from storage (its
        seq goes to `removed` when the caller gathers them into one Remove)."""
        if msg.content is not None:
            self.ram_bytes -= ram_size(msg.content)
            msg.content = None
        if msg.stored:
            if removed is None:
                effects.append(Remove(self.qid, [msg.seq]))
            else:
                removed.append(msg.seq)

    def evict(self, msg: Message) -> None:
        """Storage has committed this message: keep only its index in RAM."""
        if msg.content is not None:
            self.ram_bytes -= ram_size(msg.content)
            msg.content = None  # the shard reads it back from storage to deliver it

    def _drop_ready(self, effects: list) -> int:
        dropped = list(self.returned) + list(self.ready)
        self.returned.clear()
        self.ready.clear()
        self.ready_bytes = 0
        for msg in dropped:
            if msg.content is not None:
                self.ram_bytes -= ram_size(msg.content)
                msg.content = None  # as in _settled: nothing left for a commit to evict
        stored = [m.seq for m in dropped if m.stored]
        if stored:
            effects.append(Remove(self.qid, stored))
        return len(dropped)

    def _maybe_auto_delete(self, effects: list) -> None:
        if self.spec.auto_delete and self.had_consumer and not self.consumers:
            self._destroy(effects)
            effects.append(QueueDeleted(self.qid))

    def _destroy(self, effects: list) -> None:
        for holder in list(self.consumers):
            effects.append(ConsumerCancelled(holder, self.qid))
        self.roster.clear()
        self.holdings.clear()
        self.ready.clear()
        self.returned.clear()
        self.ram_bytes = self.ready_bytes = 0
        self.deleted = True
        effects.append(Destroyed(self.qid))

    def _dispatch(self, effects: list) -> None:
        while self.ready or self.returned:
            consumer = self.roster.next_consumer(self.holdings)
            if consumer is None:
                return
            msg = self._take_next(effects)
            if msg is None:
                return
            consumer.credit -= 1
            effects.append(Deliver(consumer.holder, self.qid, msg.seq, msg.redelivered,
                                   *(msg.content or NO_CONTENT),
                                   getattr(msg, "delivery_count", 0)))
            self._hand_out(msg, None if consumer.no_ack else consumer.holder, effects)


# Commands that count as using a queue (x-expires counts from the last of them).
_USES = frozenset({QueueStatus, Consume, Cancel, Get, ReleaseHolders})
