"""No user gets past its permissions by where its queues and exchanges send
messages, and none stalls the others with a regular expression (issue 56, points
3 and 4), against a real `warren serve` with a confirming publisher beside it."""

from __future__ import annotations

import threading
import time

import pika
import pika.exceptions
import pytest

from warren.gateway.broker.access import AccessControl
from warren.storage.metastore import MetaStore, PolicyDef, VHostDef

from ..support.broker import RunningBroker, wait_until
from .test_management_api import call

EVIL = "^(a+)+$"  # a backtracking engine takes seconds on 'a' * 26 + 'b', doubling per 'a'


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gateway_count):
    broker = RunningBroker(tmp_path_factory.mktemp("escalation") / "data", shards=2,
                           management=True).start()
    for method, path, body in [
            ("PUT", "/api/vhosts/va", {}),
            ("PUT", "/api/permissions/va/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
            ("PUT", "/api/users/mg", {"password": "pw", "tags": "management"}),
            ("PUT", "/api/permissions/va/mg", {"configure": "^mg-", "write": "^mg-",
                                               "read": "^mg-"}),
            ("PUT", "/api/users/nr", {"password": "pw", "tags": ""}),
            ("PUT", "/api/permissions/va/nr", {"configure": ".*", "write": ".*",
                                               "read": "^none$"}),
            ("PUT", "/api/users/pm", {"password": "pw", "tags": "policymaker"}),
            ("PUT", "/api/permissions/va/pm", {"configure": "^mg-", "write": "^mg-",
                                               "read": "^mg-"}),
            ("PUT", "/api/permissions/%2F/pm", {"configure": ".*", "write": ".*",
                                                "read": ".*"})]:
        status, answer = call(broker, method, path, body)
        assert status in (201, 204), (path, status, answer)
    admin = connect(broker, "guest", "guest", "va")
    channel = admin.channel()
    channel.exchange_declare("va-x", "fanout")
    channel.queue_declare("va-q")
    channel.queue_bind("va-q", "va-x")
    admin.close()
    yield broker
    broker.stop()
    assert "Traceback" not in broker.log_text()


def connect(broker, user: str, password: str, vhost: str = "/"):
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, vhost, pika.PlainCredentials(user, password),
        connection_attempts=1))


