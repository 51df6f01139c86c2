"""How a connection and its channels begin and end, as RabbitMQ does it and
logs it: the handshake (protocol header, start/start-ok with the login at the
broker's login throttle, tune/tune-ok, open with admission by gateway 0) and its
errors and timeout; channel.open and a closing channel's frames; connection.close
either way, close-ok, linger, and the heartbeats that end a silent client.

Functions of the sans-IO connection (session/connection.py) they are given:
they read and set its state, send through it and ask its clock for timers. The
per-frame work stays in the connection.
"""

from __future__ import annotations

import logging
import platform
from functools import partial
from typing import Callable

from warren.shards import records as r

from .. import __version__
from ..amqp import frames, spec
from ..amqp import methods as m
from ..amqp.fieldtable import FieldTableError, decode_table
from ..errors import AMQPError
from ..logthrottle import log_client_error
from .assembly import decode_method
from .channel import Channel

log = logging.getLogger("warren.connection")

# The connection's states: the handshake's steps, then open, closing, closed.
AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(7)
# RabbitMQ's names of them, in its log lines
STATE_NAMES = ("pre_init", "starting", "tuning", "opening", "running", "closing", "closed")

HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 3.0
# An error before tune-ok closes the socket this long after, without a word to
# the client, as RabbitMQ (its SILENT_CLOSE_DELAY): a client not yet trusted
# learns nothing and cannot retry at once.
HANDSHAKE_ERROR_DELAY = 3.0
CHANNEL_MIN = 1  # the least channel_max a client may ask for (RabbitMQ's)
ADMIT = "admit"  # another gateway waits for gateway 0 to count this connection or channel
LOGIN = "login"  # its credentials wait for their turn at the broker's login throttle
RELEASING = "releasing"  # connection.close waits for the shards to release its channels
Login = tuple[str | None, str | None, str, str]  # name, password, peer host, mechanism

CAPABILITIES = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "exchange_exchange_bindings": True,
    "direct_reply_to": True,
}


