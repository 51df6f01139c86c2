"""The broker in-process with no process, no socket and no event loop: the
session tests' harness.

A Gateway whose one shard link is an InlineShard: the shard's pure core
(shards.shard.Shard, its Persister on a store in the test's data directory)
run in this thread, its events handed to the gateway's dispatcher as a link
hands them over. Each Client is a sans-IO session.connection.Connection whose
output is a Wire (the bytes it wrote, whether it closed) and whose clock is the
broker's ManualClock: callbacks and timers run when the test steps the clock,
and time moves only when the test waits for something (run, next_frame) or
says so (advance). Client speaks tests/support/rawclient.py's Conversation
(send_method, next_method, handshake, open_channel, ...), so a protocol test
reads the same here as over TCP.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import time
import traceback

from warren.gateway.amqp import methods as m
from warren.gateway.amqp import spec
from warren.gateway.amqp.frames import FrameReader
from warren.gateway.config import Config
from warren.gateway.io.process import Gateway
from warren.gateway.session.connection import Connection
from warren.gateway.session.lifecycle import CLOSE_OK_TIMEOUT, OPEN
from warren.shards import records as r
from warren.shards.persister import Persister
from warren.shards.shard import Shard
from warren.shards.stats import StatsLog
from warren.storage import recovery
from warren.storage.metastore import MetaStore
from warren.storage.shardstore import ShardStore

from .rawclient import Conversation

# How long a wait (run, next_frame) may move the clock on for what it waits for:
# the real harness's deadline, which only a wedge would reach.
TIMEOUT = 10.0


class Handle:
    """A callback the clock will run (asyncio's Handle and TimerHandle in one)."""

    __slots__ = ("when", "callback", "args", "cancelled")

    def __init__(self, when: float, callback, args: tuple):
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: "Handle") -> bool:
        return self.when < other.when


class ManualClock:
    """What the session asks of a loop (call_soon, call_later, time), run by the
    test. Its time is time.monotonic() plus however far the tests moved clocks on
    (all of them: the process's log throttle outlives a broker, and must never see
    the time go back), so the shard's clock (monotonic) and this one agree."""

    _ahead = 0.0  # shared by every clock of the process

    def __init__(self, on_error):
        self._soon: list[Handle] = []
        self._later: list[Handle] = []  # a heap by when
        self._order = itertools.count()
        self._on_error = on_error  # (text) -> None: an exception a callback raised

    def time(self) -> float:
        return time.monotonic() + self._ahead

    def call_soon(self, callback, *args) -> Handle:
        handle = Handle(0.0, callback, args)
        self._soon.append(handle)
        return handle

    def call_later(self, delay: float, callback, *args) -> Handle:
        handle = Handle(self.time() + delay, callback, args)
        heapq.heappush(self._later, handle)
        return handle

    def next_timer(self) -> float | None:
        """When the first timer not cancelled is due, if there is one."""
        while self._later and self._later[0].cancelled:
            heapq.heappop(self._later)
        return self._later[0].when if self._later else None

    def ready(self) -> bool:
        """Whether a callback or a timer would run now."""
        when = self.next_timer()
        return bool(self._soon) or (when is not None and when <= self.time())

    def step(self) -> bool:
        """One turn: the timers due now, then the callbacks asked for so far (not
        those they ask for). False if there was nothing to run."""
        now = self.time()
        ready = []
        while self._later and (self._later[0].cancelled or self._later[0].when <= now):
            handle = heapq.heappop(self._later)
            if not handle.cancelled:
                ready.append(handle)
        ready += self._soon
        self._soon = []
        for handle in ready:
            if not handle.cancelled:
                try:
                    handle.callback(*handle.args)
                except Exception as error:  # as a loop's exception handler is told
                    self._on_error("".join(traceback.format_exception(error)))
        return bool(ready)

    def move_to(self, when: float) -> None:
        """Move the time on to `when` (never back)."""
        ManualClock._ahead += max(0.0, when - self.time())

    def advance(self, seconds: float) -> None:
        ManualClock._ahead += seconds


class Events:
    """An InlineShard's events waiting to be taken, as a link's event ring (only
    what Gateway.take_shard_events asks of one)."""

    def awake(self) -> None:
        pass  # nothing rings: the link is polled, or the clock runs its doorbell


