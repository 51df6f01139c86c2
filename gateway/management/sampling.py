"""What the API shows that changes over time: the queues' figures, asked of the
shards (QueueInfo), and the rates and chart history sampled from the broker's
counters every SAMPLE_INTERVAL (a rate is the change between two samples)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from warren.shards import records as r

from .history import History, add_samples, kept_values
from .http import Request, bad_request
from .rates import SAMPLE_INTERVAL, Rates

log = logging.getLogger("warren.management")

COUNTED = ("published", "delivered", "redelivered", "acked")  # per queue, with rates
ASK_TIMEOUT = 2.0  # seconds a shard has to answer a QueueInfo


class Sampler:
    def __init__(self, gateway, connections: Callable[[], list]):
        self.gateway = gateway
        self.connections = connections  # every open connection of the broker, now
        self.rates = Rates(time.monotonic())
        self.history = History()  # what the charts show at once
        self.shard_fsyncs: dict[int, tuple[int, int]] = {}  # shard -> (fsyncs, messages)
        self.task: asyncio.Task | None = None  # keep_sampling, from listener.start

    async def queue_figures(self) -> dict[int, dict]:
        """Per qid: ready, unacked, consumers, bytes, counters, and their rates."""
        figures = await self._queue_info()
        now = time.monotonic()
        for qid, values in figures.items():
            values["rates"] = self.rates.rate(("queue", qid), now,
                                              {name: values[name] for name in COUNTED})
        return figures

    async def ask(self, link, qids: list[int]) -> r.QueueInfoReply | None:
        """A shard's QueueInfoReply for these queues (all of them when empty); None
        when the shard is down or does not answer within ASK_TIMEOUT."""
        future = asyncio.get_running_loop().create_future()
        link.request(lambda req: r.QueueInfo(req, qids),
                     lambda reply: future.done() or future.set_result(reply))
        try:
            reply = await asyncio.wait_for(future, ASK_TIMEOUT)
        except TimeoutError:
            return None
        return reply if type(reply) is r.QueueInfoReply else None

    async def _queue_info(self) -> dict[int, dict]:
        """Per qid, the shards' QueueInfo fields (a shard that is down or does not
        answer leaves its queues out)."""
        links = list(self.gateway.shards)
        replies = await asyncio.gather(*(self.ask(link, []) for link in links))
        figures: dict[int, dict] = {}
        for link, reply in zip(links, replies):
            if reply is None:
                continue
            self.shard_fsyncs[link.index] = (reply.fsyncs, reply.messages)
            for entry in reply.queues:
                figures[entry[0]] = self.figure(entry)
        return figures

    def figure(self, entry: list[int]) -> dict:
        """One row of a QueueInfoReply, by name (records.QUEUE_INFO_FIELDS)."""
        values = dict(zip(r.QUEUE_INFO_FIELDS, entry))
        tail = entry[len(r.QUEUE_INFO_FIELDS):]
        if tail:
            meta = self.gateway.catalogue.queues_by_qid.get(entry[0])
            if meta is not None and meta.spec.queue_type == "stream":  # its consumers' offsets
                values["stream_offsets"] = dict(zip(tail[::2], tail[1::2]))
            elif len(tail) >= 2:  # a replicated queue's leader: epoch, commit, members'
                values["replication"] = tail
        return values

    async def sample(self) -> None:
        """Take one sample of every counter a rate is shown for."""
        figures = await self._queue_info()
        counters: dict = {("queue", qid): {name: values[name] for name in COUNTED}
                          for qid, values in figures.items()}
        counters["totals"] = self.gateway.broker_totals()
        for info in (c.snapshot() for c in self.connections()):
            counters[("connection", info.name)] = _traffic(info)
        self.rates.sample(time.monotonic(), counters)
        now = time.time()
        if self.history.due(now, SAMPLE_INTERVAL):
            vhost_of = {meta.qid: name for name, vhost in self.gateway.catalogue.vhosts.items()
                        for meta in vhost.queues.values()}
            self.history.record(now, kept_values(figures, counters["totals"], vhost_of))

    async def keep_sampling(self) -> None:
        # Until cancelled (at exit), even when Python 3.11's wait_for swallows the
        # cancel because a shard answered at the same moment: asked once, it stops.
        task = asyncio.current_task()
        while not task.cancelling():
            try:
                await self.sample()
            except Exception:  # never stop sampling over one bad turn
                log.exception("sampling the broker's counters failed")
            await asyncio.sleep(SAMPLE_INTERVAL)

    def connection_rates(self, info) -> dict:
        return self.rates.rate(("connection", info.name), time.monotonic(), _traffic(info))

    def totals_rates(self) -> dict:
        return self.rates.rate("totals", time.monotonic(), self.gateway.broker_totals())

    def add_samples(self, request: Request, keys, lengths: dict, stats: dict,
                    stat_fields) -> None:
        """The history ?lengths_age=&lengths_incr=&msg_rates_age=&msg_rates_incr= ask for."""
        try:
            add_samples(request.query, self.history, keys, time.time(), lengths, stats,
                        stat_fields)
        except ValueError as error:
            raise bad_request(str(error)) from None


def _traffic(info) -> dict[str, int]:
    """A connection's byte counters that rates are shown for."""
    return {"recv_oct": info.recv_oct, "send_oct": info.send_oct}
