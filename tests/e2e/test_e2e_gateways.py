"""Many gateways (`warren serve --gateways 2`): one broker, whichever gateway a
client lands on. Clients are pinned to a gateway through the port each one
announces (WARREN_GATEWAY_PORTS, a test hook)."""

from __future__ import annotations

import os
import resource
import signal
import socket
import threading
import time
import urllib.parse

import pika
import pika.exceptions
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.broker.access import AccessControl
from warren.gateway.node import gateways
from warren.storage.metastore import MetaStore, VHostDef

from ..support.broker import RunningBroker, free_port, wait_until
from ..support.rawclient import RawClient
from .test_e2e_basic import shard_pids

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    broker = RunningBroker(tmp_path_factory.mktemp("gateways") / "data", shards=2,
                           gateways=2).start()
    yield broker
    broker.stop()


def connect(broker: RunningBroker, gateway: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(broker.gateway_url(gateway)))


def closed_with_320(conn: pika.BlockingConnection) -> bool:
    """Has the broker closed `conn` with 320 CONNECTION_FORCED (one poll)?"""
    try:
        conn.process_data_events(0.05)
    except pika.exceptions.ConnectionClosedByBroker as error:
        return error.reply_code == 320
    return False


def take(channel, queue: str, count: int, timeout: float = 10.0) -> list:
    got = []

    def one():
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            got.append(body)
        return len(got) >= count

    wait_until(one, timeout, message=f"{count} messages from {queue}")
    return got


def test_declared_on_one_gateway_used_on_the_other(two):
    a, b = connect(two, 2), connect(two, 1)
    try:
        ca, cb = a.channel(), b.channel()
        # gateway 1 declares: gateway 2 must route with it at once after the -ok
        cb.exchange_declare("gw.x", "topic")
        cb.queue_declare("gw.q1")
        cb.queue_bind("gw.q1", "gw.x", "k.#")
        ca.basic_publish("gw.x", "k.1", b"from 0")
        assert take(cb, "gw.q1", 1) == [b"from 0"]
        # and the other way round
        ca.queue_declare("gw.q0")
        ca.queue_bind("gw.q0", "gw.x", "j.*")
        cb.basic_publish("gw.x", "j.1", b"from 1")
        assert take(ca, "gw.q0", 1) == [b"from 1"]
        # consumers on gateway 1 of a queue gateway 2 publishes to
        received = []
        cb.basic_consume("gw.q1", lambda ch, m, p, body: received.append(body), auto_ack=True)
        for i in range(100):
            ca.basic_publish("gw.x", "k.2", str(i).encode())
        wait_until(lambda: (b.process_data_events(0.05), len(received) >= 100)[1], 10)
        assert received == [str(i).encode() for i in range(100)]
        cb.queue_delete("gw.q0")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ca.queue_declare("gw.q0", passive=True)
        assert closed.value.reply_code == 404
    finally:
        a.close()
        b.close()