def refused(conn, action) -> tuple[int, str]:
    """The (code, text) a new channel of `conn` is closed with by `action`."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        action(conn.channel())
    return raised.value.reply_code, raised.value.reply_text


def va_q_messages(broker) -> int:
    admin = connect(broker, "guest", "guest", "va")
    try:
        return admin.channel().queue_declare("va-q", passive=True).method.message_count
    finally:
        admin.close()


# -- point 3: dead-letter and alternate exchanges ------------------------------------------


def test_a_queue_or_exchange_cannot_send_messages_where_its_user_may_not_publish(broker):
    """RabbitMQ 3.10.8 answers each of these with the same code and text."""
    conn = connect(broker, "mg", "pw", "va")
    try:
        va_x = "ACCESS_REFUSED - access to exchange 'va-x' in vhost 'va' refused for user 'mg'"
        assert refused(conn, lambda ch: ch.basic_publish("va-x", "", b"x") or
                       ch.queue_declare("mg-own")) == (403, va_x)
        assert refused(conn, lambda ch: ch.queue_declare("mg-dl", arguments={
            "x-dead-letter-exchange": "va-x", "x-message-ttl": 0})) == (403, va_x)
        # checked before the other arguments, as in RabbitMQ
        assert refused(conn, lambda ch: ch.queue_declare("mg-dl", arguments={
            "x-dead-letter-exchange": "va-x", "x-max-length": -1})) == (403, va_x)
        assert refused(conn, lambda ch: ch.exchange_declare("mg-ae", "direct", arguments={
            "alternate-exchange": "va-x"})) == (403, va_x)
        assert refused(conn, lambda ch: ch.queue_declare("mg-dl0", arguments={
            "x-dead-letter-exchange": ""})) == (403, "ACCESS_REFUSED - access to exchange "
                                                     "'amq.default' in vhost 'va' refused for "
                                                     "user 'mg'")
        assert refused(conn, lambda ch: ch.queue_declare("mg-dl1", arguments={
            "x-dead-letter-exchange": 5})) == (406, "PRECONDITION_FAILED - invalid type "
                                                    "'signedint' for arg 'x-dead-letter-exchange' "
                                                    "in queue 'mg-dl1' in vhost 'va'")
        channel = conn.channel()  # its own exchanges it may name
        channel.exchange_declare("mg-x", "fanout")
        channel.queue_declare("mg-dl", arguments={"x-dead-letter-exchange": "mg-x",
                                                  "x-message-ttl": 0})
        channel.exchange_declare("mg-ae", "direct", arguments={"alternate-exchange": "mg-x"})
        channel.basic_publish("mg-ae", "nowhere", b"to mg-x")
        channel.basic_publish("", "mg-dl", b"dies at once")
    finally:
        conn.close()
    reader = connect(broker, "nr", "pw", "va")
    try:  # the queue's own read permission too: its messages leave it by dead-lettering
        assert refused(reader, lambda ch: ch.queue_declare("nr-dl", arguments={
            "x-dead-letter-exchange": "va-x"})) == (
            403, "ACCESS_REFUSED - access to queue 'nr-dl' in vhost 'va' refused for user 'nr'")
        assert refused(reader, lambda ch: ch.exchange_declare("nr-ae", "direct", arguments={
            "alternate-exchange": "va-x"})) == (
            403, "ACCESS_REFUSED - access to exchange 'nr-ae' in vhost 'va' refused for user "
                 "'nr'")
    finally:
        reader.close()
    assert va_q_messages(broker) == 0


def test_the_api_refuses_them_as_rabbitmq_does(broker):
    mg = {"user": "mg", "password": "pw"}
    for path, body in [
            ("/api/queues/va/mg-h1", {"arguments": {"x-dead-letter-exchange": "va-x"}}),
            ("/api/exchanges/va/mg-h2", {"type": "direct",
                                         "arguments": {"alternate-exchange": "va-x"}})]:
        assert call(broker, "PUT", path, body, **mg) == (
            401, {"error": "not_authorised", "reason": "Access refused."})
    assert call(broker, "PUT", "/api/queues/va/mg-h1",
                {"arguments": {"x-dead-letter-exchange": "mg-x"}}, **mg)[0] == 201
    assert call(broker, "GET", "/api/queues/va/mg-h1")[0] == 200
    assert call(broker, "GET", "/api/exchanges/va/mg-h2")[0] == 404


def test_a_policymaker_cannot_send_messages_where_it_may_not_publish(broker):
    """RabbitMQ lets it; Warren asks of a policy's dead-letter and alternate
    exchanges what it asks of a declaration's."""
    pm = {"user": "pm", "password": "pw"}
    for key in ("dead-letter-exchange", "alternate-exchange"):
        assert call(broker, "PUT", "/api/policies/va/mg-route", {
            "pattern": "^mg-", "definition": {key: "va-x"}}, **pm) == (
            401, {"error": "not_authorised", "reason": "access to exchange 'va-x' in vhost "
                                                       "'va' refused for user 'pm'"})
    assert call(broker, "GET", "/api/policies/va/mg-route")[0] == 404
    assert call(broker, "PUT", "/api/policies/va/mg-route", {
        "pattern": "^mg-", "definition": {"dead-letter-exchange": "mg-x"}}, **pm)[0] == 201
    assert call(broker, "PUT", "/api/policies/va/va-route", {  # an administrator may
        "pattern": "^va-", "definition": {"alternate-exchange": "va-x"}})[0] == 201
    for path in ("/api/policies/va/mg-route", "/api/policies/va/va-route"):
        assert call(broker, "DELETE", path)[0] == 204


# -- point 4: regular expressions --------------------------------------------------------


class Canary:
    """A confirming publisher beside an attack: the longest wait for a confirm."""

    def __init__(self, broker):
        self.conn = connect(broker, "guest", "guest")
        self.channel = self.conn.channel()
        self.channel.queue_declare("canary", arguments={"x-max-length": 1000})
        self.channel.confirm_delivery()
        self.worst = 0.0
        self.confirmed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: self.confirmed > 10, message="(the canary confirms)")

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.channel.basic_publish("", "canary", b"tweet")
            self.worst = max(self.worst, time.monotonic() - started)
            self.confirmed += 1

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()
        return self.worst


def timed(action):
    started = time.monotonic()
    result = action()
    return result, time.monotonic() - started


