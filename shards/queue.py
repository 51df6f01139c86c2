"""A queue as a pure state machine.

`Queue.apply(command, now)` takes one ring record (shards.records) and returns
the effects as plain data: records for the gateway (Deliver, Reply, ...) and
storage effects for the shard's shell. No I/O, no clock reads: time only
arrives as `now`. The shard process is the thin shell that feeds commands in and
carries effects out.

Message life cycle: ready -> checked out (held by a consumer, or by a channel
after basic.get) -> settled. A returned (requeued) message goes back to its
original position: messages leave the ready deque in sequence order, so every
checked-out message is older than every message still in the deque, and a
small heap of returned messages, served first, restores the original order.
"""

from __future__ import annotations

import heapq
from collections import deque

from . import records as r


class Message:
    """A message in a queue. `content` is (exchange, routing key, raw properties,
    body). A stored message (persistent, in a durable queue) keeps only its index
    in RAM once committed: its content becomes None and the shard reads it back
    from storage when it delivers it. Four slots, because a backlog of millions
    is mostly these objects."""

    __slots__ = ("seq", "content", "stored", "redelivered")

    def __init__(self, seq: int, content: tuple | None, stored: bool = False,
                 redelivered: bool = False):
        self.seq = seq
        self.content = content
        self.stored = stored
        self.redelivered = redelivered

    def evict(self) -> None:
        """Drop the content from RAM: storage has it."""
        self.content = None

    def __lt__(self, other: "Message") -> bool:  # heap order = enqueue order
        return self.seq < other.seq


NO_CONTENT = (None, None, None, None)  # to be read back from storage by the shard


class Consumer:
    __slots__ = ("holder", "channel", "tag", "no_ack", "exclusive", "prefetch", "credit",
                 "priority")

    def __init__(self, c: r.Consume):
        self.holder = c.holder
        self.channel = c.channel
        self.tag = c.tag
        self.no_ack = c.no_ack
        self.exclusive = c.exclusive
        self.prefetch = c.prefetch
        self.credit = c.credit
        self.priority = c.priority


class Persist:
    """Storage effect: write these messages of a durable queue."""

    __slots__ = ("qid", "messages")

    def __init__(self, qid: int, messages: list[Message]):
        self.qid = qid
        self.messages = messages


class Remove:
    """Storage effect: delete these sequence numbers of a durable queue."""

    __slots__ = ("qid", "seqs")

    def __init__(self, qid: int, seqs: list[int]):
        self.qid = qid
        self.seqs = seqs


class Delivered:
    """Storage effect: a stored message went out for the first time, so after a
    crash it must come back marked redelivered."""

    __slots__ = ("qid", "seq")

    def __init__(self, qid: int, seq: int):
        self.qid = qid
        self.seq = seq


class Destroyed:
    """The queue no longer exists; the shell forgets it (and its stored messages)."""

    __slots__ = ("qid",)

    def __init__(self, qid: int):
        self.qid = qid


class QueueCounters:
    """Running totals for the shard's statistics log."""

    __slots__ = ("published", "published_bytes", "delivered", "redelivered", "acked",
                 "rejected", "requeued")

    def __init__(self):
        self.published = self.published_bytes = self.delivered = self.redelivered = 0
        self.acked = self.rejected = self.requeued = 0


def describe(vhost: str, name: str) -> str:
    """How RabbitMQ names a queue in error texts."""
    return f"queue '{name}' in vhost '{vhost}'"