class InlineShard:
    """A shard link (what the gateway and the session call on io/shardlink.ShardLink)
    over the shard's pure core in this thread. Records gather in a turn and go at
    its end (flush); the core runs them as the shard process's turn does and commits
    at once, and its events wait (as in the event ring) until the gateway polls or
    the clock runs the doorbell. Credit is not counted: no connection is held for it."""

    def __init__(self, data_dir: str, clock: ManualClock, on_events):
        self.index = 0
        self.clock = clock
        self._on_events = on_events  # (link, events) -> None: the gateway's dispatcher
        stores = {0: ShardStore(os.path.join(data_dir, "shard-0"), 1 << 30)}
        self.stats = StatsLog(os.path.join(data_dir, "logs"), 0, 60.0)
        self.core = Shard(0, Persister(stores, 0), self.stats)
        self.alive = True
        self.lazy_acks = 0  # acks are never held back here (ShardLink's SETTLE_DELAY)
        self.flush_scheduled = False
        self.costs: dict = {}  # qid -> what a publish into it spends, where above 1
        self.events = Events()
        self._batch: list = []
        self._inbox: list = []  # events the core emitted, not handed over yet
        self._doorbell: Handle | None = None
        self._timer: Handle | None = None
        self._dispatching = False
        self._next_req = 0
        self._waiters: dict = {}

    # -- commands in -------------------------------------------------------------

    def request(self, make, callback) -> None:
        if not self.alive:
            callback(r.Reply(0, r.Refusal.SHARD_DOWN))
            return
        self._next_req += 1
        self._waiters[self._next_req] = callback
        self.send(make(self._next_req))

    def send(self, record, feeder=None, lazy: bool = False) -> None:
        if not self.alive:
            return
        self._batch.append(record)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.clock.call_soon(self.flush)

    def flush(self) -> None:
        """The turn's records to the core, which runs them now."""
        self.flush_scheduled = False
        if self.alive and self._batch:
            batch, self._batch = self._batch, []
            self._turn(batch)

    def forget(self, conn) -> None:
        pass  # no credit is kept per connection

    # -- the core's turn -----------------------------------------------------------

    def _turn(self, batch: list) -> None:
        """What shards/main.py's loop does with one gateway's records: run them,
        reprice backlogs, run due timers, commit (here, at once) and check the
        resources; the events then wait for the gateway."""
        core, now = self.core, self.clock.time()
        core.outbox.origin = 0
        core.run_all(batch, now)
        core.behind.clear()
        if core.costs:
            core.reprice()
        self._ring(now)

    def _tick(self) -> None:
        """A timer of the core's (message TTL, x-expires, consumer timeouts, a store
        checkpoint) is due."""
        self._timer = None
        if self.alive:
            now = self.clock.time()
            self.core.run_timers(now)
            self._ring(now)

    def _ring(self, now: float) -> None:
        core = self.core
        (events,) = core.take_events()
        if core.has_commit_work(now):
            (confirms,) = core.outbox.route(core.commit_now(now))
            events += confirms
        if core.check_resources(0, core.stored_ok):  # no memory limit here: disk alone
            events += core.take_events()[0]  # the alarm it raised or cleared
        next_timer = core.timers.next_deadline() if core.timers.heap else None
        if self._timer is not None and (next_timer is None or next_timer != self._timer.when):
            self._timer.cancel()
            self._timer = None
        if next_timer is not None and self._timer is None:
            self._timer = self.clock.call_later(max(0.0, next_timer - now), self._tick)
        if events:
            self._inbox += events
            if self._doorbell is None:
                self._doorbell = self.clock.call_soon(self._rang)

    # -- events out ----------------------------------------------------------------

    def _rang(self) -> None:
        self._doorbell = None
        self.take_answers()

    def take_answers(self) -> None:
        if not self._dispatching:
            while self.poll():
                pass

    def poll(self) -> bool:
        """Hand over the events waiting, if any (ShardLink.poll)."""
        if not self.alive or self._dispatching or not self._inbox:
            return False
        events, self._inbox = self._inbox, []
        self._dispatching = True
        try:
            self._dispatch(events)
        finally:
            self._dispatching = False
        return True

    def _dispatch(self, events: list) -> None:
        """In the shard's order, as ShardLink._dispatch: replies to their requests,
        the rest to the gateway."""
        plain = []
        for event in events:
            kind = type(event)
            if kind is r.PublishCost:
                if event.cost > 1:
                    self.costs[event.qid] = event.cost
                else:
                    self.costs.pop(event.qid, None)
            elif kind is r.Reply or kind is r.GetReply or kind is r.QueueInfoReply:
                if plain:
                    self._on_events(self, plain)
                    plain = []
                callback = self._waiters.pop(event.req, None)
                if callback is not None:
                    callback(event)
            elif kind is not r.Progress:
                plain.append(event)
        if plain:
            self._on_events(self, plain)

    def busy(self) -> bool:
        """Records not run yet, or events or answers not handed over."""
        return bool(self._batch or self._inbox or self._waiters)

    def stop(self) -> None:
        """Commit what is left and close the store, as a stopping shard does."""
        if not self.alive:
            return
        self.alive = False
        if self._timer is not None:
            self._timer.cancel()
        core = self.core
        core.commit_now()
        core.persister.close()
        self.stats.close()


