"""Configuration, users, permissions, limits and TLS against a real `warren serve`."""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest

from warren.gateway.broker.access import AccessControl
from warren.storage.metastore import MetaStore, VHostDef

from ..support.broker import ROOT, RunningBroker, wait_until
from .test_management_api import call


def serve(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "serve", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("content,message", [
    ("colour = 'blue'\n", "warren.toml: unknown key `colour`"),
    ("heartbeat = 'often'\n", "warren.toml: heartbeat: Expected `int`, got `str`"),
    ("port = 70000\n", "port: must be a port number, 0-65535 (got 70000)"),
    ("max_message_size = 0\n", "max_message_size: must be 1-536870912 (got 0)"),
    ("tcp_recbuf = 100\n", "tcp_recbuf: must be 0 (the OS tunes it) or 4096 bytes to 1 GiB"),
    ("tls_certfile = 'x.pem'\n", "tls_keyfile: is required with tls_certfile"),
    ("port = [\n", "not valid TOML"),
])
def test_bad_configuration_is_named_and_the_broker_does_not_start(tmp_path, content, message):
    config = tmp_path / "warren.toml"
    config.write_text(content)
    result = serve("--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "warren: configuration error:" in result.stderr
    assert message in result.stderr.replace(str(config), "warren.toml")
    assert "listening" not in result.stdout


def test_bad_command_line_value_is_named(tmp_path):
    result = serve("--heartbeat", "soon", "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "--heartbeat: expected int, got 'soon'" in result.stderr


def test_configured_tuning_reaches_clients(tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text("heartbeat = 7\nchannel_max = 12\nframe_max = 8192\n")
    broker = RunningBroker(tmp_path / "data", extra_args=["--config", str(config)]).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        params = conn._impl.params
        assert (params.heartbeat, params.channel_max, params.frame_max) == (7, 12, 8192)
        conn.close()
    finally:
        broker.stop()


def test_message_larger_than_max_size_closes_the_channel(tmp_path):
    broker = RunningBroker(tmp_path / "data", extra_args=["--max-message-size", "100"]).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.queue_declare("small")
        ch.basic_publish("", "small", b"x" * 100)  # exactly the limit is fine
        ch.basic_publish("", "small", b"x" * 101)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
            ch.queue_declare("small", passive=True)
        assert raised.value.reply_code == 406
        assert raised.value.reply_text == (
            "PRECONDITION_FAILED - message size 101 is larger than configured max size 100")
        ch = conn.channel()
        assert ch.queue_declare("small", passive=True).method.message_count == 1
        conn.close()
    finally:
        broker.stop()


# -- users and permissions ---------------------------------------------------------------


def prepare_users(data_dir) -> None:
    """Write users, vhosts and permissions into a new data directory's metadata
    store, as the management API would."""
    meta = MetaStore(str(data_dir / "meta"))
    try:
        for vhost, limits in (("/", {}), ("team", {"max-connections": 1}),
                              ("tiny", {"max-queues": 1})):
            meta.put_vhost(VHostDef(vhost, "", limits))
        access = AccessControl(meta)
        access.put_user("guest", "guest", ["administrator"])
        access.set_permissions("guest", "/", ".*", ".*", ".*")
        access.set_permissions("guest", "tiny", ".*", ".*", ".*")
        access.put_user("reader", "secret", [])
        access.set_permissions("reader", "/", "^reader-", "^amq\\.default$", "^(shared|reader-.*)$")
        access.put_user("teamster", "pw", [], limits={"max-channels": 2})
        access.set_permissions("teamster", "team", ".*", ".*", ".*")
    finally:
        meta.close()


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory, gateway_count):
    data = tmp_path_factory.mktemp("users") / "data"
    data.mkdir()
    prepare_users(data)
    broker = RunningBroker(data, shards=2, extra_args=["--bind", "0.0.0.0"]).start()
    yield broker
    broker.stop()


def connect_as(broker, user, password, vhost="/", host="127.0.0.1"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, broker.port, vhost, pika.PlainCredentials(user, password),
        connection_attempts=1))


def test_wrong_password_is_refused(users_broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as raised:
        connect_as(users_broker, "reader", "wrong")
    assert "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN" in str(
        raised.value)


def test_permissions_are_checked_per_resource(users_broker):
    admin = connect_as(users_broker, "guest", "guest")
    admin.channel().queue_declare("shared")
    conn = connect_as(users_broker, "reader", "secret")
    try:
        ch = conn.channel()
        ch.queue_declare("reader-own")  # configure ^reader-
        ch.basic_publish("", "reader-own", b"mine")  # write on the default exchange
        assert ch.basic_get("reader-own", auto_ack=True)[2] == b"mine"  # read
        ch.basic_get("shared", auto_ack=True)  # read ^shared
        for action, text in [
            (lambda c: c.queue_declare("other"),
             "ACCESS_REFUSED - access to queue 'other' in vhost '/' refused for user 'reader'"),
            (lambda c: c.queue_delete("shared"),
             "ACCESS_REFUSED - access to queue 'shared' in vhost '/' refused for user 'reader'"),
            (lambda c: (c.basic_publish("amq.fanout", "", b"x"), c.queue_declare("reader-own")),
             "ACCESS_REFUSED - access to exchange 'amq.fanout' in vhost '/' refused for user "
             "'reader'"),
            (lambda c: c.exchange_declare("other-x", "direct"),
             "ACCESS_REFUSED - access to exchange 'other-x' in vhost '/' refused for user "
             "'reader'"),
        ]:
            ch = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
                action(ch)
            assert (raised.value.reply_code, raised.value.reply_text) == (403, text)
        assert conn.is_open  # only channels were closed
    finally:
        conn.close()
        admin.close()


def test_vhost_without_permission_and_missing_vhost(users_broker):
    for vhost, text in [("team", "NOT_ALLOWED - access to vhost 'team' refused for user 'reader'"),
                        ("nowhere", "NOT_ALLOWED - vhost nowhere not found")]:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
            connect_as(users_broker, "reader", "secret", vhost)
        assert "(530)" in str(raised.value) and text in str(raised.value)


def test_connection_channel_and_queue_limits(users_broker):
    first = connect_as(users_broker, "teamster", "pw", "team")
    try:
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as raised:
            connect_as(users_broker, "teamster", "pw", "team")
        assert ('(530) "NOT_ALLOWED - access to vhost \'team\' refused for user \'teamster\': '
                'connection limit (1) is reached"') in str(raised.value)
        first.channel()
        first.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            first.channel()
        assert raised.value.reply_text == (
            "NOT_ALLOWED - number of channels opened for user 'teamster' has reached the "
            "maximum allowed user limit of (2)")
    finally:
        if first.is_open:
            first.close()
    conn = connect_as(users_broker, "guest", "guest", "tiny")
    ch = conn.channel()
    ch.queue_declare("one")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        ch.queue_declare("two")
    assert raised.value.reply_text == ("PRECONDITION_FAILED - cannot declare queue 'two' in vhost "
                                       "'tiny': vhost queue limit (1) is reached")
    conn.close()


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback: connecting to it from
    here makes the broker see a non-loopback peer."""
    candidates = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("203.0.113.1", 9))  # no packet is sent: this only picks a route
        candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    try:
        candidates += subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                                     timeout=5).stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    for address in candidates:
        if "." in address and not address.startswith("127."):
            return address
    return None


def test_guest_refused_from_a_non_loopback_peer(users_broker):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect_as(users_broker, "guest", "guest", host=address)
    conn = connect_as(users_broker, "reader", "secret", host=address)  # others may
    conn.close()


# -- TLS ----------------------------------------------------------------------------------


def test_tls_listener_with_pika(tmp_path, certificate):
    cert, key = certificate
    broker = RunningBroker(tmp_path / "data", management=True, extra_args=[
        "--tls-port", "0", "--tls-certfile", str(cert), "--tls-keyfile", str(key)])
    broker.start()
    try:
        log = broker.log_text()
        tls_port = broker.tls_port
        context = ssl.create_default_context(cafile=str(cert))
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "localhost", tls_port, ssl_options=pika.SSLOptions(context, "localhost")))
        ch = conn.channel()
        ch.queue_declare("over-tls")
        ch.basic_publish("", "over-tls", b"encrypted")
        assert ch.basic_get("over-tls", auto_ack=True)[2] == b"encrypted"
        # large bodies are delivered by writev (one frame, and several): intact over TLS
        bodies = [bytes(range(256)) * 256, b"\x07" * 300_000]
        for body in bodies:
            ch.basic_publish("", "over-tls", body)
        got = []
        for _, _, body in ch.consume("over-tls", auto_ack=True, inactivity_timeout=10):
            got.append(body)
            if len(got) == len(bodies):
                break
        assert got == bodies
        ch.cancel()
        # the management API lists the TLS listener and the connection as TLS
        overview = call(broker, "GET", "/api/overview")[1]
        assert {(x["protocol"], x["port"]) for x in overview["listeners"]} >= {
            ("amqp", broker.port), ("amqp/ssl", tls_port),
            ("http", broker.listener_port("http"))}
        assert [c["ssl"] for c in call(broker, "GET", "/api/connections")[1]] == [True]
        conn.close()
        # the plain listener still works beside it, and a plain client on the TLS port fails
        plain = pika.BlockingConnection(pika.URLParameters(broker.url))
        plain.close()
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", tls_port,
                                                              connection_attempts=1,
                                                              socket_timeout=3))
        assert "Traceback" not in log
    finally:
        broker.stop()


def test_failed_tls_handshakes_are_logged_naming_the_client(tmp_path, certificate):
    """asyncio drops a failed handshake silently; RabbitMQ logs each one."""

    cert, key = certificate
    broker = RunningBroker(tmp_path / "data", shards=1, extra_args=[
        "--tls-port", "0", "--tls-certfile", str(cert), "--tls-keyfile", str(key)]).start()
    try:
        port = broker.tls_port
        names = {}
        with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
            names["wrong version number"] = plain.getsockname()[1]
            plain.sendall(b"AMQP\x00\x00\x09\x01")  # AMQP, not TLS
            assert plain.recv(100) == b""  # hung up on
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            names["tlsv1 alert unknown ca"] = raw.getsockname()[1]
            with pytest.raises(ssl.SSLCertVerificationError):  # does not trust our cert
                ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
        for reason, client_port in names.items():
            wait_until(lambda: re.search(
                rf"\[error\] <gateway(-\d+)?> Error on AMQP connection \(127\.0\.0\.1:"
                rf"{client_port} -> 127\.0\.0\.1:{port}\):\n", broker.log_text()) and re.search(
                rf"\[error\] <gateway(-\d+)?> TLS handshake failed: {re.escape(reason)}\n",
                broker.log_text()), message=broker.log_text()[-2000:])
        # a client that completes the handshake is served as before
        context = ssl.create_default_context(cafile=str(cert))
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, ssl_options=pika.SSLOptions(context, "localhost")))
        conn.channel().queue_declare("after-failed-handshakes")
        conn.close()
        assert "Traceback" not in broker.log_text()
    finally:
        broker.stop()


def readme_tls_commands() -> str:
    """The shell block of the README's TLS section, as a reader pastes it."""
    section = (ROOT / "README.md").read_text().split("\n### TLS\n", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_client_certificates_made_as_the_readme_says(tmp_path):
    subprocess.run(["sh", "-e", "-c", readme_tls_commands()], cwd=tmp_path, check=True,
                   capture_output=True)
    tls = tmp_path / "tls"
    stranger = tmp_path / "stranger"  # a client certificate no CA of the broker's signed
    stranger.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=stranger", "-keyout", str(stranger / "client.key"),
                    "-out", str(stranger / "client.pem")], check=True, capture_output=True)
    broker = RunningBroker(tmp_path / "data", extra_args=[
        "--tls-port", "0", "--tls-certfile", str(tls / "server.pem"),
        "--tls-keyfile", str(tls / "server.key"), "--tls-cafile", str(tls / "ca.pem"),
        "--tls-verify-peer"]).start()

    def connect(certificates: Path | None) -> pika.BlockingConnection:
        context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
        context.verify_flags |= ssl.VERIFY_X509_STRICT  # as Python 3.13 does by default
        if certificates is not None:
            context.load_cert_chain(certificates / "client.pem", certificates / "client.key")
        return pika.BlockingConnection(pika.ConnectionParameters(
            "localhost", broker.tls_port, ssl_options=pika.SSLOptions(context, "localhost"),
            connection_attempts=1, socket_timeout=5))

    try:
        conn = connect(tls)
        ch = conn.channel()
        ch.queue_declare("mutual-tls")
        ch.basic_publish("", "mutual-tls", b"both sides known")
        assert ch.basic_get("mutual-tls", auto_ack=True)[2] == b"both sides known"
        conn.close()
        for certificates in (None, stranger):  # --tls-verify-peer: no certificate, no entry
            with pytest.raises(pika.exceptions.AMQPConnectionError):
                connect(certificates).close()
        # each refusal is logged as the failed handshake it is, not as a client hang-up
        wait_until(lambda: broker.log_text().count("TLS handshake failed") >= 2, timeout=10)
        assert "unexpectedly closed TCP connection (vhost ''" not in broker.log_text()
    finally:
        broker.stop()


def test_log_dir_and_stats_interval_from_the_config_file(tmp_path):
    logs = tmp_path / "elsewhere"
    config = tmp_path / "warren.toml"
    config.write_text(f'log_dir = "{logs}"\nstats_interval = 0.1\n')
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--config", str(config)]).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        conn.channel().queue_declare("logged")
        conn.close()
        wait_until(lambda: (logs / "shard-0.jsonl").exists()
                   and '"queue":"logged"' in (logs / "shard-0.jsonl").read_text(), timeout=10)
    finally:
        broker.stop()
    assert not (tmp_path / "data" / "logs").exists()
