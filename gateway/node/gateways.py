"""The other gateway processes, seen from gateway 0: it starts them, restarts one
that dies, sends them the catalogue's changes and runs their declarations.

Every change to the catalogue goes to every other gateway, numbered; each
answers with the last number it applied. A declaration's -ok waits until all
have applied its changes (`request`: the channel parks as for a shard), so a
client that is told -ok finds the change on every gateway. A gateway that starts
gets the whole catalogue first; declarations wait for it only once it has applied
that (a process starting on a busy machine stalls nobody, and is not judged on
changes made before it ran), and it is handed clients only once it has every
change made before then too.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess

import msgspec

from warren.shards import records as r

from ..broker import changes
from ..broker.peermessages import (
    Admit,
    Admitted,
    Applied,
    Changes,
    ChannelCount,
    Client,
    CloseConnection,
    ConnectionClosed,
    Connections,
    Forward,
    ListConnections,
    LoginFailed,
    LoginTurn,
    LoginWait,
    Reply,
    ReplyConsumer,
    ReplyOutcome,
    Serving,
    ShardDown,
    ShardRings,
)
from ..io.children import spawn
from ..io.exitwatch import ExitWatch
from .controllink import ControlLink, Handover, ring_fds
from .forwarded import Mirror

log = logging.getLogger("warren")

STABLE = 10.0  # seconds a restarted gateway must stay up to count as recovered
ACCEPT_RETRY = 0.1  # seconds the root stops accepting when it is out of descriptors
LIST_TIMEOUT = 2.0  # seconds the management API waits for another gateway's connections
# Seconds a gateway may take to apply the catalogue's changes before it is taken for
# stuck and restarted: declarations everywhere wait for it meanwhile.
APPLY_TIMEOUT = 5.0
# Seconds a started gateway may take to apply the catalogue and accept connections
# before it is taken for stuck and restarted: only it is missing meanwhile.
START_TIMEOUT = 30.0


class FollowerSpec(msgspec.Struct, array_like=True):
    """What `python -m warren.gateway.node.worker` is started with (on its stdin)."""

    index: int
    config: dict
    control_fd: int  # its end of the control link's socket pair
    handover_fd: int  # its end of the Handover socket pair
    # By shard; None for a shard down when the gateway starts: its rings come in a
    # ShardRings once it runs again.
    rings: list[r.RingPair | None]


class RemoteConnection:
    """A connection of another gateway, as the management API lists and closes it."""

    def __init__(self, id: int, info, link: ControlLink):
        self.id = id
        self.name = info.name
        self.user = info.user
        self._info = info
        self._link = link

    def snapshot(self):
        return self._info

    def close_forced(self, reason: str) -> None:
        self._link.send(CloseConnection(self.id, reason))


class Asking:
    """Another gateway as a link for Channel._request: `make(req)` goes there and
    `answered` gets its answer, or None if that gateway is not running or goes."""

    def __init__(self, followers: "Followers", index: int):
        self._followers = followers
        self._index = index

    def request(self, make, answered) -> None:
        self._followers.ask(self._index, make, answered)


class Followers:
    def __init__(self, gateway, count: int):
        self.gateway = gateway
        self.count = count  # gateways, 1 to count (the root, 0, accepts no clients)
        self.serving: set[int] = set()  # gateways that have accepted connections
        self._all_serving = asyncio.Event()
        self.links: dict[int, ControlLink] = {}  # gateway index -> its live link
        self.handovers: dict[int, Handover] = {}  # gateway index -> its sockets and rings
        self._listeners: list[tuple[socket.socket, bool]] = []  # (AMQP listener, tls)
        self._open = False  # the broker has started: every gateway served once
        self._accepting = False
        self._starting: set[asyncio.Task] = set()  # gateways being started again
        self._next_gateway = 0  # the last one a client was handed to (round robin)
        # gateway index -> the last change it applied, once it has the whole catalogue
        # (declarations wait for these)
        self.applied: dict[int, int] = {}
        # gateway index -> the change it must have applied to be handed clients: the
        # last one made before declarations waited for it
        self._ready_at: dict[int, int] = {}
        self._said_serving: set[int] = set()  # it told it accepts connections
        self.seq = 0  # number of the last change sent
        self._pending: list = []
        self._flush_scheduled = False
        self._waiters: list[tuple[int, object]] = []  # (change number, answered)
        self.mirrors: dict[int, Mirror] = {}  # connection id -> its stand-in
        self.remote: dict[int, list[RemoteConnection]] = {}  # gateway index -> connections
        # connection id -> (user, vhost, channels) of the other gateways' connections,
        # for the vhost and user limits
        self.tally: dict[int, tuple[str, str, int]] = {}
        self._listing: dict[int, asyncio.Future] = {}  # gateway index -> its list, awaited
        self.totals: dict[int, dict] = {}  # gateway index -> its Totals, as last reported
        self._retired: dict[str, int] = {}  # the Totals of gateway processes gone
        self.processes: dict[int, subprocess.Popen] = {}
        self.failing: dict[int, int] = {}  # gateway index -> deaths in a row
        self._replacing: set[int] = set()  # stopped to be started again at once
        self._asked: dict[int, tuple[int, object]] = {}  # req -> (gateway index, answered)
        self._relayed: dict[tuple[int, int], int] = {}  # mandatory replies -> their gateway
        self._next_ask = 0
        self.stopping = False

    # -- changes ---------------------------------------------------------------

    def add(self, change) -> None:
        self._pending.append(change)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        self.seq += len(self._pending)
        message = Changes(self.seq, self._pending)
        self._pending = []
        for link in self.links.values():
            link.send(message)

    def broadcast(self, message) -> None:
        """A message for every gateway, ahead of the changes not sent yet."""
        for link in self.links.values():
            link.send(message)

    def caught_up(self) -> bool:
        return not self._pending and all(seq >= self.seq for seq in self.applied.values())

    def request(self, make, answered) -> None:
        """Call `answered(None)` once every live gateway applied the changes so far
        (a ShardLink's request interface, for Channel._request)."""
        self.flush()
        self._waiters.append((self.seq, answered))
        self._release()
        if self._waiters:
            # Judged later: the gateway processes waited for now, not their replacements.
            waited = {index: self.processes.get(index) for index in self.applied}
            asyncio.get_running_loop().call_later(APPLY_TIMEOUT, self._check_applied,
                                                  self.seq, waited)

    def _check_applied(self, seq: int, waited: dict[int, subprocess.Popen]) -> None:
        """Restart a gateway that has not applied change `seq` in APPLY_TIMEOUT,
        if it is still the process that was waited for."""
        for index, process in waited.items():
            if self.processes.get(index) is process and self.applied.get(index, seq) < seq \
                    and process.poll() is None:
                log.error("gateway %d has not applied the catalogue's changes in %.0f s; "
                          "restarting it", index, APPLY_TIMEOUT)
                process.kill()  # its exit releases the waiters and restarts it

    async def applied_everywhere(self) -> None:
        """Return once every live gateway has applied the changes made so far."""
        if not self.caught_up():
            done = asyncio.get_running_loop().create_future()
            self.request(None, lambda _: done.done() or done.set_result(None))
            await done

    def _release(self) -> None:
        low = min(self.applied.values(), default=self.seq)
        ready = [w for w in self._waiters if w[0] <= low]
        if ready:
            self._waiters = [w for w in self._waiters if w[0] > low]
            for _, answered in ready:
                answered(None)

    # -- messages from the other gateways ---------------------------------------

    def _message(self, index: int, message) -> None:
        kind = type(message)
        if kind is Applied:
            if index not in self.applied:  # it has the catalogue: waited for from now
                self._ready_at[index] = self.seq
            self.applied[index] = message.seq
            self._release()
            self._serve(index)
        elif kind is Serving:
            self._said_serving.add(index)
            self._serve(index)
        elif kind is Forward:
            mirror = self.mirrors.get(message.connection)
            if mirror is None:
                mirror = self.mirrors[message.connection] = Mirror(
                    self.gateway, message, self.links[index].send)
            mirror.run(message)
        elif kind is Admit:
            self._admit(index, message)
        elif kind is ChannelCount:
            counted = self.tally.get(message.connection)
            if counted is not None:
                self.tally[message.connection] = (*counted[:2], message.channels)
        elif kind is Reply:
            if message.gateway == 0:
                self.gateway.deliver_reply(message)
            elif not self.pass_reply(message) and message.origin:
                self.gateway.reply_outcome(ReplyOutcome(message.origin, message.ask, True))
        elif kind is ReplyOutcome:
            self._relayed.pop((message.origin, message.ask), None)
            self.gateway.reply_outcome(message)
        elif kind is Connections:
            link = self.links[index]
            self.remote[index] = [RemoteConnection(id, info, link)
                                  for id, info in zip(message.ids, message.infos)]
            self.totals[index] = message.totals
            listing = self._listing.pop(index, None)
            if listing is not None and not listing.done():
                listing.set_result(None)
        elif kind is ReplyConsumer:
            asked = self._asked.pop(message.req, None)
            if asked is not None:
                asked[1](message)
        elif kind is LoginTurn or kind is LoginFailed:
            self._throttle(index, message)
        elif kind is ConnectionClosed:
            self.tally.pop(message.connection, None)
            mirror = self.mirrors.pop(message.connection, None)
            if mirror is not None:
                mirror.close()

    def _serve(self, index: int) -> None:
        """Hand clients to a gateway that accepts connections once it has every
        change a client may have been told -ok for (some made while it started
        were answered without waiting for it)."""
        if index in self.serving or index not in self._said_serving \
                or self.applied.get(index, -1) < self._ready_at.get(index, 0):
            return
        self.serving.add(index)
        self._update_accepting()
        if len(self.serving) == self.count:
            self._all_serving.set()

    def _admit(self, index: int, ask: Admit) -> None:
        """Count a connection or channel of another gateway, unless a limit says no."""
        if ask.channels:  # its channels so far count; the new one if admitted
            self.tally[ask.connection] = (ask.user, ask.vhost, ask.channels - 1)
        refusal = self.gateway.limit_refusal(ask.user, ask.vhost, channel=ask.channels > 0)
        if refusal is None:
            self.tally[ask.connection] = (ask.user, ask.vhost, ask.channels)
        self.links[index].send(Admitted(ask.req, refusal or ""))

    def _throttle(self, index: int, ask) -> None:
        """The broker's login throttle, asked by another gateway: when a login from
        a throttled address may be checked, or how long to delay a refusal."""
        throttle = self.gateway.access.throttle
        if type(ask) is LoginTurn:
            wait = throttle.turn(ask.address)
        else:
            wait = throttle.failed(ask.address, ask.at_turn)
        self.links[index].send(LoginWait(ask.req, -1.0 if wait is None else wait,
                                         throttle.throttled(ask.address)))

    def at(self, index: int) -> Asking:
        return Asking(self, index)

    def ask(self, index: int, make, answered) -> None:
        """Send `make(req)` to gateway `index`; `answered(answer)` runs when it
        answers (with None at once if it is not running, or when it goes)."""
        link = self.links.get(index)
        if link is None:
            asyncio.get_running_loop().call_soon(answered, None)
            return
        self._next_ask += 1
        self._asked[self._next_ask] = (index, answered)
        link.send(make(self._next_ask))

    def pass_reply(self, reply: Reply) -> bool:
        """A direct reply to another gateway's channel: send it there (False if
        that gateway is not running). A mandatory one is noted until its outcome
        passes back, to be returned should that gateway go first."""
        link = self.links.get(reply.gateway)
        if link is None:
            return False
        link.send(reply)
        if reply.origin:
            self._relayed[(reply.origin, reply.ask)] = reply.gateway
        return True

    def pass_outcome(self, outcome: ReplyOutcome) -> None:
        link = self.links.get(r.gateway_of(outcome.origin))
        if link is not None:
            link.send(outcome)

    async def list_connections(self) -> None:
        """Have every other gateway report its connections now (`connections()`)."""
        loop = asyncio.get_running_loop()
        for index, link in self.links.items():
            if index not in self._listing:
                self._listing[index] = loop.create_future()
                link.send(ListConnections())
        waiting = list(self._listing.values())
        if waiting:
            await asyncio.wait(waiting, timeout=LIST_TIMEOUT)

    def add_totals(self, totals: dict[str, int]) -> dict[str, int]:
        """`totals` (gateway 0's) with every other gateway's, past ones included."""
        for counted in (*self.totals.values(), self._retired):
            for name, count in counted.items():
                totals[name] = totals.get(name, 0) + count
        return totals

    def connections(self) -> list[RemoteConnection]:
        """The other gateways' open connections, as each last reported them."""
        return [c for listed in self.remote.values() for c in listed]

    # -- processes ---------------------------------------------------------------

    async def start(self, timeout: float) -> bool:
        """Start the gateways; whether all of them accept connections within `timeout`."""
        for index in range(1, self.count + 1):
            await self._start(index)
        try:
            await asyncio.wait_for(self._all_serving.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _start(self, index: int) -> None:
        """Start gateway `index`'s process and its links. A start that fails (the
        root out of descriptors, say) raises with nothing of it left open."""
        loop = asyncio.get_running_loop()
        opened: list[socket.socket] = []  # closed again if the process does not start
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            opened += [ours, theirs]
            handover, handover_theirs = Handover.pair()
            opened += [handover, handover_theirs]
            # A shard waiting to be restarted has no rings (those it had are closed).
            rings = [link.rings_for(index) if link.alive else None
                     for link in self.gateway.shards.local()]
            spec = FollowerSpec(index, msgspec.to_builtins(self.gateway.config),
                                theirs.fileno(), handover_theirs.fileno(), rings)
            fds = {theirs.fileno(), handover_theirs.fileno()}
            for pair in rings:
                if pair is not None:
                    fds |= set(ring_fds(pair))
            process = spawn("warren.gateway.node.worker", msgspec.json.encode(spec), sorted(fds))
        except OSError:
            for sock in opened:
                sock.close()
            raise
        theirs.close()
        handover_theirs.close()
        self.processes[index] = process
        old = self.handovers.pop(index, None)
        if old is not None:
            old.close()
        self.handovers[index] = Handover(handover)  # before any wait: no shard news is missed
        _, link = await loop.connect_accepted_socket(
            lambda: ControlLink(lambda message: self._message(index, message),
                                lambda: self._lost(index, link)), sock=ours)
        self.links[index] = link
        if self.stopping:  # stop() closed the links before this one was made
            link.close()
        self.flush()  # what is pending belongs to the snapshot
        if self.gateway.cluster is not None:  # the other nodes' shards the snapshot names
            link.send(self.gateway.cluster.view())
        link.send(Changes(self.seq, changes.snapshot(self.gateway.catalogue, self.gateway.access)))
        ExitWatch(loop, process, lambda: self._exited(index, process))
        loop.call_later(STABLE, self._stable, index, process)
        loop.call_later(START_TIMEOUT, self._check_started, index, process)

    def _check_started(self, index: int, process: subprocess.Popen) -> None:
        """Restart a gateway that has not come to serve in START_TIMEOUT."""
        if self.processes.get(index) is process and index not in self.serving \
                and process.poll() is None and not self.stopping:
            log.error("gateway %d has not started in %.0f s; restarting it", index,
                      START_TIMEOUT)
            process.kill()

    def _lost(self, index: int, link: ControlLink) -> None:
        """Its control link closed: it died or is stopping. Its connections are gone."""
        if self.links.get(index) is not link:
            return
        del self.links[index]
        self.applied.pop(index, None)
        self._ready_at.pop(index, None)
        self._said_serving.discard(index)
        self.serving.discard(index)
        self._update_accepting()
        self.remote.pop(index, None)
        for name, count in self.totals.pop(index, {}).items():  # counters never go back
            self._retired[name] = self._retired.get(name, 0) + count
        listing = self._listing.pop(index, None)
        if listing is not None and not listing.done():
            listing.set_result(None)
        for key in [k for k in self.mirrors if r.gateway_of(k) == index]:
            self.mirrors.pop(key).close()
        for key in [k for k in self.tally if r.gateway_of(k) == index]:
            del self.tally[key]
        for req in [req for req, (asked, _) in self._asked.items() if asked == index]:
            self._asked.pop(req)[1](None)
        for key, to in list(self._relayed.items()):
            if to == index:  # it went with its requester's channel: returned
                del self._relayed[key]
                self.gateway.reply_outcome(ReplyOutcome(*key, True))
            elif r.gateway_of(key[0]) == index:  # its publisher went
                del self._relayed[key]
        self._release()

    def _exited(self, index: int, process: subprocess.Popen) -> None:
        returncode = process.wait()
        link = self.links.get(index)
        if link is not None:
            link.close()
            self._lost(index, link)
        if self.stopping or self.processes.get(index) is not process:
            return
        if index in self._replacing:
            self._replacing.discard(index)
            delay = 0.0
        else:
            failures = self.failing[index] = self.failing.get(index, 0) + 1
            delay = 0.0 if failures == 1 else min(0.1 * 2 ** failures, 60.0)
            log.error("gateway %d exited with code %s (failure %d in a row); restarting it "
                      "in %.1f s", index, returncode, failures, delay)
        # The shards drop what it held (its consumers' messages are requeued) and
        # reset its rings before a new process attaches to them.
        local = self.gateway.shards.local()  # (other nodes' relays release theirs)
        left = [len(local)]

        def released(_reply) -> None:
            left[0] -= 1
            if left[0] == 0 and not self.stopping:
                asyncio.get_running_loop().call_later(delay, self._restart, index)

        for shard in local:
            shard.request(lambda req: r.GatewayLost(req, index), released)
        self.gateway.shards.send()

    def _restart(self, index: int) -> None:
        """Start gateway `index` again; if it cannot be started now, try again
        later, less and less often, rather than leave it gone."""
        if self.stopping:
            return
        task = asyncio.get_running_loop().create_task(self._start(index))
        self._starting.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(lambda done: self._restarted(index, done))

    def _restarted(self, index: int, task: asyncio.Task) -> None:
        self._starting.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        failures = self.failing[index] = self.failing.get(index, 0) + 1
        delay = min(0.1 * 2 ** failures, 60.0)
        log.error("cannot start gateway %d (%s); trying again in %.1f s", index,
                  task.exception(), delay)
        asyncio.get_running_loop().call_later(delay, self._restart, index)

    def shard_down(self, shard: int) -> None:
        """A shard died: every gateway drops what it had there, keeping its clients."""
        for index in list(self.handovers):
            self._hand(index, ShardDown(shard))

    def shard_started(self, link) -> None:
        """A shard was restarted with new rings: each gateway gets its pair."""
        for index in list(self.handovers):
            self._hand(index, ShardRings(link.index, link.rings_for(index)))

    def _hand(self, index: int, message, fds: list[int] = ()) -> bool:
        process = self.processes.get(index)
        if process is None or process.poll() is not None:
            return False
        if self.handovers[index].send(message, fds):
            return True
        # It cannot take it (stuck): restarted, it starts afresh.
        log.warning("restarting gateway %d: it takes nothing handed to it", index)
        self._replacing.add(index)
        process.kill()
        return False

    # -- clients -----------------------------------------------------------------

    def listen(self, sock: socket.socket, tls: bool) -> None:
        """Accept the clients of this listening socket (once open) and hand each to
        a gateway, in turn: long-lived AMQP connections spread evenly, where
        SO_REUSEPORT's hash of their addresses would leave one gateway with most
        of them."""
        sock.setblocking(False)
        self._listeners.append((sock, tls))

    def open(self) -> None:
        """Start accepting, every gateway serving (start): clients that came while
        the broker started wait in the listen backlog, as a single gateway's do,
        rather than all go to the first gateway up and stay there."""
        self._open = True
        self._update_accepting()

    def _update_accepting(self) -> None:
        """Accept while a gateway serves; else clients wait in the listen backlog."""
        accepting = self._open and bool(self.serving) and not self.stopping
        if accepting == self._accepting:
            return
        self._accepting = accepting
        loop = asyncio.get_running_loop()
        for sock, tls in self._listeners:
            if accepting:
                loop.add_reader(sock.fileno(), self._accept, sock, tls)
            else:
                loop.remove_reader(sock.fileno())

    def _accept(self, sock: socket.socket, tls: bool) -> None:
        for _ in range(64):  # a burst, then the loop's other work
            try:
                client, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                # Out of descriptors: the client waits in the backlog, which keeps
                # the listener readable, so stop reading it a while (as RabbitMQ's
                # acceptor, ranch, does) rather than spin on it.
                log.warning("cannot accept an AMQP connection (%s); trying again in %.1f s",
                            error.strerror or error, ACCEPT_RETRY)
                loop = asyncio.get_running_loop()
                loop.remove_reader(sock.fileno())
                loop.call_later(ACCEPT_RETRY, self._accept_again, sock, tls)
                return
            with client:
                for _ in range(len(self.serving)):
                    index = min((i for i in self.serving if i > self._next_gateway),
                                default=min(self.serving))
                    self._next_gateway = index
                    if self._hand(index, Client(tls), [client.fileno()]):
                        break

    def _accept_again(self, sock: socket.socket, tls: bool) -> None:
        if self._accepting:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, sock, tls)

    def _stable(self, index: int, process: subprocess.Popen) -> None:
        if self.processes.get(index) is process and process.poll() is None \
                and self.failing.pop(index, None):
            log.warning("gateway %d is up again", index)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting clients, stop the gateways (they close their clients'
        connections) and wait."""
        self.stopping = True
        self._update_accepting()
        for sock, _ in self._listeners:
            sock.close()
        for link in list(self.links.values()):  # a gateway stops when its link closes
            link.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(p.poll() is None for p in self.processes.values()) \
                and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
