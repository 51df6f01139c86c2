"""Group commit for one shard: the stores' side (groupcommit.py holds the confirms).

The shard's loop turn hands every durable write of the turn to the persister;
`commit()` then appends each touched store's writes to its journal (one
synchronous write), and only afterwards does the shard send the confirms of
that turn. The next commit starts as soon as this one is done, so a lone
message waits for no timer while a flood shares syncs (docs/architecture.md,
group commit). Now and then a commit also checkpoints: the stores write what
their journals hold to LMDB, and only then do the messages written leave RAM
(a delivery reads them back from LMDB).

A shard normally has one store (DATA/shard-K); after a restart with fewer
shards it also adopts the stores of shards that no longer exist, so every
durable queue is found again and stays in the store it was written to.
"""

from __future__ import annotations

import logging
import time

from warren.storage.journal import SHRINK_BELOW
from warren.storage.shardstore import (
    Position,
    ShardStore,
    StoredMessage,
    StoredQueue,
    StoreFull,
    WriteBatch,
)

from . import records as r
from .message import Message
from .model import Queue
from .queue import ram_size
from .streams import Streams, stream_path

log = logging.getLogger("warren.shard")

# A replicated queue's journal records (shards/replicas.py), plain tuples led by
# their kind: (PUT, seq, content, rich), (DELETE, seqs), (COUNTS, seq,
# delivery_count, acquired), (DELIVERED, seq, rich), (DELIVERED_UPTO, seq).
PUT, DELETE, COUNTS, DELIVERED, DELIVERED_UPTO = range(5)

RETRY_AFTER = 1.0  # seconds before writes a full disk (or map) refused are tried again
# A checkpoint is due this long after the first commit it would apply, or once the
# journals hold this much (it bounds the RAM of messages waiting for it), or with
# a queue created or deleted (other processes read queue records from LMDB).
CHECKPOINT_AFTER = 0.5
CHECKPOINT_BYTES = 16 << 20


class PendingCommit:
    """The writes of one commit, on their way to the stores and stream logs."""

    __slots__ = ("batches", "written", "ok", "sizes", "refused", "error", "checkpoint",
                 "checkpointed", "checkpoint_refused", "appended", "full", "stream_points")

    def __init__(self, batches: dict, written: list, ok: bool = True,
                 checkpoint: list | None = None, stream_points: list | None = None):
        self.batches = batches
        self.stream_points = stream_points or []  # (qid, SyncPoint) of streams appended to
        self.written = written  # (qid, message) whose content leaves RAM once checkpointed
        self.ok = ok
        self.sizes: list[int] = []  # records per store append (one sync each)
        self.refused: dict[ShardStore, WriteBatch] = {}  # batches a full store refused
        self.error: Exception | None = None  # what broke it otherwise, for the shard's thread
        self.checkpoint = checkpoint or []  # the stores to checkpoint after the appends
        self.checkpointed = False
        self.checkpoint_refused = False
        self.appended = 0  # journal bytes
        self.full: str | None = None  # what a full store refused, for the shard's log