class Queue:
    def __init__(self, c: r.CreateQueue):
        self.qid = c.qid
        self.vhost = c.vhost
        self.name = c.name
        self.durable = c.durable
        self.exclusive = c.exclusive
        self.auto_delete = c.auto_delete
        self.arguments = c.arguments
        # Exclusive queues die with their connection, so they are never stored.
        self.stored = c.durable and not c.exclusive
        self.next_seq = 1
        self.ready: deque[Message] = deque()
        self.returned: list[Message] = []  # heap of requeued messages, by seq
        self.holdings: dict[int, dict[int, Message]] = {}  # holder -> seq -> message
        self.consumers: dict[int, Consumer] = {}
        # Round-robin order per consumer priority; `priorities` lists the keys,
        # highest first, kept sorted as consumers come and go.
        self.rotations: dict[int, deque[int]] = {}
        self.priorities: list[int] = []
        self.had_consumer = False
        self.deleted = False
        self.counters = QueueCounters()
        self.ram_bytes = 0  # bodies held in RAM (transient, or stored but not yet committed)

    # -- queries ---------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returned)

    @property
    def unacked_count(self) -> int:
        return sum(len(h) for h in self.holdings.values())


    def _describe(self) -> str:
        return describe(self.vhost, self.name)

    # -- commands --------------------------------------------------------------

    def apply(self, cmd, now: float) -> list:
        """Apply one command; return its effects. Unknown commands are ignored."""
        handler = self._handlers.get(type(cmd))
        if handler is None or self.deleted:
            return []
        effects: list = []
        handler(self, cmd, effects)
        return effects

    def _publish(self, cmd: r.Publish, effects: list) -> None:
        msg = Message(self.next_seq, (cmd.exchange, cmd.routing_key, cmd.properties, cmd.body),
                      self.stored and cmd.persistent)
        self.next_seq += 1
        self.ready.append(msg)
        self.counters.published += 1
        self.counters.published_bytes += len(cmd.body)
        self.ram_bytes += len(cmd.body)
        if msg.stored:
            effects.append(Persist(self.qid, [msg]))
        self._dispatch(effects)

    def enqueue_recovered(self, msg: Message) -> None:
        """Recovery from storage: append a stored message in sequence order."""
        self.ready.append(msg)
        self.next_seq = max(self.next_seq, msg.seq + 1)

    def _status(self, cmd: r.QueueStatus, effects: list) -> None:
        effects.append(r.Reply(cmd.req, message_count=self.ready_count,
                               consumer_count=len(self.consumers)))

    def _consume(self, cmd: r.Consume, effects: list) -> None:
        if self.consumers and (cmd.exclusive or any(c.exclusive for c in self.consumers.values())):
            effects.append(r.Reply(cmd.req, 403,
                                   f"ACCESS_REFUSED - {self._describe()} in exclusive use"))
            return
        consumer = Consumer(cmd)
        self.consumers[cmd.holder] = consumer
        if consumer.priority not in self.rotations:
            self.rotations[consumer.priority] = deque()
            self.priorities = sorted(self.rotations, reverse=True)
        self.rotations[consumer.priority].append(cmd.holder)
        self.had_consumer = True
        effects.append(r.Reply(cmd.req, consumer_count=len(self.consumers)))
        self._dispatch(effects)

    def _cancel(self, cmd: r.Cancel, effects: list) -> None:
        self._remove_consumer(cmd.holder)
        effects.append(r.Reply(cmd.req))
        self._maybe_auto_delete(effects)

    def _get(self, cmd: r.Get, effects: list) -> None:
        msg = self._take_next()
        if msg is None:
            effects.append(r.GetReply(cmd.req, self.qid))
            return
        redelivered = msg.redelivered
        self._hand_out(msg, None if cmd.no_ack else cmd.holder, effects)
        effects.append(r.GetReply(cmd.req, self.qid, msg.seq, redelivered,
                                  *(msg.content or NO_CONTENT), self.ready_count))

    def _settle(self, cmd: r.Settle, effects: list) -> None:
        held = self.holdings.get(cmd.holder)
        if not held:
            return
        for seq in cmd.seqs:
            msg = held.pop(seq, None)
            if msg is None:
                continue
            if cmd.outcome == r.SETTLE_REQUEUE:
                self._return(msg)
            else:
                if cmd.outcome == r.SETTLE_ACK:
                    self.counters.acked += 1
                else:
                    self.counters.rejected += 1
                self._settled(msg, effects)
        if not held:
            del self.holdings[cmd.holder]
        self._dispatch(effects)

    def _grant(self, cmd: r.Grant, effects: list) -> None:
        consumer = self.consumers.get(cmd.holder)
        if consumer is not None:
            consumer.credit = cmd.credit if cmd.reset else consumer.credit + cmd.credit
            self._dispatch(effects)

    def _release(self, cmd: r.ReleaseHolders, effects: list) -> None:
        for holder in cmd.holders:
            self._remove_consumer(holder)
            for msg in self.holdings.pop(holder, {}).values():
                self._return(msg)
        self._maybe_auto_delete(effects)
        self._dispatch(effects)

    def _purge(self, cmd: r.PurgeQueue, effects: list) -> None:
        count = self._drop_ready(effects)
        effects.append(r.Reply(cmd.req, message_count=count))

    def _delete(self, cmd: r.DeleteQueue, effects: list) -> None:
        if cmd.if_unused and self.consumers:
            effects.append(r.Reply(cmd.req, 406, f"PRECONDITION_FAILED - {self._describe()} in use"))
            return
        if cmd.if_empty and self.ready_count:
            effects.append(r.Reply(cmd.req, 406,
                                   f"PRECONDITION_FAILED - {self._describe()} not empty"))
            return
        count = self.ready_count
        self._destroy(effects)
        effects.append(r.Reply(cmd.req, message_count=count))

    _handlers = {
        r.Publish: _publish,
        r.QueueStatus: _status,
        r.Consume: _consume,
        r.Cancel: _cancel,
        r.Get: _get,
        r.Settle: _settle,
        r.Grant: _grant,
        r.ReleaseHolders: _release,
        r.PurgeQueue: _purge,
        r.DeleteQueue: _delete,
    }

    # -- internals -------------------------------------------------------------

    def _take_next(self) -> Message | None:
        if self.returned:
            return heapq.heappop(self.returned)
        if self.ready:
            return self.ready.popleft()
        return None

    def _hand_out(self, msg: Message, holder: int | None, effects: list) -> None:
        """A message goes out: to `holder` until settled, or settled now (no-ack)."""
        self.counters.delivered += 1
        if msg.redelivered:
            self.counters.redelivered += 1
        if holder is None:
            self._settled(msg, effects)
            return
        self.holdings.setdefault(holder, {})[msg.seq] = msg
        if msg.stored and not msg.redelivered:
            effects.append(Delivered(self.qid, msg.seq))

    def _return(self, msg: Message) -> None:
        self.counters.requeued += 1
        msg.redelivered = True
        heapq.heappush(self.returned, msg)

    def _settled(self, msg: Message, effects: list) -> None:
        if msg.content is not None:
            self.ram_bytes -= len(msg.content[3])
        if msg.stored:
            effects.append(Remove(self.qid, [msg.seq]))

    def evict(self, msg: Message) -> None:
        """Storage has committed this message: keep only its index in RAM."""
        if msg.content is not None:
            self.ram_bytes -= len(msg.content[3])
            msg.evict()

    def _drop_ready(self, effects: list) -> int:
        dropped = list(self.returned) + list(self.ready)
        self.returned.clear()
        self.ready.clear()
        self.ram_bytes -= sum(len(m.content[3]) for m in dropped if m.content is not None)
        stored = [m.seq for m in dropped if m.stored]
        if stored:
            effects.append(Remove(self.qid, stored))
        return len(dropped)

    def _remove_consumer(self, holder: int) -> None:
        consumer = self.consumers.pop(holder, None)
        if consumer is None:
            return
        rotation = self.rotations[consumer.priority]
        rotation.remove(holder)
        if not rotation:
            del self.rotations[consumer.priority]
            self.priorities = sorted(self.rotations, reverse=True)

    def _maybe_auto_delete(self, effects: list) -> None:
        if self.auto_delete and self.had_consumer and not self.consumers:
            self._destroy(effects)
            effects.append(r.QueueDeleted(self.qid))

    def _destroy(self, effects: list) -> None:
        for holder in list(self.consumers):
            effects.append(r.ConsumerCancelled(holder, self.qid))
        self.consumers.clear()
        self.rotations.clear()
        self.priorities = []
        self.holdings.clear()
        self.ready.clear()
        self.returned.clear()
        self.ram_bytes = 0
        self.deleted = True
        effects.append(Destroyed(self.qid))

    def _can_take(self, c: Consumer) -> bool:
        if c.credit <= 0:
            return False
        if c.no_ack or c.prefetch == 0:
            return True
        held = self.holdings.get(c.holder)
        return held is None or len(held) < c.prefetch

    def _next_consumer(self) -> Consumer | None:
        """Highest priority first; round-robin among consumers of equal priority."""
        for priority in self.priorities:
            rotation = self.rotations[priority]
            for _ in range(len(rotation)):
                consumer = self.consumers[rotation[0]]
                rotation.rotate(-1)
                if self._can_take(consumer):
                    return consumer
        return None

    def _dispatch(self, effects: list) -> None:
        while self.ready or self.returned:
            consumer = self._next_consumer()
            if consumer is None:
                return
            msg = self._take_next()
            consumer.credit -= 1
            effects.append(r.Deliver(consumer.holder, self.qid, msg.seq, msg.redelivered,
                                     *(msg.content or NO_CONTENT)))
            self._hand_out(msg, None if consumer.no_ack else consumer.holder, effects)