def read_protocol_header(conn) -> bool:
    """The client's protocol header, answered with connection.start; False while
    it is not all in, or when it is not AMQP 0-9-1's (then the connection ends)."""
    header = conn.reader.read_protocol_header()
    if header is None:
        return False
    if header != frames.PROTOCOL_HEADER:
        # Tell the client which protocol we speak, then hang up (AMQP 0-9-1 §4.2.2).
        log_client_error(conn.clock, "protocol header", logging.ERROR,
                         "closing AMQP connection (%s):\nclient did not start with AMQP "
                         "protocol header: %r", conn.name, header, extra=conn.log_fields())
        conn.end_logged = True
        conn.output.write(frames.PROTOCOL_HEADER)
        conn.state = CLOSED
        conn.output.close()
        return False
    conn.state = AWAIT_START_OK
    conn.method(0, m.ConnectionStart(
        version_major=spec.SPEC["major-version"], version_minor=spec.SPEC["minor-version"],
        server_properties={
            "product": "Warren",
            "version": __version__,
            "platform": f"Python {platform.python_version()}",
            "copyright": "Warren developers",
            "information": "AMQP 0-9-1 broker; see README.md",
            "capabilities": dict(CAPABILITIES),
        },
        mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"))
    return True


def connection_method(conn, method) -> None:
    """A method on channel 0."""
    kind = type(method)
    expected = {AWAIT_START_OK: m.ConnectionStartOk, AWAIT_TUNE_OK: m.ConnectionTuneOk,
                AWAIT_OPEN: m.ConnectionOpen, OPEN: m.ConnectionUpdateSecret}.get(conn.state)
    if kind is not expected and kind is not m.ConnectionClose:
        # A second start-ok, an unasked close-ok, channel.open on channel 0...
        raise AMQPError(spec.CHANNEL_ERROR, "unexpected method in connection state "
                        f"{STATE_NAMES[conn.state]}", method.CLASS_ID, method.METHOD_ID)
    if kind is m.ConnectionStartOk:
        _start_ok(conn, method)
    elif kind is m.ConnectionTuneOk:
        _tune_ok(conn, method)
    elif kind is m.ConnectionOpen:
        _open(conn, method)
    elif kind is m.ConnectionClose:
        let_go(conn)
        after_releases(conn, partial(close_ok, conn))
    else:  # connection.update-secret
        conn.method(0, m.ConnectionUpdateSecretOk())


def _start_ok(conn, method: m.ConnectionStartOk) -> None:
    conn.client_properties = method.client_properties
    capabilities = method.client_properties.get("capabilities")
    conn.capabilities = capabilities if isinstance(capabilities, dict) else {}
    given = method.client_properties.get("connection_name")
    if isinstance(given, bytes):
        given = given.decode("utf-8", "replace")
    if isinstance(given, str) and given:
        log.info("connection (%s) has a client-provided name: %s", conn.name, given,
                 extra=conn.log_fields())
        conn.log_name = f"{conn.name} - {given}"
    name, password = _credentials(method.mechanism, method.response)
    peer_host = conn.peer[0] if isinstance(conn.peer, tuple) else ""
    login: Login = (name, password, peer_host, method.mechanism)
    access = conn.gateway.access
    if not access.must_wait(peer_host):  # the common case: no waiting, nobody asked
        _check_login(conn, *login, False, 0.0)
        return
    # An address that failed often: its logins are checked one at a time, each
    # at its turn, however many connections it opens.
    conn.hold(LOGIN)
    access.login_turn(peer_host, lambda wait: _login_turn(conn, wait, login))


def _login_turn(conn, wait: float | None, login: Login, waited: float = 0.0) -> None:
    if conn.state == CLOSED:
        return
    if wait is None:  # its turn is too far off: refused unchecked, as slowly
        conn.release(LOGIN)
        delay = conn.gateway.access.throttle.cap
        log.warning("%s login refused: user '%s' - too many failed logins (from %s, "
                    "answered in %gs)", login[3], login[0] or "", login[2], delay,
                    extra=conn.log_fields())
        conn.state = CLOSING
        _refuse_login(conn, login[3], delay)
    elif wait:
        conn.clock.call_later(wait, _login_turn, conn, 0.0, login, wait)
    else:
        conn.release(LOGIN)
        _check_login(conn, *login, True, waited)


def _check_login(conn, name, password, peer_host: str, mechanism: str, at_turn: bool,
                 waited: float) -> None:
    access = conn.gateway.access
    reason = access.refusal(name, password, peer_host)
    if reason is not None:
        conn.state = CLOSING  # what the client sends meanwhile is ignored
        access.login_failed(name, reason, peer_host, mechanism, at_turn, waited,
                            lambda delay: _refuse_login(conn, mechanism, delay))
        return
    conn.user = name
    conn.state = AWAIT_TUNE_OK
    conn.method(0, m.ConnectionTune(channel_max=conn.channel_max, frame_max=conn.frame_max,
                                    heartbeat=conn.heartbeat))


def _credentials(mechanism: str, response: bytes) -> tuple[str | None, str | None]:
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3:
            return None, None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    if mechanism == "AMQPLAIN":
        try:
            table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
        except FieldTableError:
            return None, None
        user, password = table.get("LOGIN"), table.get("PASSWORD")
        if isinstance(user, bytes):
            user = user.decode("utf-8", "replace")
        if isinstance(password, bytes):
            password = password.decode("utf-8", "replace")
        return user, password
    raise AMQPError(spec.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'")


def _refuse_login(conn, mechanism: str, delay: float) -> None:
    """Refuse, after `delay` seconds when the throttle asks for one; the loop
    serves everyone else meanwhile, and CLOSING ignores what this client sends."""
    if conn.state == CLOSED:
        return
    if delay:
        conn.state = CLOSING
        conn.timer = conn.clock.call_later(delay, _refuse_login, conn, mechanism, 0.0)
        return
    text = (f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}."
            " For details see the broker logfile.")
    if conn.capabilities.get("authentication_failure_close"):
        conn.send_closing(m.ConnectionClose(reply_code=spec.ACCESS_REFUSED, reply_text=text))
        conn.state = CLOSING
        conn.timer = conn.clock.call_later(CLOSE_OK_TIMEOUT, conn.shutdown)
    else:
        conn.shutdown()


def _tune_ok(conn, method: m.ConnectionTuneOk) -> None:
    _negotiated("frame_max", method.frame_max, spec.FRAME_MIN_SIZE, conn.frame_max)
    _negotiated("channel_max", method.channel_max, CHANNEL_MIN, conn.channel_max)
    conn.frame_max = method.frame_max
    conn.channel_max = method.channel_max
    conn.heartbeat = method.heartbeat
    conn.reader.frame_max = conn.frame_max
    conn.state = AWAIT_OPEN


def _open(conn, method: m.ConnectionOpen) -> None:
    name = method.virtual_host
    gateway = conn.gateway
    vhost = gateway.catalogue.vhosts.get(name)
    refuse = None
    if vhost is None:
        refuse = f"vhost {name} not found"
    elif not gateway.access.may_use_vhost(conn.user, name):
        refuse = f"access to vhost '{name}' refused for user '{conn.user}'"
    elif gateway.leader is not None:  # gateway 0 counts connections broker-wide
        conn.hold(ADMIT)
        gateway.leader.admit(conn, name, 0, lambda refusal: admission_answered(
            conn, refusal, method, lambda: _opened(conn, vhost)))
        return
    else:
        refuse = gateway.limit_refusal(conn.user, name)
    if refuse is not None:
        raise AMQPError(spec.NOT_ALLOWED, refuse, method.CLASS_ID, method.METHOD_ID)
    _opened(conn, vhost)


def _opened(conn, vhost) -> None:
    conn.vhost = vhost
    conn.state = OPEN
    if conn.timer is not None:
        conn.timer.cancel()
        conn.timer = None
    if conn.heartbeat:
        conn.timer = conn.clock.call_later(conn.heartbeat / 2, heartbeat_tick, conn)
    log.info("connection (%s): user '%s' authenticated and granted access to vhost '%s'",
             conn.log_name, conn.user, vhost.name, extra=conn.log_fields())
    conn.method(0, m.ConnectionOpenOk())


def handshake_timeout(conn) -> None:
    """HANDSHAKE_TIMEOUT after the connection was made: closed if not open by then."""
    if conn.state in (AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN):
        log_client_error(conn.clock, "handshake timeout", logging.ERROR,
                         "closing AMQP connection (%s):\nhandshake timeout in state %s",
                         conn.describe(), STATE_NAMES[conn.state], extra=conn.log_fields())
        conn.end_logged = True
        conn.shutdown()


def handshake_error(conn, error: AMQPError) -> None:
    """An error before tune-ok, as RabbitMQ: logged, no connection.close, input
    dropped, and the socket closed HANDSHAKE_ERROR_DELAY later."""
    if conn.state == AWAIT_TUNE_OK and error.code == spec.NOT_ALLOWED:
        detail = f"failed to negotiate connection parameters: {error.detail}"
    else:
        name = operation(error)
        detail = (f"{{handshake_error,{STATE_NAMES[conn.state]},0,{{amqp_error,"
                  f"{spec.REPLY_NAMES[error.code].lower()},{_erlang_string(error.detail)},"
                  f"{name if name == 'none' else repr(name.replace('-', '_'))}"
                  "}}")
    log_client_error(conn.clock, "handshake error", logging.ERROR,
                     "closing AMQP connection (%s):\n%s", conn.describe(), detail,
                     extra=conn.log_fields(reply_code=error.code))
    conn.end_logged = True
    conn.flush()  # what was sent before the error still goes out
    conn.state = CLOSED  # what it sends is dropped (buffer_updated)
    if conn.timer is not None:
        conn.timer.cancel()
    conn.timer = conn.clock.call_later(HANDSHAKE_ERROR_DELAY, conn.output.close)


def let_go(conn) -> None:
    """Release the channels (their unacked messages requeue, their consumers go)
    and the exclusive queues, and stop counting against the limits (gateway 0,
    told): before close-ok to the client's connection.close (RabbitMQ closes the
    channels first; a client reconnecting at once, through any gateway, finds its
    old connection gone), and again, with nothing left to do, when it ends."""
    for channel in list(conn.channels.values()):
        channel.release()
    conn.channels.clear()
    conn.gateway.delete_exclusive_queues(conn)


def admission_answered(conn, refusal: str, method, then) -> None:
    """Gateway 0 counted this connection or channel against the limits."""
    conn.release(ADMIT)
    if conn.state == CLOSED:
        return
    if refusal:
        conn.close_with_error(AMQPError(spec.NOT_ALLOWED, refusal, method.CLASS_ID,
                                        method.METHOD_ID))
        return
    try:
        then()
    except Exception as error:
        conn.fail(error)


def open_channel(conn, number: int, frame_type: int, payload: bytes) -> None:
    # As RabbitMQ: channel_max limits how many channels are open (closing ones
    # included), whatever their numbers; checked before the frame is looked at.
    if len(conn.channels) >= conn.channel_max:
        raise AMQPError(spec.NOT_ALLOWED, f"number of channels opened ({len(conn.channels)})"
                        f" has reached the negotiated channel_max ({conn.channel_max})")
    if frame_type != frames.FRAME_METHOD:
        raise AMQPError(spec.UNEXPECTED_FRAME,
                        "expected method frame, got non method frame instead")
    method = decode_method(payload)
    if type(method) is not m.ChannelOpen:
        raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'",
                        method.CLASS_ID, method.METHOD_ID)
    leader = conn.gateway.leader
    if leader is None:
        refusal = conn.gateway.limit_refusal(conn.user, conn.vhost.name, channel=True)
        if refusal is not None:
            raise AMQPError(spec.NOT_ALLOWED, refusal, method.CLASS_ID, method.METHOD_ID)
    elif conn.gateway.access.user_limit(conn.user, "max-channels") >= 0:
        conn.hold(ADMIT)  # gateway 0 counts the user's channels broker-wide
        return leader.admit(conn, conn.vhost.name, len(conn.channels) + 1,
                            lambda refusal: admission_answered(
                                conn, refusal, method, lambda: _add_channel(conn, number)))
    _add_channel(conn, number)


def _add_channel(conn, number: int) -> None:
    conn.channels[number] = Channel(conn, number)
    conn.method(number, m.ChannelOpenOk())
    if conn.gateway.leader is not None:
        conn.gateway.leader.channels_changed(conn)


def closing_channel_frame(conn, ch: Channel, frame_type: int, payload: bytes) -> None:
    """After our channel.close only the client's close-ok ends the channel, as on
    RabbitMQ: a crossing close gets close-ok and the channel waits on for the
    client's; anything else is dropped, but a channel.open is an error."""
    if frame_type != frames.FRAME_METHOD:
        return
    method = decode_method(payload)
    kind = type(method)
    if kind is m.ChannelCloseOk:
        conn.forget_channel(ch)
    elif kind is m.ChannelClose:
        ch.send(m.ChannelCloseOk())
    elif kind is m.ChannelOpen:
        raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen",
                        method.CLASS_ID, method.METHOD_ID)