class Wire:
    """A connection's output (session.connection.Output): what it wrote, and
    whether it closed. Closing tells the connection it is lost on the next clock
    turn, as a socket transport does."""

    def __init__(self, conn: Connection, clock: ManualClock, peer: tuple):
        self.conn = conn
        self.clock = clock
        self.peer = peer
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.paused = False
        self.writes_after_close = 0

    def write(self, data) -> None:
        if self.closed:
            self.writes_after_close += 1
            return
        self.written += data

    def writelines(self, parts) -> None:
        for part in parts:
            self.write(part)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.clock.call_soon(self.conn.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default=None):
        return {"peername": self.peer, "sockname": ("127.0.0.1", 5672)}.get(name, default)


class InlineBroker:
    """A Gateway over an InlineShard, its clock, and a record of what should never
    happen: an exception a callback raised, an ERROR logged (the broker's safety
    nets turn a bug into a logged 541 close)."""

    def __init__(self, data_dir: str):
        self.errors: list[str] = []
        self.current = "setup"  # what ran when an error came, for its report
        self._errors_before = 0
        self._clients: list[Client] = []
        self.clock = clock = ManualClock(self._clock_error)
        os.makedirs(data_dir, exist_ok=True)  # the caller's to create, as node/root.py does
        self.gateway = gateway = Gateway(Config(
            data_dir=str(data_dir), shards=1, disk_free_limit=0, stats_interval=60.0,
            store_map_size=1 << 30, memory_limit=0))
        # What Gateway.start does, with the shard inline and the clock for a loop.
        gateway._loop = clock
        ready = recovery.prepare(gateway.data_dir, 1, False, False)
        meta = gateway.catalogue.meta = MetaStore(os.path.join(gateway.data_dir, "meta"))
        gateway.access.meta = meta
        gateway._load_definitions(ready.rebuilt)
        self.shard = InlineShard(gateway.data_dir, clock, gateway._on_events)
        gateway.shards.links.append(self.shard)
        gateway._redeclare_queues(self.shard)

    def _clock_error(self, text: str) -> None:
        self.errors.append(f"during {self.current}: {text}")

    def _log_error(self, record: logging.LogRecord) -> None:
        # Not the errors a client made, which RabbitMQ logs at error level too: a
        # connection's lines without a traceback and not about a 541.
        if (record.name == "warren.connection" and not record.exc_info
                and getattr(record, "reply_code", None) != spec.INTERNAL_ERROR):
            return
        text = f"during {self.current}: logged {record.getMessage()}"
        if record.exc_info:
            text += "\n" + "".join(traceback.format_exception(*record.exc_info))
        self.errors.append(text)

    # -- stepping --------------------------------------------------------------------

    def run(self, condition, timeout: float = TIMEOUT) -> bool:
        """Step the clock until `condition()` holds (True), or nothing is left to
        run before `timeout` seconds from now (False). With nothing to run now,
        the time moves on to the next timer, as it would while waiting."""
        deadline = self.clock.time() + timeout
        while not condition():
            if self.clock.step():
                continue
            when = self.clock.next_timer()
            if when is None or when > deadline:
                return bool(condition())
            self.clock.move_to(when)
        return True

    def advance(self, seconds: float) -> None:
        """Move the clock on: timers due by then (close-ok timeouts, the login
        throttle's delays) run now, and what they ask for."""
        self.clock.advance(seconds)
        while self.clock.step():
            pass

    def quiet(self, connections=None) -> bool:
        """No shard record or answer in flight, and none of `connections` (all by
        default) has a channel waiting for a shard or output to flush."""
        conns = self.gateway.registry.connections if connections is None else connections
        return not self.clock.ready() and not self.shard.busy() and not any(
            conn._flush_scheduled or any(ch._waiting and not ch.closed
                                         for ch in conn.channels.values())
            for conn in conns)

    def settle(self, timeout: float = TIMEOUT) -> None:
        """Step until the broker is quiet."""
        assert self.run(self.quiet, timeout), f"the broker did not settle within {timeout}s"

    # -- clients and tests -----------------------------------------------------------

    def client(self, peer: tuple | None = None) -> "Client":
        """A new client connection, hung up by end_test."""
        client = Client(self, peer)
        self._clients.append(client)
        return client

    def begin_test(self, name: str) -> None:
        self.current = name
        self._errors_before = len(self.errors)

    def end_test(self) -> list[str]:
        """Hang up the test's clients; the errors recorded since begin_test."""
        clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        return self.errors[self._errors_before:]

    def stop(self) -> None:
        # What is due within a second runs, as in a broker that goes on a moment:
        # the log throttle's count of what it held back, which its next user expects.
        self.run(lambda: False, 1.0)
        self.gateway.stopping = True
        self.gateway.alarms.stop()
        self.shard.stop()
        self.gateway.catalogue.meta.close()