def test_errors_of_a_forwarded_declaration(two):
    b = connect(two, 1)
    try:
        ch = b.channel()
        ch.queue_declare("gw.err", durable=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.queue_declare("gw.err", durable=False)
        assert closed.value.reply_code == 406
        assert "inequivalent arg 'durable'" in closed.value.reply_text
        ch = b.channel()  # the connection goes on
        assert ch.queue_declare("gw.err", passive=True).method.message_count == 0
        ch.queue_delete("gw.err")
    finally:
        b.close()


def test_a_forwarded_declaration_counts_the_channel_s_own_publishes(two):
    # Gateway 0 answers gateway 1's declarations, asking the shard on its own
    # ring; as on RabbitMQ, a count after publishes on the same channel has them.
    b = connect(two, 1)
    try:
        ch = b.channel()
        short = []
        for name in [f"gw.count{i}" for i in range(8)]:  # on both shards
            ch.queue_declare(name)
            for round_ in range(1, 6):
                for _ in range(500):
                    ch.basic_publish("", name, b"x" * 100)
                counted = ch.queue_declare(name, passive=True).method.message_count
                if counted != 500 * round_:
                    short.append((name, 500 * round_, counted))
            for _ in range(500):
                ch.basic_publish("", name, b"x" * 100)
            counted = ch.queue_declare(name).method.message_count  # not passive
            if counted != 3000:
                short.append((name, 3000, counted))
            for _ in range(500):
                ch.basic_publish("", name, b"x" * 100)
            counted = ch.queue_delete(name).method.message_count
            if counted != 3500:
                short.append((name, 3500, counted))
        assert short == []
    finally:
        b.close()


def test_exclusive_queue_owned_on_another_gateway(two):
    owner, other = connect(two, 1), connect(two, 2)
    try:
        name = owner.channel().queue_declare("", exclusive=True).method.queue
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            other.channel().basic_consume(name, lambda *a: None)
        assert closed.value.reply_code == 405
        owner.close()
        ch = other.channel()

        def gone():
            try:
                other.channel().queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                return error.reply_code == 404
            return False

        wait_until(gone, 10, message="the exclusive queue deleted with its owner")
        ch.close()
    finally:
        if owner.is_open:
            owner.close()
        other.close()


@pytest.mark.parametrize("dead", [1, 2])
def test_a_dead_gateway_is_restarted_and_its_messages_come_back(two, dead):
    """Any gateway can die: the root (which accepts no clients) restarts it, and
    the other gateway's clients are unaffected."""
    other = 3 - dead
    a, b = connect(two, other), connect(two, dead)
    ca, cb = a.channel(), b.channel()
    queue = f"gw.dead{dead}"
    ca.queue_declare(queue)
    for i in range(5):
        ca.basic_publish("", queue, str(i).encode())
    cb.basic_qos(prefetch_count=10)
    held = []
    cb.basic_consume(queue, lambda ch, m, p, body: held.append(body))
    wait_until(lambda: (b.process_data_events(0.05), len(held) == 5)[1], 10)
    pid = int(next(line for line in two.log_text().splitlines()
                   if f"gateway {dead} started" in line).rsplit("pid ", 1)[1].split(")")[0])
    two.forget_gateway_port(dead)
    os.kill(pid, signal.SIGKILL)
    # the other gateway's client is unaffected and gets the unacked messages again
    got = take(ca, queue, 5)
    assert sorted(got) == [str(i).encode() for i in range(5)]
    # the dead gateway is back, with the catalogue, and the broker's port reaches it
    c = connect(two, dead)
    c.channel().queue_declare(queue, passive=True)
    c.close()
    assert a.is_open
    a.close()


@pytest.mark.parametrize("client_on,server_on", [(1, 2), (2, 1)])
def test_direct_reply_to_across_gateways(two, client_on, server_on):
    client, server = connect(two, client_on), connect(two, server_on)
    try:
        cc, sc = client.channel(), server.channel()
        service = f"gw.rpc{server_on}"
        sc.queue_declare(service)
        replies = []
        cc.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: replies.append(body),
                         auto_ack=True)
        cc.basic_publish("", service, b"2+2",
                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        request = []
        wait_until(lambda: request.append(sc.basic_get(service, auto_ack=True)) or request[-1][0],
                   10, message="the request")
        _, props, body = request[-1]
        assert body == b"2+2"
        # its reply_to names the client's channel on the client's gateway, where
        # it consumes: a passive declare of it says so from either gateway
        for conn in (server, client):
            ok = conn.channel().queue_declare(props.reply_to, passive=True)
            assert (ok.method.queue, ok.method.consumer_count) == (props.reply_to, 1)
        confirmed = server.channel()
        confirmed.confirm_delivery()
        confirmed.basic_publish("", props.reply_to, b"4", mandatory=True)  # acked, not returned
        wait_until(lambda: (client.process_data_events(0.05), replies)[1], 10,
                   message="the reply on the client's gateway")
        assert replies == [b"4"]
        cc.close()  # the address goes with the channel
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            server.channel().queue_declare(props.reply_to, passive=True)
        assert closed.value.reply_code == 404
        assert closed.value.reply_text == f"NOT_FOUND - no queue '{props.reply_to}' in vhost '/'"
        # a mandatory reply to a requester gone comes back, before its confirm
        with pytest.raises(pika.exceptions.UnroutableError) as unroutable:
            confirmed.basic_publish("", props.reply_to, b"late", mandatory=True)
        [returned] = unroutable.value.messages
        assert (returned.method.reply_text, returned.body) == ("NO_ROUTE", b"late")
    finally:
        client.close()
        server.close()


def restarted_shard(broker, old: int) -> int | None:
    """The pid of the broker's one shard once it is another than `old`. One look
    at /proc: two could see the old shard alive, then none at all."""
    pids = shard_pids(broker)
    return pids[0] if pids and pids != [old] else None


def test_a_restarted_shard_keeps_every_gateway_s_clients(tmp_path):
    """A shard that restarts has new rings: the root hands them to every gateway,
    whose clients stay connected, and nothing confirmed is lost."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    try:
        conns = {gateway: connect(broker, gateway) for gateway in (1, 2)}
        ch = conns[1].channel()
        ch.confirm_delivery()
        ch.queue_declare("gw.kept", durable=True)
        ch.basic_publish("", "gw.kept", b"kept", pika.BasicProperties(delivery_mode=2))
        [pid] = shard_pids(broker)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: restarted_shard(broker, pid), 30,
                   message="the shard restarted")

        def confirmed(publisher: int, body: bytes) -> bool:
            try:  # nacked, or refused, until the gateway has the shard's new rings
                ch = conns[publisher].channel()
                ch.confirm_delivery()
                ch.basic_publish("", "gw.kept", body, pika.BasicProperties(delivery_mode=2))
                return True
            except (pika.exceptions.AMQPChannelError, pika.exceptions.NackError):
                return False

        wait_until(lambda: confirmed(1, b"after"), 30, message="gateway 1 reaches the shard")
        wait_until(lambda: confirmed(2, b"back"), 30, message="gateway 2 reaches the shard")
        # the message confirmed before the kill came back from the store
        assert {b"kept", b"after", b"back"} <= set(take(conns[1].channel(), "gw.kept", 3))
        assert all(conn.is_open for conn in conns.values())
        assert "restarting gateway" not in broker.log_text()
    finally:
        broker.stop()


def gateway_pid(broker: RunningBroker, index: int) -> int:
    """The pid of gateway `index` as last started, from the log (waiting for its
    first start: the root says it listens before every gateway has started)."""
    def started() -> list[str]:
        return [line for line in broker.log_text().splitlines()
                if f"gateway {index} started" in line]
    line = wait_until(started, 30, message=f"gateway {index} started")[-1]
    return int(line.rsplit("pid ", 1)[1].split(")")[0])


def test_a_gateway_restarted_while_a_shard_is_down_gets_the_shard_when_it_runs(tmp_path):
    """A gateway that dies while a shard waits to be restarted comes back at once,
    without that shard's rings, and takes them when the shard runs again."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    try:
        conn = connect(broker, 1)
        conn.channel().queue_declare("gw.later", durable=True)
        conn.close()
        [pid] = shard_pids(broker)
        os.kill(pid, signal.SIGKILL)
        pid = wait_until(lambda: restarted_shard(broker, pid), 30, message="the shard restarted")
        os.kill(pid, signal.SIGKILL)  # its second failure in a row: back in 0.4 s
        broker.forget_gateway_port(2)
        os.kill(gateway_pid(broker, 2), signal.SIGKILL)
        wait_until(lambda: restarted_shard(broker, pid), 30,
                   message="the shard restarted again")

        def confirmed() -> bool:
            try:  # refused until the gateway has the shard's new rings
                conn = connect(broker, 2)
                ch = conn.channel()
                ch.confirm_delivery()
                ch.basic_publish("", "gw.later", b"x", pika.BasicProperties(delivery_mode=2))
                conn.close()
                return True
            except (pika.exceptions.AMQPError, pika.exceptions.NackError):
                return False

        wait_until(confirmed, 30, message="the restarted gateway reaches the shard")
        # Restarted once, not crashing on: the root notices the death by the
        # process's exit or by a hand-over it no longer takes, whichever comes first.
        assert broker.log_text().count("gateway 2 started") == 2
    finally:
        broker.stop()


def test_a_root_out_of_descriptors_retries_and_then_serves_the_waiting_client(tmp_path):
    """Out of descriptors, the root cannot accept: the client waits in the listen
    backlog, the root tries again now and then instead of spinning on the
    listener, and serves the client once descriptors are free again."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    root = broker.process.pid
    limits = resource.prlimit(root, resource.RLIMIT_NOFILE)
    try:
        used = {int(name) for name in os.listdir(f"/proc/{root}/fd")}
        lowest_free = min(n for n in range(len(used) + 1) if n not in used)
        resource.prlimit(root, resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
        client = socket.create_connection(("127.0.0.1", broker.port), timeout=10)

        def warnings() -> int:
            return broker.log_text().count("cannot accept an AMQP connection")

        wait_until(lambda: warnings() >= 3, 10, message="the root tries again")
        assert warnings() < 50  # spinning, it logged thousands in that time
        resource.prlimit(root, resource.RLIMIT_NOFILE, limits)
        client.sendall(b"AMQP\x00\x00\x09\x01")
        assert client.recv(1) == b"\x01"  # a method frame: connection.start
        client.close()
    finally:
        resource.prlimit(root, resource.RLIMIT_NOFILE, limits)
        broker.stop()


def test_a_gateway_the_root_cannot_start_again_is_tried_until_it_runs(tmp_path):
    """A gateway dies while the root is out of descriptors: its start fails, and
    the root tries again, later each time, until it can."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    root = broker.process.pid
    gateway = gateway_pid(broker, 2)  # up before the root runs out of descriptors
    limits = resource.prlimit(root, resource.RLIMIT_NOFILE)
    try:
        resource.prlimit(root, resource.RLIMIT_NOFILE, (3, limits[1]))  # no new descriptor
        broker.forget_gateway_port(2)
        os.kill(gateway, signal.SIGKILL)
        wait_until(lambda: broker.log_text().count("cannot start gateway 2") >= 2, 10,
                   message="the root tries again")
        resource.prlimit(root, resource.RLIMIT_NOFILE, limits)
        conn = connect(broker, 2)  # announced once it runs
        conn.channel().queue_declare("gw.started", auto_delete=True)
        conn.close()
    finally:
        resource.prlimit(root, resource.RLIMIT_NOFILE, limits)
        broker.stop()


def test_the_disk_alarm_blocks_publishers_on_every_gateway(tmp_path):
    # A free-disk limit larger than any disk: the alarm is on from the start.
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2,
                           extra_args=["--disk-free-limit", str(10**18)]).start()
    try:
        events = []
        pub = connect(broker, 1)
        pub.add_on_connection_blocked_callback(lambda c, f: events.append(f.method.reason))
        ch = pub.channel()
        ch.queue_declare("gw.held")
        for _ in range(10):
            ch.basic_publish("", "gw.held", b"x")
        wait_until(lambda: (pub.process_data_events(time_limit=0.05), events)[1], timeout=10)
        assert events == ["low on disk"]  # and it is not read: the broker's stop closes it
        # every gateway watches the disk, and the log tells of the alarm once
        assert broker.log_text().count("resource alarm disk on") == 1
    finally:
        broker.stop()