def after_releases(conn, then: Callable[[], None]) -> None:
    """Call `then` once the shards have worked through the releases sent so far.
    With one gateway that is at once: a shard's one ring from it carries
    whatever the client sends next behind them. With several, the client's next
    connection may come in through another gateway, whose ring the shard may read
    first: a Sync behind the releases is answered when they are done (RabbitMQ's
    channels likewise wait for their queues before close-ok). Input waits."""
    gateway = conn.gateway
    alone = gateway.leader is None and gateway.followers is None
    links = [] if alone else [link for link in gateway.shards.links if link.alive]
    if not links:
        then()
        return
    conn.hold(RELEASING)
    left = len(links)

    def answered(reply: r.Reply) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            then()  # (close-ok's _linger reads on itself: it drops what follows)
            conn.release(RELEASING)

    for link in links:
        link.request(r.Sync, answered)


def close_ok(conn) -> None:
    if conn.state != CLOSED:  # (the client may have hung up meanwhile)
        conn.method(0, m.ConnectionCloseOk())
        linger(conn)


def while_closing(conn, frame_type: int, channel: int, payload: bytes) -> None:
    if channel != 0 or frame_type != frames.FRAME_METHOD:
        return
    method = decode_method(payload)
    if type(method) is m.ConnectionCloseOk:
        conn.shutdown()
    elif type(method) is m.ConnectionClose:
        conn.send_closing(m.ConnectionCloseOk())
        linger(conn)


