"""A shard's events, each to where it belongs: deliveries, confirms and
rejections, cancellations and timeouts to their channels (by holder id), alarms
to the gateway's Alarms, a queue the shard deleted to the catalogue, a
dead-lettered message republished through the catalogue's routes."""

from __future__ import annotations

import datetime
import logging
from typing import Callable

from warren.shards import records as r

from ..amqp.properties import PropertiesError, decode_properties, encode_properties
from ..broker import deadletter
from ..broker.catalogue import Catalogue
from .alarms import Alarms
from .shardlink import ShardLink

log = logging.getLogger("warren")


class Dispatcher:
    """`holders` is the registry's holder id -> channel table (read, never
    replaced); `publish` sends a message to the shards of its queues
    (Gateway.publish)."""

    def __init__(self, holders: dict, catalogue: Catalogue, alarms: Alarms,
                 publish: Callable):
        self.holders = holders
        self.catalogue = catalogue
        self.alarms = alarms
        self.publish = publish
        # in a cluster's root: (link, event) for a replicated queue's frames and
        # in-sync proposals (cluster/quorum.py)
        self.replication: Callable | None = None

    def dispatch(self, link: ShardLink, events: list) -> None:
        """Hand a shard's events to their channels. A failure while handling one
        closes the connection it concerns (or is logged, if it concerns none) and
        the rest of the batch goes on: one client's trouble never stops a shard's
        events for everyone."""
        holders = self.holders
        for event in events:
            kind = type(event)
            channel = None
            try:
                if kind is r.Deliver:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.deliver(link, event)
                elif kind is r.Confirmed or kind is r.Rejected:
                    accepted = kind is r.Confirmed
                    channels, seqs = event.channels, event.seqs
                    start, count = 0, len(channels)
                    while start < count:  # a run of one channel's seqs at a time
                        channel_id = channels[start]
                        end = start + 1
                        while end < count and channels[end] == channel_id:
                            end += 1
                        channel = holders.get(channel_id)
                        if channel is not None:
                            try:
                                if accepted:
                                    channel.confirmed(seqs[start:end], link.index)
                                else:
                                    channel.rejected(seqs[start:end], link.index)
                            except Exception as error:
                                channel.conn.fail(error)
                        start = end
                    channel = None
                elif kind is r.ConsumerCancelled:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.consumer_cancelled_by_broker(event.holder)
                elif kind is r.Alarm:
                    self.alarms.set((link.index, event.resource), event.active)
                elif kind is r.QueueDeleted:
                    # (a shard of another node: its own node forgets the queue)
                    if link.index < self.catalogue.shard_count:
                        self.catalogue.queue_deleted_by_shard(link.index, event.qid)
                elif kind is r.DeadLettered:
                    self.dead_letter(event)
                elif kind is r.ConsumerTimedOut:
                    channel = holders.get(event.holder)
                    if channel is not None:
                        channel.consumer_timed_out(event)
                elif kind is r.ReplicaFrame or kind is r.InSyncProposal:
                    if self.replication is not None:
                        self.replication(link, event)
            except Exception as error:
                if channel is not None:
                    channel.conn.fail(error)
                else:
                    log.error("shard %d event %s failed", link.index, kind.__name__,
                              exc_info=error)

    def dead_letter(self, event: r.DeadLettered) -> None:
        """Republish a dead-lettered message to its queue's dead-letter exchange,
        with its x-death history; queues that would close a cycle are skipped.
        At most once, as in RabbitMQ: no confirm is waited for."""
        catalogue = self.catalogue
        meta = catalogue.queues_by_qid.get(event.qid)
        if meta is None:
            return
        vhost = catalogue.vhosts[meta.spec.vhost]
        exchange = vhost.exchanges.get(meta.effective.get("x-dead-letter-exchange"))
        if exchange is None:
            return  # RabbitMQ drops it too when the exchange is missing
        try:
            props = decode_properties(event.properties)
        except PropertiesError:
            return
        routing_key = meta.effective.get("x-dead-letter-routing-key", event.routing_key)
        deaths = deadletter.record_death(props, meta.spec.name, event.reason, event.exchange,
                                         event.routing_key,
                                         datetime.datetime.now(datetime.timezone.utc))
        targets = [q for q in catalogue.route(vhost, exchange, routing_key, lambda: props.headers)
                   if not deadletter.is_cycle(q.spec.name, deaths)]
        properties = encode_properties(props)
        self.publish(targets, exchange.name, routing_key, properties, event.body,
                     props.delivery_mode == 2, -1, props.priority or 0)

    def shard_lost(self, link: ShardLink, local: bool = True) -> None:
        """A shard died. Its transient queues died with it (durable ones come back
        from its store), its alarms are off, its consumers are cancelled and its
        unconfirmed publishes nacked. A shard of another node (not `local`) may
        only be out of reach: its node's lease says whether it died
        (cluster/node.py)."""
        if local:
            self.catalogue.forget_transient(link.index)
        self.alarms.clear_source(link.index)
        for channel in set(self.holders.values()):
            channel.shard_lost(link)