def limited_broker(tmp_path) -> RunningBroker:
    """Two gateways; vhost "one" takes one connection, user "two" two channels."""
    data = tmp_path / "data"
    data.mkdir()
    meta = MetaStore(str(data / "meta"))
    meta.put_vhost(VHostDef("/", "", {}))
    meta.put_vhost(VHostDef("one", "", {"max-connections": 1}))
    access = AccessControl(meta)
    access.put_user("guest", "guest", ["administrator"])
    access.set_permissions("guest", "/", ".*", ".*", ".*")
    access.set_permissions("guest", "one", ".*", ".*", ".*")
    access.put_user("two", "pw", [], limits={"max-channels": 2})
    access.set_permissions("two", "/", ".*", ".*", ".*")
    meta.close()
    return RunningBroker(data, shards=1, gateways=2).start()


def open_on(broker: RunningBroker, gateway: int, vhost: str = "/", user: str = "guest",
            password: str = "guest") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.gateway_port(gateway), vhost,
        pika.PlainCredentials(user, password), connection_attempts=1))


def test_limits_count_the_connections_and_channels_of_every_gateway(tmp_path):
    broker = limited_broker(tmp_path)
    try:
        for first, second in ((2, 1), (1, 2)):
            held = open_on(broker, first, "one")
            with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
                open_on(broker, second, "one")
            assert "access to vhost 'one' refused for user 'guest': connection limit (1) " \
                   "is reached" in str(raised.value)
            held.close()
        on2 = open_on(broker, 2, user="two", password="pw")
        on1 = open_on(broker, 1, user="two", password="pw")
        on2.channel()
        on1.channel()  # the user's two channels, on two gateways
        refusal = ("NOT_ALLOWED - number of channels opened for user 'two' has reached the "
                   "maximum allowed user limit of (2)")
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            on1.channel()  # counted by the root with gateway 2's channel
        assert raised.value.reply_text == refusal
        # on1's channel went with it; the root counts the one on gateway 1 too
        on1 = open_on(broker, 1, user="two", password="pw")
        on1.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            on2.channel()
        assert raised.value.reply_text == refusal
    finally:
        broker.stop()