def linger(conn) -> None:
    """After close-ok to the client's connection.close, read and drop what it
    still sends until it hangs up (or CLOSE_OK_TIMEOUT), as RabbitMQ does:
    closing with unread data would send the client a reset, not an end."""
    conn.flush()
    conn.state = CLOSED
    if conn.timer is not None:
        conn.timer.cancel()
    conn.timer = conn.clock.call_later(CLOSE_OK_TIMEOUT, conn.output.close)
    if conn.paused_by:
        conn.paused_by.clear()
        conn.output.resume_reading()


def heartbeat_tick(conn) -> None:
    """Every half heartbeat interval while open: a heartbeat out if nothing else
    went, and the end of a client that has sent nothing for two intervals."""
    if conn.state != OPEN:
        return
    # As RabbitMQ's heartbeat monitor, by the socket's counters: a tick (every half
    # interval) that sees nothing read since the last is a quiet one, and four in
    # a row are two missed intervals. While we are not reading, the peer's
    # heartbeats wait in the socket, unseen.
    if conn.recv_cnt != conn.reads_seen or conn.paused_by:
        conn.reads_seen = conn.recv_cnt
        conn.quiet_ticks = 0
    else:
        conn.quiet_ticks += 1
    if conn.quiet_ticks >= 4:
        log_client_error(conn.clock, "missed heartbeats", logging.ERROR,
                         "closing AMQP connection (%s):\nmissed heartbeats from client, "
                         "timeout: %ss", conn.describe(), conn.heartbeat,
                         extra=conn.log_fields())
        conn.end_logged = True
        conn.state = CLOSED
        conn.output.abort()
        return
    # An idle connection (most of them, when there are thousands) need not hold
    # a read buffer: it is allocated again by the next read.
    conn.reader.release()
    if conn.send_cnt == conn.writes_seen:  # nothing written for half an interval
        conn.send(frames.HEARTBEAT_FRAME)
    conn.writes_seen = conn.send_cnt  # (the heartbeat's own write counts next tick)
    conn.timer = conn.clock.call_later(conn.heartbeat / 2, heartbeat_tick, conn)