class Persister:
    def __init__(self, stores: dict[int, ShardStore], home: int):
        self.stores = stores
        self.home = stores[home]  # where new queues go
        self._store_of: dict[int, ShardStore] = {}  # qid -> its store
        # this commit's write batches by store, empty until something is written
        self.open_batches: dict[ShardStore, WriteBatch] = {}
        self._batch_of: dict[int, WriteBatch] = {}  # qid -> its store's batch, this commit
        self._written: list[tuple[int, Message]] = []  # this turn's, to drop from RAM
        self._journaled: list[tuple[int, Message]] = []  # to drop at the next checkpoint
        self._journal_bytes = 0  # in the journals since the last checkpoint
        self.checkpoint_at: float | None = None  # when the next checkpoint is due
        self._checkpoint_now = False  # a queue was created or deleted
        self.retry_at: float | None = None  # writes were refused for space: try again then
        self.refusals = 0  # commits refused in a row: the log says the first, and the end
        # Some stored message's content is not in RAM (recovered, or evicted at a
        # checkpoint): deliveries may need it read back (fill). Never cleared.
        self.content_out = False
        # Stream queues: segment logs beside the stores, synced by the same commits.
        self.streams = Streams()
        # Replicated queues (shards/replicas.py): their recovered rows by qid, and the
        # qids led here, whose writes of a turn also become the turn's log entry.
        self.replicas: dict[int, tuple[StoredQueue, Position]] = {}
        self.replicated: set[int] = set()
        self.entries: dict[int, list] = {}

    # -- recovery --------------------------------------------------------------

    def recover(self, now: float) -> list[Queue]:
        """Rebuild every stored queue's index from its store, in sequence order.
        Only tracked queues (TTL, length in bytes, priorities) and messages with an
        expiration of their own need their properties read back. A store whose
        disk was too full to apply its journal at opening (`unapplied`) is read
        with the journal's commits on top, their messages' content kept in RAM
        until a checkpoint takes them, as at any checkpoint. A replicated queue's
        rows are no queue here: they wait in `replicas` for the shard to be told
        its role (shards/replicas.py)."""
        queues = []
        for store in self.stores.values():
            pending = None if store.unapplied.is_empty() else store.unapplied
            stored_queues = store.queues()
            positions = store.positions()
            if pending is not None:
                for qid in pending.queue_deletes:
                    stored_queues.pop(qid, None)
                stored_queues.update(pending.queue_puts)
                self.checkpoint_at = now  # the checkpoint the opening could not make
                self._checkpoint_now = True
            for qid, stored in stored_queues.items():
                self._store_of[qid] = store
                if stored.spec.queue_type == "stream":
                    self.streams.open(r.CreateQueue(0, qid, stored.spec, stored.arguments),
                                      stream_path(store.path, qid))
                elif qid in positions:
                    self.replicas[qid] = (stored, positions[qid])
                else:
                    queues.append(self._recover_queue(store, qid, stored, pending, now))
        return queues

    def _recover_queue(self, store: ShardStore, qid: int, stored: StoredQueue,
                       pending: WriteBatch | None, now: float, journaled: bool = True) -> Queue:
        """One queue from its rows (with `pending` on top). `journaled`: the content
        only `pending` holds is in the journal, and leaves RAM at its checkpoint."""
        queue = Queue(r.CreateQueue(0, qid, stored.spec, stored.arguments))
        found = store.recover(qid) if pending is None else store.recover_over(qid, pending)
        for seq, delivered, delivery_count, acquired, rich, *kept in found:
            if kept:  # (content,): in the journal only
                content = kept[0]
                msg = queue.recovered_message(
                    seq, delivered, content[2] if queue.tracked or rich else None,
                    len(content[3]), now, delivery_count, acquired)
                msg.content = content
                queue.ram_bytes += ram_size(content)
                if journaled:
                    self._journaled.append((qid, msg))
                queue.enqueue_recovered(msg)
                continue
            self.content_out = True
            if queue.tracked or rich:
                content = store.read(qid, seq)
                msg = queue.recovered_message(seq, delivered, content.properties,
                                              len(content.body), now, delivery_count,
                                              acquired)
            else:  # of the queue's build, as every message in it
                msg = queue.recovered_message(seq, delivered, None, 0, now)
            queue.enqueue_recovered(msg)
        return queue

    def promote(self, qid: int, stored: StoredQueue, now: float) -> Queue:
        """A replica's queue, now led here, from its rows (no commit in flight): the
        store's, with this turn's on top. Content not yet in the store stays in RAM
        until the message is settled."""
        store = self._store_of.get(qid, self.home)
        pending = WriteBatch()
        pending.merge(store.unapplied)
        if store in self.open_batches:
            pending.merge(self.open_batches[store])
        return self._recover_queue(store, qid, stored, pending, now, journaled=False)

    # -- this turn's writes ----------------------------------------------------

    def _batch(self, qid: int) -> WriteBatch:
        batch = self._batch_of.get(qid)
        if batch is None:
            store = self._store_of.get(qid, self.home)
            batch = self.open_batches.get(store)
            if batch is None:
                batch = self.open_batches[store] = WriteBatch()
            self._batch_of[qid] = batch
        return batch

    def create_queue(self, queue: Queue) -> None:
        self._store_of[queue.qid] = self.home
        self._batch(queue.qid).put_queue(queue.qid, StoredQueue(queue.spec, queue.arguments))
        self._checkpoint_now = True

    def create_stream(self, cmd: r.CreateQueue) -> None:
        self._store_of[cmd.qid] = self.home
        self._batch(cmd.qid).put_queue(cmd.qid, StoredQueue(cmd.spec, cmd.arguments))
        self._checkpoint_now = True
        self.streams.open(cmd, stream_path(self.home.path, cmd.qid))

    def delete_queue(self, qid: int) -> None:
        if qid in self._store_of:
            self._batch(qid).delete_queue(qid)
            del self._store_of[qid]
            self._batch_of.pop(qid, None)
            self._checkpoint_now = True

    def persist(self, qid: int, messages: list[Message], rich: bool = False) -> None:
        batch = self._batch(qid)
        for msg in messages:
            if msg.content is None:  # settled in the same step (a no-ack consumer took it)
                continue
            batch.put_message(qid, msg.seq, msg.content)
            if rich:
                batch.mark_rich(qid, msg.seq)
            self._written.append((qid, msg))
        if self.replicated and qid in self.replicated:
            self._entry(qid).extend([(PUT, msg.seq, msg.content, rich) for msg in messages
                                     if msg.content is not None])

    def append(self, qid: int, publish: r.Publish) -> None:
        """A publish into a stream. Its store's batch opens (empty), so that the
        shard, which asks only whether a batch is open, sees commit work."""
        self._batch(qid)
        self.streams.publish(qid, publish)

    def remove(self, qid: int, seqs: list[int]) -> None:
        batch = self._batch(qid)
        for seq in seqs:
            batch.delete_message(qid, seq)
        if self.replicated and qid in self.replicated:
            self._entry(qid).append((DELETE, list(seqs)))

    def update_counts(self, qid: int, seq: int, delivery_count: int, acquired: int) -> None:
        self._batch(qid).update_counts(qid, seq, delivery_count, acquired)
        if self.replicated and qid in self.replicated:
            self._entry(qid).append((COUNTS, seq, delivery_count, acquired))

    def mark_delivered(self, qid: int, seq: int, rich: bool = False,
                       in_order: bool = False) -> None:
        if in_order and not rich:  # the queue's one number, not a mark per message
            self._batch(qid).delivered_upto(qid, seq)
            if self.replicated and qid in self.replicated:
                self._entry(qid).append((DELIVERED_UPTO, seq))
        else:
            self._batch(qid).mark_delivered(qid, seq, rich)
            if self.replicated and qid in self.replicated:
                self._entry(qid).append((DELIVERED, seq, rich))

    # -- replicated queues (shards/replicas.py) ----------------------------------

    def _entry(self, qid: int) -> list:
        records = self.entries.get(qid)
        if records is None:
            records = self.entries[qid] = []
        return records

    def apply(self, qid: int, records) -> None:
        """Write a replica's records (an entry, or a snapshot's chunk) to its rows."""
        batch = self._batch(qid)
        for record in records:
            kind = record[0]
            if kind == PUT:
                batch.put_message(qid, record[1], tuple(record[2]))
                if record[3]:
                    batch.mark_rich(qid, record[1])
            elif kind == DELETE:
                for seq in record[1]:
                    batch.delete_message(qid, seq)
            elif kind == COUNTS:
                batch.update_counts(qid, record[1], record[2], record[3])
            elif kind == DELIVERED_UPTO:
                batch.delivered_upto(qid, record[1])
            else:
                batch.mark_delivered(qid, record[1], record[2])

    def create_replica(self, cmd: r.CreateQueue, position: Position) -> None:
        """A replica's queue record and its log's position, its rows to come."""
        self._store_of[cmd.qid] = self.home
        batch = self._batch(cmd.qid)
        batch.put_queue(cmd.qid, StoredQueue(cmd.spec, cmd.arguments))
        batch.set_position(cmd.qid, position)
        self._checkpoint_now = True

    def clear_replica(self, qid: int, stored: StoredQueue) -> None:
        """Drop a replica's rows, keeping its record; its log is empty until set."""
        batch = self._batch(qid)
        batch.delete_queue(qid)
        batch.put_queue(qid, stored)
        batch.set_position(qid, Position([], 0))
        self._checkpoint_now = True

    def set_position(self, qid: int, position: Position) -> None:
        self._batch(qid).set_position(qid, position)

    def store_of(self, qid: int) -> ShardStore:
        return self._store_of.get(qid, self.home)

    def has_writes(self, now: float | None = None) -> bool:
        """Writes to commit, or a checkpoint due (at `now`, if given)."""
        # Asked twice a loop turn: with no batch open, no generator is made.
        return bool(self.open_batches and any(not batch.is_empty()
                                              for batch in self.open_batches.values())) \
            or bool(self.streams.dirty) or (now is not None and self._checkpoint_due(now))

    def _checkpoint_due(self, now: float) -> bool:
        return self.checkpoint_at is not None and (
            now >= self.checkpoint_at or self._journal_bytes >= CHECKPOINT_BYTES)

    def writes_due(self, now: float) -> bool:
        """Writes to commit now: none before the retry time after a refusal. (The
        shard asks first whether any batch is open or a checkpoint set: every turn
        of a transient load, without this call.)"""
        return self.has_writes(now) and (self.retry_at is None or now >= self.retry_at)

    def begin_commit(self) -> "PendingCommit":
        """Take this turn's writes out of the persister, to be committed (possibly in
        another thread) while the next turn's writes gather. Before the retry time
        after a refusal, nothing is taken and the commit fails at once (its
        publishes are nacked) without touching the disk."""
        now = time.monotonic()
        if self.retry_at is not None and now < self.retry_at:
            return PendingCommit({}, [], ok=False)
        checkpoint = self._checkpoint_now or self._checkpoint_due(now) \
            or self.retry_at is not None  # a checkpoint refused: it comes first now
        points, flushed = self.streams.sync_points() if self.streams.dirty else ([], True)
        pending = PendingCommit({store: batch for store, batch in self.open_batches.items()
                                 if not batch.is_empty()}, self._written, ok=flushed,
                                checkpoint=list(self.stores.values()) if checkpoint else None,
                                stream_points=points)
        self.open_batches = {}
        self._batch_of = {}
        self._written = []
        self._checkpoint_now = False
        return pending

    @staticmethod
    def run_commit(pending: "PendingCommit") -> None:
        """One journal append (one sync) per store, the checkpoint if asked, then
        one sync per stream appended to. Touches only `pending`, the stores and the
        streams' sync points, so it may run in the committer thread."""
        Persister._run_stores(pending)
        for _qid, point, records in pending.stream_points:
            try:
                point.run()
            except FileNotFoundError:  # the stream was deleted meanwhile: nothing to keep
                continue
            except OSError as error:
                pending.full = f"a stream log's sync failed ({error}): nacking its publishes"
                pending.ok = False
                continue
            pending.sizes.append(records)

    @staticmethod
    def _run_stores(pending: "PendingCommit") -> None:
        for store, batch in pending.batches.items():
            try:
                pending.appended += store.append(batch)
            except StoreFull as error:
                pending.full = (f"{store} refused a commit ({error}): nacking its publishes, "
                                "keeping its writes to try again")
                pending.ok = False
                pending.refused[store] = batch
                continue
            except Exception as error:  # raised again in the shard's thread (it restarts)
                pending.ok = False
                pending.error = error
                return
            pending.sizes.append(len(batch))
        try:
            for store in pending.checkpoint:
                # With what its journal refused: on a full disk the journal cannot
                # take the acks and purges that would make the checkpoint fit.
                refused = pending.refused.get(store)
                if refused is None:
                    store.checkpoint()
                else:
                    store.checkpoint(refused)
                    del pending.refused[store]
        except StoreFull as error:
            # What the journals hold is durable, but LMDB cannot take it: nack until a
            # checkpoint succeeds, so the journals cannot run far ahead of LMDB.
            pending.full = (f"{store} refused a checkpoint ({error}): nacking publishes "
                            "until it succeeds")
            pending.ok = False
            pending.checkpoint_refused = True
            return
        except Exception as error:
            pending.ok = False
            pending.error = error
            return
        pending.checkpointed = bool(pending.checkpoint)
        if pending.checkpointed and not pending.ok:  # LMDB took what the journals refused
            pending.ok, pending.full = True, None

    def finish_commit(self, pending: "PendingCommit", evict) -> bool:
        """After run_commit, in the shard's thread: once checkpointed, evict each
        written message's content from RAM. False if a store refused (full): the
        commit's confirms must then be nacks, and writes the journal did not take
        are kept, ahead of those gathered since, to be tried again (and the
        messages kept in RAM) until there is room."""
        if pending.error is not None:
            raise pending.error
        if pending.stream_points:
            self.streams.synced(pending.stream_points, pending.ok)
        if pending.full is not None:  # once, not every second while the disk is full
            if not self.refusals:
                log.error("%s (tried again every %.0f s, said again once it succeeds)",
                          pending.full, RETRY_AFTER)
            self.refusals += 1
        elif pending.ok and self.refusals:
            log.warning("the stores take writes again, after %d refused commits",
                        self.refusals)
            self.refusals = 0
        if pending.appended:
            self._journal_bytes += pending.appended
            if self.checkpoint_at is None:
                self.checkpoint_at = time.monotonic() + CHECKPOINT_AFTER
        if not pending.refused:
            self._journaled += pending.written
        if pending.checkpointed:
            # A cycle that may have grown a journal is followed by one more checkpoint,
            # empty once a flood has passed: that one shrinks the journal back.
            grown = self._journal_bytes >= SHRINK_BELOW
            self._journal_bytes = 0
            self.checkpoint_at = time.monotonic() + CHECKPOINT_AFTER if grown else None
            for qid, msg in self._journaled:
                if msg.content is not None:  # else settled since: already out of RAM
                    evict(qid, msg)
                    self.content_out = True
            self._journaled = []
        if pending.ok:
            self.retry_at = None
        elif pending.refused or pending.checkpoint_refused:
            for store, batch in pending.refused.items():
                later = self.open_batches.get(store)
                if later is not None:
                    batch.merge(later)
                self.open_batches[store] = batch
            self._batch_of = {}
            if pending.refused:
                self._written[:0] = pending.written
            self.retry_at = time.monotonic() + RETRY_AFTER
        return pending.ok

    def commit(self, evict) -> "PendingCommit":
        """Commit this turn's writes now, in this thread; `.ok` says if it is durable."""
        pending = self.begin_commit()
        self.run_commit(pending)
        self.finish_commit(pending, evict)
        return pending

    # -- reading content back --------------------------------------------------

    def fill(self, events: list) -> None:
        """Read back the content of stored messages that go out in these events."""
        wanted = []  # a loop, not a comprehension: this runs every turn
        for e in events:
            kind = type(e)
            if (kind is r.Deliver or kind is r.GetReply or kind is r.DeadLettered) \
                    and e.body is None:
                wanted.append(e)
        if not wanted:
            return
        by_store: dict[ShardStore, list] = {}
        for event in wanted:
            by_store.setdefault(self._store_of.get(event.qid, self.home), []).append(event)
        for store, group in by_store.items():
            contents = store.read_many([(e.qid, e.seq) for e in group])
            for event, stored in zip(group, contents):
                if stored is None:  # cannot happen unless the store was altered
                    stored = StoredMessage("", "", b"", b"")
                event.exchange = stored.exchange
                event.routing_key = stored.routing_key
                event.properties = stored.properties
                event.body = stored.body

    def drop_mapped_pages(self) -> None:
        for store in self.stores.values():
            store.drop_mapped_pages()

    def close(self) -> None:
        self.streams.close()
        for store in self.stores.values():
            store.close()