def test_a_client_s_connection_close_lets_everything_go_before_close_ok(tmp_path):
    """As RabbitMQ does, its channels close (unacked messages back in the queue) and
    its exclusive queues go before close-ok, while the client still holds its socket.
    Warren also stops counting the connection then, on every gateway, so a client
    that reconnects at once is never refused for itself. (RabbitMQ counts it until
    the socket ends.)"""
    broker = limited_broker(tmp_path)
    raw = RawClient(broker.gateway_port(2))
    try:
        raw.handshake(vhost="one")
        raw.open_channel()
        raw.call(1, m.QueueDeclare(queue="held"), m.QueueDeclareOk)
        raw.call(1, m.QueueDeclare(queue="mine", exclusive=True), m.QueueDeclareOk)
        raw.publish(1, "held", b"unacked")
        raw.call(1, m.BasicConsume(queue="held", consumer_tag="c"), m.BasicConsumeOk)
        raw.expect(1, m.BasicDeliver)
        assert raw.next_frame()[0] == frames.FRAME_HEADER and raw.next_frame()[2] == b"unacked"
        pids = shard_pids(broker)
        for pid in pids:  # the release cannot be done while they are stopped
            os.kill(pid, signal.SIGSTOP)
        try:
            raw.send_method(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
            # close-ok waits for the shards: the client's next connection may come
            # in through another gateway, whose ring a shard may read first
            with pytest.raises(TimeoutError):
                raw.next_frame(timeout=0.5)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        raw.expect(0, m.ConnectionCloseOk)
        again = open_on(broker, 1, "one")  # the limit is one connection
        channel = again.channel()
        assert channel.basic_get("held", auto_ack=True)[2] == b"unacked"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            channel.queue_declare("mine", passive=True)
        assert raised.value.reply_code == 404
        again.close()
    finally:
        raw.close()
        broker.stop()


def test_single_active_consumer_across_gateways(two):
    a, b = connect(two, 2), connect(two, 1)
    try:
        ca, cb = a.channel(), b.channel()
        ca.queue_declare("gw.sac", arguments={"x-single-active-consumer": True})
        got = {2: [], 1: []}
        tag = ca.basic_consume("gw.sac", lambda ch, m, p, body: got[2].append(body),
                               auto_ack=True)
        cb.basic_consume("gw.sac", lambda ch, m, p, body: got[1].append(body), auto_ack=True)
        for i in range(10):
            ca.basic_publish("", "gw.sac", b"first")
        wait_until(lambda: (a.process_data_events(0.02), b.process_data_events(0.02),
                            len(got[2]) == 10)[2], 10)
        ca.basic_cancel(tag)  # the consumer on gateway 1 becomes the active one
        for i in range(10):
            ca.basic_publish("", "gw.sac", b"second")
        wait_until(lambda: (b.process_data_events(0.02), len(got[1]) == 10)[1], 10)
        assert got == {2: [b"first"] * 10, 1: [b"second"] * 10}
    finally:
        a.close()
        b.close()


def test_deleting_a_queue_cancels_its_consumers_on_every_gateway(two):
    a, b = connect(two, 2), connect(two, 1)
    try:
        ca, cb = a.channel(), b.channel()
        ca.queue_declare("gw.doomed")
        cancelled = []
        for gateway, (conn, ch) in enumerate(((a, ca), (b, cb))):
            ch.add_on_cancel_callback(lambda frame, g=gateway: cancelled.append(g))
            ch.basic_consume("gw.doomed", lambda *args: None)
        cb.queue_delete("gw.doomed")
        wait_until(lambda: (a.process_data_events(0.02), b.process_data_events(0.02),
                            sorted(cancelled) == [0, 1])[2], 10,
                   message="basic.cancel on both gateways")
    finally:
        a.close()
        b.close()


def test_management_sees_and_closes_the_connections_of_every_gateway(tmp_path):
    from .test_management_api import call, get
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2, management=True).start()
    try:
        a, b = connect(broker, 2), connect(broker, 1)
        b.channel().basic_consume(b.channel().queue_declare("").method.queue, lambda *x: None)
        ports = {conn._impl._transport._sock.getsockname()[1] for conn in (a, b)}
        names = [c["name"] for c in get(broker, "/api/connections")]
        assert {int(n.split(" -> ")[0].rsplit(":", 1)[1]) for n in names} == ports
        [consumer] = get(broker, "/api/consumers")  # on gateway 1
        assert consumer["queue"]["name"].startswith("amq.gen-")
        assert len(get(broker, "/api/channels")) == 2
        publisher = b.channel()
        publisher.confirm_delivery()
        for _ in range(3):
            publisher.basic_publish("", "nowhere", b"counted")  # on gateway 1
        overview = get(broker, "/api/overview")
        assert overview["message_stats"]["publish"] == 3
        assert overview["object_totals"]["connections"] == 2
        port = b._impl._transport._sock.getsockname()[1]
        name = next(n for n in names if n.startswith(f"127.0.0.1:{port} "))
        status, _ = call(broker, "DELETE", "/api/connections/" + urllib.parse.quote(name))
        assert status == 204
        wait_until(lambda: closed_with_320(b), 10,
                   message="gateway 1's connection closed through the API")
        a.close()
    finally:
        broker.stop()