def log_error(conn, error: AMQPError) -> None:
    """A connection error in RabbitMQ's words: in the handshake its text alone,
    once running the operation and the exception's name."""
    if conn.state == OPEN:
        detail = (f" operation {operation(error)} caused a connection exception "
                  f"{spec.REPLY_NAMES[error.code].lower()}: \"{error.detail}\"")
    else:
        detail = error.detail
    log_client_error(conn.clock, f"connection error {error.code}", logging.ERROR,
                     "Error on AMQP connection (%s, state: %s):\n%s", conn.describe(),
                     STATE_NAMES[conn.state], detail,
                     extra=conn.log_fields(reply_code=error.code))


def log_end(conn) -> None:
    """Why the connection ended, unless that is logged already."""
    if not conn.received_any:  # a TCP health check, as RabbitMQ sees it
        log.debug("closing AMQP connection (%s): no data received", conn.name,
                  extra=conn.log_fields())
    elif conn.state not in (CLOSING, CLOSED):
        log_client_error(conn.clock, "unexpected close", logging.WARNING,
                         "closing AMQP connection (%s):\nclient unexpectedly closed TCP "
                         "connection", conn.describe(), extra=conn.log_fields())
    elif not conn.end_logged:
        log.info("closing AMQP connection (%s)", conn.describe(), extra=conn.log_fields())

def _negotiated(field: str, value: int, minimum: int, offered: int) -> None:
    """tune-ok's value of `field` within RabbitMQ's bounds: 0 means no limit, which
    is more than any limit offered."""
    if value and value < minimum:
        bound = f"is lower than the minimum allowed value ({minimum})"
    elif offered and (not value or value > offered):
        bound = f"is higher than the maximum allowed value ({offered})"
    else:
        return
    no_limit = " (no limit)" if field == "channel_max" and not value else ""
    raise AMQPError(spec.NOT_ALLOWED, f"negotiated {field} = {value}{no_limit} {bound}",
                    m.ConnectionTuneOk.CLASS_ID, m.ConnectionTuneOk.METHOD_ID)


def _erlang_string(text: str) -> str:
    """`text` as Erlang's ~p writes a string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def operation(error: AMQPError) -> str:
    """The method an error is about, as RabbitMQ names it ('queue.declare'), or 'none'."""
    method = spec.METHODS_BY_ID.get((error.class_id, error.method_id))
    return method.name if method is not None else "none"