def test_a_catastrophic_pattern_stalls_nobody(broker):
    """The issue's attack: a policymaker's `^(a+)+$`, a queue named 'a'*26+'b'
    (7.9 s, everyone stalled 7.8 s), the PUT of the policy over such names (27.8 s),
    a monitor's listing with that regex (31 s). RabbitMQ: 0.2-0.26 s."""
    canary = Canary(broker)
    try:
        conn = connect(broker, "pm", "pw")
        names = ["a" * n + "b" for n in (26, 27, 28)]
        for name in names:
            _, took = timed(lambda: conn.channel().queue_declare(name, auto_delete=True))
            assert took < 1.0
        pm = {"user": "pm", "password": "pw"}
        (status, _), took = timed(lambda: call(broker, "PUT", "/api/policies/%2F/evil", {
            "pattern": EVIL, "definition": {"max-length": 5}, "apply-to": "queues"}, **pm))
        assert status == 201 and took < 1.0
        _, took = timed(lambda: conn.channel().queue_declare("a" * 29 + "b", auto_delete=True))
        assert took < 1.0
        (status, listed), took = timed(lambda: call(
            broker, "GET", f"/api/queues/%2F?name={EVIL}&use_regex=true&columns=name"))
        assert (status, listed) == (200, []) and took < 1.0
        conn.channel().queue_declare("aaaa", auto_delete=True)
        assert call(broker, "GET", "/api/queues/%2F/aaaa")[1]["policy"] == "evil"
        assert call(broker, "GET", "/api/queues/%2F/" + names[0])[1]["policy"] is None
        conn.close()
    finally:
        assert canary.stop() < 1.0
    assert call(broker, "DELETE", "/api/policies/%2F/evil")[0] == 204


def test_patterns_RE2_cannot_run_are_refused_where_they_are_set(broker):
    """RabbitMQ's PCRE takes lookaround and backreferences; RE2 cannot run them in
    linear time, so they are refused with its reason, never stored to match nothing."""
    status, answer = call(broker, "PUT", "/api/policies/%2F/look",
                          {"pattern": "(?=a)b", "definition": {"max-length": 1}})
    assert status == 400 and answer["reason"].startswith("invalid pattern '(?=a)b': ")
    status, answer = call(broker, "PUT", "/api/permissions/va/nr",
                          {"configure": "(a)\\1", "write": ".*", "read": ".*"})
    assert status == 400 and "invalid regular expression '(a)\\1'" in answer["reason"]
    assert call(broker, "GET", "/api/permissions/va/nr")[1]["configure"] == ".*"
    status, answer = call(broker, "POST", "/api/definitions", {"permissions": [
        {"user": "nr", "vhost": "va", "configure": ".*", "write": "(?!x)", "read": ".*"}]})
    assert status == 400 and answer["problems"] == [
        "permissions[0].write: invalid regular expression '(?!x)': invalid perl operator: (?!"]
    status, answer = call(broker, "GET", "/api/queues?name=(a&use_regex=true")
    assert status == 400 and answer["reason"] == "invalid regular expression '(a': missing ): (a"


def test_patterns_stored_before_RE2_that_it_cannot_run_are_named_at_start(tmp_path):
    """A data directory from before may hold lookaround or backreferences: they
    match nothing now, and the log says which."""
    data = tmp_path / "data"
    data.mkdir()
    meta = MetaStore(str(data / "meta"))
    try:
        meta.put_vhost(VHostDef("/", "", {}))
        access = AccessControl(meta)
        access.put_user("guest", "guest", ["administrator"])
        access.set_permissions("guest", "/", ".*", ".*", ".*")
        access.put_user("old", "pw", [])
        access.set_permissions("old", "/", "(?!secret)", ".*", ".*")
        meta.put_policy(PolicyDef("/", "lookbehind", "(?<=a)b", "all", 0, {"max-length": 1}))
    finally:
        meta.close()
    broker = RunningBroker(data, shards=1).start()
    try:
        conn = connect(broker, "old", "pw")
        assert refused(conn, lambda ch: ch.queue_declare("public"))[0] == 403
        conn.close()
        log = broker.log_text()
        assert ("policy 'lookbehind' in vhost '/' applies to nothing: its pattern '(?<=a)b' "
                "cannot be matched in linear time (invalid perl operator: (?<=); set it again"
                in log)
        assert ("the configure permission of user 'old' in vhost '/' grants nothing: its "
                "pattern '(?!secret)' cannot be matched in linear time (invalid perl operator: "
                "(?!); set it again" in log)
    finally:
        broker.stop()