def test_a_stuck_gateway_is_restarted_and_declarations_go_on(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    try:
        connect(broker, 1).close()  # gateway 1 is up
        pid = int(next(line for line in broker.log_text().splitlines()
                       if "gateway 1 started" in line).rsplit("pid ", 1)[1].split(")")[0])
        os.kill(pid, signal.SIGSTOP)  # it applies no more changes
        conn = connect(broker, 2)
        declaring = threading.Thread(target=lambda: conn.channel().queue_declare("gw.after"))
        declaring.start()
        declaring.join(30)  # answered once gateway 1 is replaced, not never
        assert not declaring.is_alive()
        assert "gateway 1 has not applied the catalogue's changes" in broker.log_text()
        broker.forget_gateway_port(1)
        again = connect(broker, 1)  # the new gateway 1 has the queue
        again.channel().queue_declare("gw.after", passive=True)
        again.close()
        conn.close()
    finally:
        broker.stop()


def test_a_gateway_killed_under_a_declaration_storm_serves_again_within_seconds(tmp_path):
    """Two clients declare and delete queues without pause; gateway 1 is killed.
    Its replacement is judged only on the changes made after it started: the
    checks armed for the declarations before the kill (each waits APPLY_TIMEOUT
    for every gateway) must not take it for stuck while it starts, over and over."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2).start()
    stop = threading.Event()
    declared = [0, 0]

    def storm(n: int) -> None:
        conn = connect(broker, 2)
        ch = conn.channel()
        while not stop.is_set():
            ch.queue_declare(f"gw.storm{n}.{declared[n] % 20}")
            ch.queue_delete(f"gw.storm{n}.{declared[n] % 20}")
            declared[n] += 1
        conn.close()

    storms = [threading.Thread(target=storm, args=(n,)) for n in (0, 1)]
    try:
        pid = gateway_pid(broker, 1)
        for thread in storms:
            thread.start()
        # Every moment of the last APPLY_TIMEOUT armed a check when the kill comes.
        began = time.monotonic()
        wait_until(lambda: time.monotonic() - began > gateways.APPLY_TIMEOUT + 0.5,
                   gateways.APPLY_TIMEOUT + 5, interval=0.1)
        assert min(declared) > 0
        broker.forget_gateway_port(1)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        before = sum(declared)
        port = broker.gateway_port(1, timeout=10)  # announced once it has the catalogue
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        conn.channel().queue_declare("gw.storm.probe", auto_delete=True)
        conn.close()
        assert time.monotonic() - killed < 10
        # the storm went on meanwhile, and goes on with the new gateway
        after = sum(declared)
        assert after > before
        wait_until(lambda: sum(declared) > after + 100, 10)
        assert "has not applied the catalogue's changes" not in broker.log_text()
        assert broker.log_text().count("gateway 1 started") == 2
    finally:
        stop.set()
        for thread in storms:
            thread.join(10)
        broker.stop()


def test_clients_are_spread_evenly_over_the_gateways(two):
    """The root hands the clients of the broker's port to the gateways in turn
    (SO_REUSEPORT's hash of the addresses would not spread them evenly)."""
    before = two.log_text().count("accepting AMQP connection")
    conns = [pika.BlockingConnection(pika.URLParameters(two.url)) for _ in range(6)]
    try:
        def accepted() -> list[str]:
            lines = [line for line in two.log_text().splitlines()
                     if "accepting AMQP connection" in line][before:]
            return lines if len(lines) == 6 else []

        lines = wait_until(accepted, 10, message="6 connections logged")
        assert sorted(line.split("> ")[0].rsplit("<", 1)[1] for line in lines) == \
            ["gateway-1"] * 3 + ["gateway-2"] * 3
    finally:
        for conn in conns:
            conn.close()


def processes_where(field: int, value: int) -> list[int]:
    """The processes whose /proc/PID/stat `field` (after the name: 1 parent,
    2 process group) is `value`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rsplit(")", 1)[1].split()[field]) == value:
                found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    """The processes `pid` started that still run (its shards and gateways)."""
    return processes_where(1, pid)


def test_no_child_process_shows_the_configuration(tmp_path):
    """Any local user reads a process's command line (ps); the gateways and shards
    get their configuration, the default user's password included, another way."""
    secret = "h-secret-" + os.urandom(6).hex()
    config = tmp_path / "warren.toml"
    config.write_text(f'default_pass = "{secret}"\n')
    broker = RunningBroker(tmp_path / "data", shards=2, gateways=2,
                           extra_args=["--config", str(config)]).start()
    try:
        for index in (1, 2):  # the password is the broker's, on every gateway
            pika.BlockingConnection(pika.URLParameters(
                f"amqp://guest:{secret}@127.0.0.1:{broker.gateway_port(index)}/%2F")).close()
        children = wait_until(lambda: (lambda found: found if len(found) == 4 else None)(
            children_of(broker.process.pid)), 10, message="2 shards and 2 gateways")
        for pid in children:
            for shown in ("cmdline", "environ"):
                with open(f"/proc/{pid}/{shown}", "rb") as f:
                    text = f.read()
                for word in (secret, "default_pass", str(tmp_path)):  # the data directory too
                    assert word.encode() not in text, (pid, shown, word)
    finally:
        broker.stop()


def test_clients_that_connect_while_the_broker_starts_are_spread_over_every_gateway(tmp_path):
    """The port takes connections (into its backlog) as soon as it is bound; they
    are served once every gateway is, not all by the first one up."""
    port = free_port()
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2,
                           extra_args=["--port", str(port)])
    starting = threading.Thread(target=broker.start)
    starting.start()
    clients = []
    try:
        def connected():
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=30)
            except OSError:
                return None

        clients.append(wait_until(connected, 30, message="the port open"))
        clients += [socket.create_connection(("127.0.0.1", port), timeout=30)
                    for _ in range(15)]
        for client in clients:
            client.sendall(b"AMQP\x00\x00\x09\x01")
        for client in clients:
            assert client.recv(1) == b"\x01"  # a method frame: connection.start
        starting.join(30)
        log = broker.log_text()
        lines = [line for line in log.splitlines() if "accepting AMQP connection" in line]
        assert sorted(line.split("> ")[0].rsplit("<", 1)[1] for line in lines) == \
            ["gateway-1"] * 8 + ["gateway-2"] * 8
        # As a single gateway: the broker says it listens before it serves anyone.
        assert log.index("started TCP listener") < log.index("accepting AMQP connection")
    finally:
        for client in clients:
            client.close()
        starting.join(30)
        broker.stop()


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_a_signal_to_the_process_group_stops_the_broker_and_restarts_nothing(tmp_path, when):
    """Ctrl-C and systemd signal every process of the broker at once: the root
    stops its gateways and shards itself, none is taken for failed and restarted
    (whichever of them the signal reaches first, also while they start)."""
    broker = RunningBroker(tmp_path / "data", shards=1, gateways=2, preexec_fn=os.setsid)
    if when == "starting":
        starting = threading.Thread(target=broker.start)
        starting.start()
        # The shard and both gateways exist: the last is still starting up.
        wait_until(lambda: broker.process is not None and
                   len(children_of(broker.process.pid)) == 3, 30, interval=0.002,
                   message="3 child processes")
    else:
        broker.start()
        conns = [connect(broker, 1), connect(broker, 2)]
    try:
        os.killpg(broker.process.pid, signal.SIGTERM)
        assert broker.wait(30) == 0
        if when == "starting":
            starting.join(30)
        else:
            for conn in conns:  # told 320 CONNECTION_FORCED by their gateway
                wait_until(lambda: closed_with_320(conn), 10, message="320")
        log = broker.log_text()
        assert "restarting" not in log and "exited with code" not in log, log
        assert log.count("gateway 2 started") <= 1
        wait_until(lambda: not processes_where(2, broker.process.pid), 10,
                   message="every process of the broker gone")
    finally:
        broker.stop()