@contextlib.contextmanager
def inline_broker(data_dir, quiet: bool = False):
    """An InlineBroker over `data_dir`, stopped at the end of the block. `quiet`
    silences the broker's logs below ERROR (a fuzzer's refused logins by the thousand)."""
    logger = logging.getLogger("warren")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    broker = InlineBroker(str(data_dir))
    recorder = logging.Handler(logging.ERROR)
    recorder.emit = broker._log_error
    logger.addHandler(recorder)
    try:
        yield broker
    finally:
        logger.removeHandler(recorder)
        broker.stop()
        logger.setLevel(level)


_peers = itertools.count(1)


class Client(Conversation):
    """A Conversation (tests/support/rawclient.py) with an InlineBroker: a real
    Connection over a Wire."""

    def __init__(self, broker: InlineBroker, peer: tuple | None = None):
        self.broker = broker
        self.conn = Connection(broker.gateway)
        # A loopback address of its own: the broker throttles refused logins per address.
        n = next(_peers)
        peer = peer or (f"127.1.{n >> 8 & 255}.{n & 255}", 40000 + n % 20000)
        self.wire = Wire(self.conn, broker.clock, peer)
        self.reader = FrameReader(1 << 30)
        self._seen = 0
        self._frame = None
        self.conn.start(self.wire, broker.clock, peer, ("127.0.0.1", 5672))

    # -- input to the broker ---------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Hand bytes to the connection as its socket would, in a loop turn of their
        own: what was due already runs first, then they are read into the room it
        offers (Connection.receive). Input that arrives while the broker holds
        reading waits in its reader until it reads on."""
        if not self.wire.closed:
            self.broker.clock.step()
            self.conn.receive(data)

    # -- output of the broker ----------------------------------------------------------

    def _frame_ready(self) -> bool:
        written = self.wire.written
        if len(written) > self._seen:
            self.reader.receive_data(bytes(written[self._seen:]))
            self._seen = len(written)
        frame = self.reader.next_frame()
        if frame is not None:
            self._frame = frame
            return True
        if self.wire.closed:  # and everything it wrote is read
            self._frame = None
            return True
        return False

    def next_frame(self, timeout: float | None = None):
        """The next frame, or None once the broker closed the connection."""
        timeout = timeout or TIMEOUT
        if not self.broker.run(self._frame_ready, timeout):
            raise TimeoutError(f"no frame from the broker within {timeout}s")
        return self._frame

    def pending(self) -> list:
        """Once the broker has settled (nothing in flight): the frames it wrote that
        were not read yet. For asserting that nothing came."""
        self.broker.settle()
        taken = []
        while self._frame_ready() and self._frame is not None:
            taken.append(self._frame)
        return taken

    def expect_connection_close(self, code: int) -> m.ConnectionClose:
        """The broker's connection.close with `code`; answered with close-ok, after
        which the broker hangs up. Returns the close for its text."""
        close = self.expect(0, m.ConnectionClose)
        assert close.reply_code == code, close
        self.answer_close()
        return close

    def answer_close(self) -> None:
        """Answer the broker's connection.close; it must hang up (at once, or once
        its close-ok timeout has passed where it can no longer read frames)."""
        self.send_method(0, m.ConnectionCloseOk())
        self.broker.settle()
        if not self.wire.closed:
            self.broker.advance(CLOSE_OK_TIMEOUT)
        assert self.next_frame(timeout=1.0) is None

    def close(self) -> None:
        """Close the connection (politely if it is open), hang up as a client closing
        its socket, and let the broker clean up."""
        if self.conn.state == OPEN and not self.wire.closed:
            self.send_method(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
            while (got := self.next_method()) is not None and got != (0, m.ConnectionCloseOk()):
                pass  # what the broker sent before its close-ok
        if not self.wire.closed:
            self.broker.clock.step()
            self.wire.close()
        self.broker.run(lambda: self.conn not in self.broker.gateway.registry.connections)
