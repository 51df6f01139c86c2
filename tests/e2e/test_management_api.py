"""The management HTTP API against a real broker: RabbitMQ's JSON field names,
counts, authentication and tags, changes through PUT/DELETE, policies,
definitions and connection closing (metrics: test_metrics.py)."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from ..support.broker import ROOT, RunningBroker, wait_until


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    broker = RunningBroker(tmp_path_factory.mktemp("mgmt") / "data", shards=2,
                           management=True).start()
    yield broker
    broker.stop()


def call(broker, method: str, path: str, body=None, user: str = "guest",
         password: str = "guest"):
    """(status, decoded JSON or None) of an API call."""
    headers = {"Content-Type": "application/json"}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(
            f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(broker.http_url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
            return response.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as error:
        raw = error.read()
        return error.code, (json.loads(raw) if raw else None)


def get(broker, path: str):
    status, body = call(broker, "GET", path)
    assert status == 200, (path, status, body)
    return body


def connect(broker, **kwargs):
    return pika.BlockingConnection(pika.URLParameters(broker.url), **kwargs)


# RabbitMQ's field names each endpoint must carry (a subset of what RabbitMQ sends).
FIELDS = {
    "/api/overview": {"management_version", "rabbitmq_version", "node", "object_totals",
                      "queue_totals", "message_stats", "listeners", "cluster_name"},
    "/api/nodes": {"name", "type", "running", "mem_used", "mem_limit", "mem_alarm",
                   "disk_free", "disk_free_limit", "disk_free_alarm", "fd_used", "proc_used",
                   "uptime", "partitions"},
    "/api/vhosts": {"name", "description", "tags", "default_queue_type", "tracing"},
    "/api/users": {"name", "password_hash", "hashing_algorithm", "tags", "limits"},
    "/api/permissions": {"user", "vhost", "configure", "write", "read"},
    "/api/queues": {"name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type",
                    "node", "state", "messages", "messages_ready", "messages_unacknowledged",
                    "consumers", "policy", "effective_policy_definition", "message_stats"},
    "/api/exchanges": {"name", "vhost", "type", "durable", "auto_delete", "internal",
                       "arguments", "policy"},
    "/api/bindings": {"source", "vhost", "destination", "destination_type", "routing_key",
                      "arguments", "properties_key"},
    "/api/connections": {"name", "user", "vhost", "peer_host", "peer_port", "host", "port",
                         "channels", "state", "protocol", "client_properties", "connected_at",
                         "frame_max", "timeout", "ssl", "node"},
    "/api/channels": {"name", "number", "connection_details", "user", "vhost",
                      "consumer_count", "messages_unacknowledged", "prefetch_count",
                      "global_prefetch_count", "confirm", "transactional", "state"},
    "/api/consumers": {"consumer_tag", "queue", "channel_details", "ack_required",
                       "prefetch_count", "exclusive", "active", "activity_status", "arguments"},
    "/api/policies": {"vhost", "name", "pattern", "apply-to", "definition", "priority"},
}


def test_every_endpoint_has_rabbitmqs_fields(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    ch.queue_declare("fields-q", arguments={"x-max-length": 10})
    ch.queue_bind("fields-q", "amq.topic", "a.#")
    ch.basic_consume("fields-q", lambda *a: None)
    call(managed, "PUT", "/api/policies/%2F/fields-policy",
         {"pattern": "^nothing$", "definition": {"max-length": 1}})
    try:
        for path, fields in FIELDS.items():
            body = get(managed, path)
            rows = body if isinstance(body, list) else [body]
            assert rows, f"{path} listed nothing"
            for row in rows:
                assert fields <= set(row), (path, fields - set(row))
        overview = get(managed, "/api/overview")
        assert overview["object_totals"]["queues"] >= 1
        assert {"messages", "messages_ready", "messages_unacknowledged"} <= set(
            overview["queue_totals"])
    finally:
        call(managed, "DELETE", "/api/policies/%2F/fields-policy")
        conn.close()


def test_acks_reach_the_queue_without_more_traffic(managed):
    """A consumer far below its prefetch acks one message at a time; its acks may
    wait in the gateway for other work to the shard (SETTLE_DELAY), but with no
    other traffic they still arrive: the queue's unacked count falls to 0."""
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("lazily-acked")
    for n in range(10):
        ch.basic_publish("", "lazily-acked", b"%d" % n)
    ch.basic_qos(prefetch_count=100)
    got = []
    ch.basic_consume("lazily-acked", lambda c, m, p, b: got.append(m.delivery_tag))
    wait_until(lambda: (conn.process_data_events(0.02), len(got) == 10)[1])

    def unacked() -> int:
        return get(managed, "/api/queues/%2F/lazily-acked")["messages_unacknowledged"]

    wait_until(lambda: unacked() == 10)
    for tag in got:
        ch.basic_ack(tag)
    conn.process_data_events(0)
    wait_until(lambda: unacked() == 0, timeout=10)
    assert get(managed, "/api/queues/%2F/lazily-acked")["messages"] == 0
    conn.close()


def test_queue_counts_and_rates(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("counted")
    ch.confirm_delivery()
    for _ in range(7):
        ch.basic_publish("", "counted", b"x")
    tags = []
    ch.basic_qos(prefetch_count=2)
    ch.basic_consume("counted", lambda c, m, p, b: tags.append(m.delivery_tag))
    wait_until(lambda: (conn.process_data_events(0.02), len(tags) == 2)[1])

    def counted() -> dict:
        return get(managed, "/api/queues/%2F/counted")

    wait_until(lambda: counted()["messages_unacknowledged"] == 2)
    queue = counted()
    assert (queue["messages_ready"], queue["messages_unacknowledged"], queue["messages"],
            queue["consumers"]) == (5, 2, 7, 1)
    assert queue["message_stats"]["publish"] == 7
    assert queue["message_stats"]["deliver_get"] == 2
    consumers = [c for c in get(managed, "/api/consumers/%2F")
                 if c["queue"]["name"] == "counted"]
    assert len(consumers) == 1 and consumers[0]["prefetch_count"] == 2
    assert consumers[0]["ack_required"] is True
    conn.close()


def test_authentication_and_tags(managed):
    assert call(managed, "GET", "/api/overview", user=None)[0] == 401
    assert call(managed, "GET", "/api/overview", password="wrong")[0] == 401
    assert call(managed, "PUT", "/api/users/watcher",
                {"password": "pw", "tags": "monitoring"})[0] == 201
    assert call(managed, "PUT", "/api/users/plain", {"password": "pw", "tags": ""})[0] == 201
    try:
        assert call(managed, "GET", "/api/queues", user="watcher", password="pw")[0] == 200
        status, body = call(managed, "PUT", "/api/vhosts/nope", {}, user="watcher",
                            password="pw")
        assert status == 401 and body["error"] == "not_authorised"
        status, body = call(managed, "GET", "/api/overview", user="plain", password="pw")
        assert status == 401 and body["reason"] == "Not management user"
    finally:
        call(managed, "DELETE", "/api/users/watcher")
        call(managed, "DELETE", "/api/users/plain")


def test_status_lines_carry_their_own_reason_phrase(managed):
    def status_line(method: str, path: str, body=None, auth: bool = True) -> str:
        connection = http.client.HTTPConnection("127.0.0.1", managed.listener_port("http"),
                                                timeout=10)
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = "Basic " + base64.b64encode(b"guest:guest").decode()
        connection.request(method, path, json.dumps(body) if body is not None else None,
                           headers)
        response = connection.getresponse()
        response.read()
        connection.close()
        return f"{response.status} {response.reason}"

    assert status_line("GET", "/api/overview") == "200 OK"
    assert status_line("PUT", "/api/vhosts/phrases", {}) == "201 Created"
    assert status_line("DELETE", "/api/vhosts/phrases") == "204 No Content"
    assert status_line("PUT", "/api/policies/%2F/p", {"pattern": "("}) == "400 Bad Request"
    assert status_line("GET", "/api/overview", auth=False) == "401 Unauthorized"
    assert status_line("DELETE", "/api/exchanges/%2F/amq.direct") == "403 Forbidden"
    assert status_line("GET", "/api/queues/%2F/no-such-queue") == "404 Not Found"
    assert status_line("POST", "/api/vhosts/phrases", {}) == "405 Method Not Allowed"


def test_connected_at_is_when_the_connection_opened(managed):
    before = int(time.time() * 1000)
    conn = connect(managed)
    after = int(time.time() * 1000) + 1
    port = conn._impl._transport._sock.getsockname()[1]
    # the API is asked strictly later than the connection opened
    wait_until(lambda: int(time.time() * 1000) > after + 10)
    [row] = [c for c in get(managed, "/api/connections") if c["peer_port"] == port]
    assert before <= row["connected_at"] <= after
    conn.close()


def test_consumer_exclusive_is_what_the_client_asked(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("excl-consumed")
    ch.queue_declare("shared-consumed")
    ch.basic_consume("excl-consumed", lambda *a: None, exclusive=True, consumer_tag="alone")
    ch.basic_consume("shared-consumed", lambda *a: None, consumer_tag="together")
    rows = {c["consumer_tag"]: c for c in get(managed, "/api/consumers/%2F")}
    assert rows["alone"]["exclusive"] is True
    assert rows["together"]["exclusive"] is False
    conn.close()


def test_vhosts_users_permissions_round_trip(managed):
    assert call(managed, "PUT", "/api/vhosts/team", {"description": "the team"})[0] == 201
    assert call(managed, "PUT", "/api/users/alice", {"password": "s3cret",
                                                     "tags": ["management"]})[0] == 201
    assert call(managed, "PUT", "/api/permissions/team/alice",
                {"configure": "^alice-", "write": ".*", "read": ".*"})[0] == 201
    assert get(managed, "/api/vhosts/team")["description"] == "the team"
    assert get(managed, "/api/permissions/team/alice")["configure"] == "^alice-"
    # alice can now use the vhost, within her permissions
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", managed.port, "team", pika.PlainCredentials("alice", "s3cret")))
    ch = conn.channel()
    ch.queue_declare("alice-q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as raised:
        ch.queue_declare("bob-q")
    assert raised.value.reply_code == 403
    # deleting the vhost closes her connection
    assert call(managed, "DELETE", "/api/vhosts/team")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    assert closed.value.reply_code == 320
    assert call(managed, "GET", "/api/vhosts/team")[0] == 404
    assert call(managed, "DELETE", "/api/users/alice")[0] == 204
    assert call(managed, "GET", "/api/users/alice")[0] == 404


def test_queues_exchanges_bindings_through_the_api(managed):
    assert call(managed, "PUT", "/api/exchanges/%2F/api-x", {"type": "fanout"})[0] == 201
    assert call(managed, "PUT", "/api/queues/%2F/api-q", {"durable": True,
                                                         "arguments": {"x-max-length": 5}})[0] == 201
    status, body = call(managed, "PUT", "/api/queues/%2F/api-bad",
                        {"arguments": {"x-max-length": -1}})
    assert status == 400 and "invalid arg 'x-max-length'" in body["reason"]
    assert call(managed, "POST", "/api/bindings/%2F/e/api-x/q/api-q", {"routing_key": ""})[0] == 201
    bindings = get(managed, "/api/bindings/%2F")
    assert {"source": "api-x", "destination": "api-q", "destination_type": "queue"}.items() <= \
        next(b for b in bindings if b["source"] == "api-x").items()
    # the default exchange's implicit binding is listed, as in RabbitMQ
    assert any(b["source"] == "" and b["destination"] == "api-q" for b in bindings)
    conn = connect(managed)
    ch = conn.channel()
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("api-x", "", b"via api")
    wait_until(lambda: get(managed, "/api/queues/%2F/api-q")["messages_ready"] == 3)
    assert call(managed, "DELETE", "/api/queues/%2F/api-q/contents")[0] == 204
    wait_until(lambda: get(managed, "/api/queues/%2F/api-q")["messages_ready"] == 0)
    assert call(managed, "DELETE", "/api/queues/%2F/api-q")[0] == 204
    assert call(managed, "DELETE", "/api/exchanges/%2F/api-x")[0] == 204
    assert call(managed, "GET", "/api/queues/%2F/api-q")[0] == 404
    assert call(managed, "DELETE", "/api/exchanges/%2F/amq.direct")[0] == 403
    conn.close()


def test_policy_precedence_and_effect(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("pol-orders")
    ch.queue_declare("pol-other")
    try:
        assert call(managed, "PUT", "/api/policies/%2F/low",
                    {"pattern": "^pol-", "definition": {"max-length": 5}, "priority": 1,
                     "apply-to": "queues"})[0] == 201
        assert call(managed, "PUT", "/api/policies/%2F/high",
                    {"pattern": "^pol-orders$", "definition": {"max-length": 2}, "priority": 9,
                     "apply-to": "queues"})[0] == 201
        status, body = call(managed, "PUT", "/api/policies/%2F/bad",
                            {"pattern": ".*", "definition": {"colour": "blue"}})
        assert status == 400 and "colour" in body["reason"]
        assert get(managed, "/api/queues/%2F/pol-orders")["policy"] == "high"
        assert get(managed, "/api/queues/%2F/pol-other")["policy"] == "low"
        ch.confirm_delivery()
        for i in range(8):
            ch.basic_publish("", "pol-orders", b"%d" % i)
            ch.basic_publish("", "pol-other", b"%d" % i)
        wait_until(lambda: get(managed, "/api/queues/%2F/pol-orders")["messages_ready"] == 2)
        assert get(managed, "/api/queues/%2F/pol-other")["messages_ready"] == 5
        # the highest priority policy wins, even over an existing queue's lower one
        assert call(managed, "DELETE", "/api/policies/%2F/high")[0] == 204
        assert get(managed, "/api/queues/%2F/pol-orders")["policy"] == "low"
        # a queue argument lower than the policy's wins (limits: the lower one)
        ch.queue_declare("pol-own", arguments={"x-max-length": 1})
        for i in range(3):
            ch.basic_publish("", "pol-own", b"%d" % i)
        wait_until(lambda: get(managed, "/api/queues/%2F/pol-own")["messages_ready"] == 1)
    finally:
        call(managed, "DELETE", "/api/policies/%2F/low")
        call(managed, "DELETE", "/api/policies/%2F/high")
        conn.close()


def test_equal_priority_policies_go_to_the_name_sorting_first(managed):
    """RabbitMQ leaves this tie undefined; Warren's rule (README, Policies) holds
    whichever policy came first and however the names compare in length."""
    conn = connect(managed)
    conn.channel().queue_declare("tie-q")
    names = ["tie-long", "tie", "tie-a"]
    try:
        for name in names:
            assert call(managed, "PUT", f"/api/policies/%2F/{name}",
                        {"pattern": "^tie-q$", "definition": {"max-length": 5}, "priority": 3,
                         "apply-to": "queues"})[0] == 201
        assert get(managed, "/api/queues/%2F/tie-q")["policy"] == "tie"
        assert call(managed, "DELETE", "/api/policies/%2F/tie")[0] == 204
        assert get(managed, "/api/queues/%2F/tie-q")["policy"] == "tie-a"
    finally:
        for name in names:
            call(managed, "DELETE", f"/api/policies/%2F/{name}")
        conn.close()


def test_policy_sets_dead_letter_exchange_and_alternate_exchange(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("dlp-dead")
    ch.queue_declare("dlp-work")
    ch.exchange_declare("dlp-x", "direct")
    ch.queue_declare("dlp-unrouted")
    ch.exchange_declare("dlp-ae", "fanout")
    ch.queue_bind("dlp-unrouted", "dlp-ae")
    try:
        call(managed, "PUT", "/api/policies/%2F/dlx", {
            "pattern": "^dlp-work$", "apply-to": "queues",
            "definition": {"dead-letter-exchange": "", "dead-letter-routing-key": "dlp-dead",
                           "message-ttl": 10}})
        call(managed, "PUT", "/api/policies/%2F/ae", {
            "pattern": "^dlp-x$", "apply-to": "exchanges",
            "definition": {"alternate-exchange": "dlp-ae"}})
        ch.basic_publish("", "dlp-work", b"expires")
        ch.basic_publish("dlp-x", "nowhere", b"unroutable")
        wait_until(lambda: ch.queue_declare("dlp-dead", passive=True).method.message_count == 1)
        wait_until(lambda: ch.queue_declare("dlp-unrouted", passive=True
                                            ).method.message_count == 1)
    finally:
        call(managed, "DELETE", "/api/policies/%2F/dlx")
        call(managed, "DELETE", "/api/policies/%2F/ae")
        conn.close()


def test_definitions_round_trip_and_restart(tmp_path):
    broker = RunningBroker(tmp_path / "data", management=True).start()
    try:
        call(broker, "PUT", "/api/vhosts/defs", {})
        call(broker, "PUT", "/api/users/carol", {"password": "pw", "tags": ["monitoring"]})
        call(broker, "PUT", "/api/permissions/defs/carol",
             {"configure": ".*", "write": ".*", "read": ".*"})
        call(broker, "PUT", "/api/exchanges/defs/orders", {"type": "topic", "durable": True})
        call(broker, "PUT", "/api/queues/defs/eu", {"durable": True,
                                                     "arguments": {"x-message-ttl": 60000}})
        call(broker, "POST", "/api/bindings/defs/e/orders/q/eu", {"routing_key": "eu.#"})
        call(broker, "PUT", "/api/policies/defs/cap",
             {"pattern": "^eu$", "definition": {"max-length": 100}, "apply-to": "queues"})
        exported = get(broker, "/api/definitions")
        assert {"users", "vhosts", "permissions", "policies", "queues", "exchanges",
                "bindings", "rabbit_version"} <= set(exported)
        assert any(u["name"] == "carol" for u in exported["users"])
        # delete everything, import, export again: the same definitions
        call(broker, "DELETE", "/api/vhosts/defs")
        call(broker, "DELETE", "/api/users/carol")
        assert call(broker, "POST", "/api/definitions", exported)[0] == 204
        again = get(broker, "/api/definitions")
        for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges",
                    "bindings"):
            assert again[key] == exported[key], key
    finally:
        broker.stop()
    broker.start()  # durable definitions survive a restart
    try:
        after = get(broker, "/api/definitions")
        for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges",
                    "bindings"):
            assert after[key] == exported[key], key
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, "defs", pika.PlainCredentials("carol", "pw")))
        conn.close()  # the imported password hash works
    finally:
        broker.stop()


BAD_DEFINITIONS = {
    "rabbit_version": "3.10.8",
    "colour": "blue",
    "vhosts": [{"name": "defs-bad"}],
    "users": [{"password_hash": "", "tags": ["monitoring"]},
              {"name": "defs-user", "password_hash": "", "tags": "monitoring",
               "hashing_algorithm": "rabbit_password_hashing_md5"}],
    "permissions": [{"user": "nobody", "vhost": "defs-bad", "configure": ".*", "write": ".*",
                     "read": ".*"}],
    "policies": [{"vhost": "defs-bad", "name": "p", "pattern": ".*", "apply-to": "queues",
                  "definition": {"colour": 1}, "priority": 0}],
    "exchanges": [{"name": "x", "vhost": "defs-bad", "type": "fancy", "durable": True,
                   "auto_delete": False, "internal": False, "arguments": {}}],
    "queues": [{"name": "fine", "vhost": "defs-bad", "durable": True, "auto_delete": False,
                "arguments": {}},
               {"name": "q1", "vhost": "defs-bad", "durable": "yes", "arguments": "none"},
               {"name": "q2", "vhost": "defs-bad", "exclusive": True},
               {"name": "q3", "vhost": "defs-bad", "arguments": {"x-max-length": -1}},
               {"name": "q4", "vhost": "nowhere"}],
    "bindings": [{"source": "missing", "vhost": "defs-bad", "destination": "fine",
                  "destination_type": "queue", "routing_key": "", "arguments": {}},
                 {"source": "x", "vhost": "defs-bad", "destination": "gone",
                  "destination_type": "queue", "routing_key": 5, "arguments": {}}],
    "global_parameters": "none",
}
BAD_DEFINITIONS_PROBLEMS = [
    "colour: unknown key",
    "global_parameters: expected an array",
    "users[0].name: missing",
    "queues[1].durable: expected `bool`, got `str`",
    "queues[1].arguments: expected `object`, got `str`",
    "queues[2].exclusive: unknown key",
    "bindings[1].routing_key: expected `str`, got `int`",
    "queues[4].vhost: no vhost 'nowhere'",
    "users[1].hashing_algorithm: rabbit_password_hashing_md5 is not supported "
    "(only rabbit_password_hashing_sha256)",
    "permissions[0].user: no user 'nobody'",
    "policies[0].definition.colour: policy key 'colour' is not supported (policy 'p' in "
    "vhost 'defs-bad')",
    "exchanges[0]: COMMAND_INVALID - unknown exchange type 'fancy'",
    "queues[3]: PRECONDITION_FAILED - invalid arg 'x-max-length' for queue 'q3' in vhost "
    "'defs-bad': "
    "{value_negative,-1}",
    "bindings[0].source: no exchange 'missing' in vhost 'defs-bad'",
]


def test_definitions_import_reports_every_problem_and_changes_nothing(managed):
    status, body = call(managed, "POST", "/api/definitions", BAD_DEFINITIONS)
    assert status == 400 and body["error"] == "bad_request"
    assert sorted(body["problems"]) == sorted(BAD_DEFINITIONS_PROBLEMS)
    assert call(managed, "GET", "/api/vhosts/defs-bad")[0] == 404
    assert "defs-user" not in [u["name"] for u in get(managed, "/api/users")]
    # the same document without its problems imports
    good = copy.deepcopy({"vhosts": BAD_DEFINITIONS["vhosts"],  # BAD_DEFINITIONS stays as is
                          "users": BAD_DEFINITIONS["users"][1:],
                          "queues": BAD_DEFINITIONS["queues"][:1]})
    good["users"][0]["hashing_algorithm"] = "rabbit_password_hashing_sha256"
    try:
        assert call(managed, "POST", "/api/definitions", good)[0] == 204
        assert get(managed, "/api/queues/defs-bad/fine")["durable"] is True
        assert get(managed, "/api/users/defs-user")["tags"] == ["monitoring"]
    finally:
        call(managed, "DELETE", "/api/vhosts/defs-bad")
        call(managed, "DELETE", "/api/users/defs-user")


def test_an_export_leaves_out_the_bindings_of_transient_queues_so_it_imports(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("transient-q", durable=False)
    ch.exchange_declare("export-x", "direct", durable=True)
    ch.queue_bind("transient-q", "export-x", "k")
    ch.queue_bind("transient-q", "amq.direct", "k")
    try:
        exported = get(managed, "/api/definitions")
        assert "transient-q" not in json.dumps(exported)
        assert call(managed, "POST", "/api/definitions", exported) == (204, None)
    finally:
        conn.close()
        call(managed, "DELETE", "/api/exchanges/%2F/export-x")


def test_definitions_import_takes_rabbitmqs_exports(managed):
    """Exports as RabbitMQ 3.10 (management plugin) and 4.x (rabbit_definitions)
    write them: their informative keys and the sections Warren has no use for."""
    rabbitmq_310 = {
        "rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8", "product_name": "RabbitMQ",
        "product_version": "3.10.8",
        "users": [{"name": "defs-310", "password_hash": "", "tags": ["monitoring"],
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "limits": {}}],
        "vhosts": [{"name": "defs-310"}],
        "permissions": [{"user": "defs-310", "vhost": "defs-310", "configure": ".*",
                         "write": ".*", "read": ".*"}],
        "topic_permissions": [], "parameters": [],
        "global_parameters": [{"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}],
        "policies": [],
        "queues": [{"name": "q", "vhost": "defs-310", "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "exchanges": [{"name": "x", "vhost": "defs-310", "type": "fanout", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "bindings": [{"source": "x", "vhost": "defs-310", "destination": "q",
                      "destination_type": "queue", "routing_key": "", "arguments": {}}],
    }
    rabbitmq_4 = {
        "rabbitmq_version": "4.1.0", "rabbitmq_definition_format": "cluster",
        "original_cluster_name": "rabbit@host",
        "explanation": "Definitions of cluster 'rabbit@host'",
        "vhosts": [{"name": "defs-4", "limits": [],
                    "metadata": {"description": "four", "tags": [],
                                 "default_queue_type": "classic"}}],
        "queues": [{"name": "qq", "vhost": "defs-4", "type": "quorum", "durable": True,
                    "auto_delete": False, "arguments": {}}],
        "exchanges": [{"name": "x", "vhost": "defs-4", "type": "topic", "durable": True,
                       "auto_delete": False, "arguments": {}}],
    }
    try:
        for document in (rabbitmq_310, rabbitmq_4):
            status, body = call(managed, "POST", "/api/definitions", document)
            assert status == 204, body
        bindings = get(managed, "/api/bindings/defs-310")
        assert any(b["source"] == "x" and b["destination"] == "q" for b in bindings)
        assert get(managed, "/api/queues/defs-4/qq")["type"] == "quorum"
        assert get(managed, "/api/vhosts/defs-4")["description"] == "four"
    finally:
        call(managed, "DELETE", "/api/vhosts/defs-310")
        call(managed, "DELETE", "/api/vhosts/defs-4")
        call(managed, "DELETE", "/api/users/defs-310")


def test_deleting_a_connection_closes_it_with_320(managed):
    conn = connect(managed)
    conn.channel()
    [row] = [c for c in get(managed, "/api/connections")
             if c["peer_port"] == conn._impl._transport._sock.getsockname()[1]]
    headers_reason = "maintenance window"
    request = urllib.request.Request(
        managed.http_url + "/api/connections/" + quote(row["name"], safe=""), method="DELETE",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "X-Reason": headers_reason})
    assert urllib.request.urlopen(request, timeout=10).status == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    assert raised.value.reply_code == 320
    assert raised.value.reply_text == ("CONNECTION_FORCED - broker forced connection closure "
                                       f"with reason '{headers_reason}'")


def test_management_port_zero_turns_it_off(tmp_path):
    broker = RunningBroker(tmp_path / "data").start()
    try:
        with pytest.raises(RuntimeError):
            broker.listener_port("http", timeout=1.0)
    finally:
        broker.stop()


def test_consumer_timeout_status_and_effective_timeout(managed):
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("timed-qq", durable=True, arguments={"x-queue-type": "quorum",
                                                          "x-consumer-timeout": 400})
    tags, cancelled = [], []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame))
    ch.basic_consume("timed-qq", lambda c, m, p, b: tags.append(m.delivery_tag),
                     consumer_tag="slow-worker")
    ch.basic_consume("timed-qq", lambda *a: None, consumer_tag="quick-worker",
                     arguments={"x-consumer-timeout": 60000})

    def listed() -> dict:
        return {c["consumer_tag"]: c for c in get(managed, "/api/consumers/%2F")
                if c["queue"]["name"] == "timed-qq"}

    assert listed()["slow-worker"]["consumer_timeout"] == 400
    assert listed()["quick-worker"]["consumer_timeout"] == 60000
    assert listed()["slow-worker"]["activity_status"] == "up"
    ch.basic_publish("", "timed-qq", b"held")
    wait_until(lambda: (conn.process_data_events(0.02), cancelled)[1], timeout=5)
    # quick-worker may hold the redelivered copy now; slow-worker is listed as timed out
    slow = listed()["slow-worker"]
    assert (slow["activity_status"], slow["active"]) == ("timed_out", False)
    listing = subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "--url",
                              managed.http_url, "list", "consumers"], capture_output=True,
                             text=True, timeout=30, cwd=ROOT).stdout
    ctl_rows = [line for line in listing.splitlines() if "slow-worker" in line]
    assert ctl_rows and "timed_out" in ctl_rows[0] and "400" in ctl_rows[0]
    ch.basic_ack(tags[0])  # settling the timed-out delivery ends its listing
    wait_until(lambda: "slow-worker" not in listed())
    conn.close()


def test_consumer_timeout_policy_level_of_the_precedence(managed):
    """min(queue argument, consumer-timeout policy) decides when the consumer sets
    none; the global value (30 min here) only when neither is set."""
    conn = connect(managed)
    ch = conn.channel()
    ch.queue_declare("prec-arg", durable=True, arguments={"x-queue-type": "quorum",
                                                          "x-consumer-timeout": 900})
    ch.queue_declare("prec-none", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare("prec-classic", durable=True)

    def timeouts() -> dict:
        return {c["consumer_tag"]: c["consumer_timeout"] for c in get(managed, "/api/consumers")
                if c["queue"]["name"].startswith("prec-")}

    try:
        for tag in ("a1", "n1", "c1"):
            queue = {"a": "prec-arg", "n": "prec-none", "c": "prec-classic"}[tag[0]]
            ch.basic_consume(queue, lambda *a: None, consumer_tag=tag)
        assert timeouts() == {"a1": 900, "n1": 1_800_000, "c1": None}  # classic: none
        assert call(managed, "PUT", "/api/policies/%2F/ct", {
            "pattern": "^prec-", "definition": {"consumer-timeout": 500},
            "apply-to": "quorum_queues"})[0] == 201
        for tag in ("a2", "n2"):
            ch.basic_consume("prec-arg" if tag[0] == "a" else "prec-none", lambda *a: None,
                             consumer_tag=tag)
        ch.basic_consume("prec-none", lambda *a: None, consumer_tag="own",
                         arguments={"x-consumer-timeout": 7000})
        found = timeouts()
        assert (found["a2"], found["n2"], found["own"]) == (500, 500, 7000)
        call(managed, "PUT", "/api/policies/%2F/ct", {
            "pattern": "^prec-", "definition": {"consumer-timeout": 2000},
            "apply-to": "quorum_queues"})
        ch.basic_consume("prec-arg", lambda *a: None, consumer_tag="a3")
        ch.basic_consume("prec-none", lambda *a: None, consumer_tag="n3")
        found = timeouts()
        assert (found["a3"], found["n3"]) == (900, 2000)  # the lower of argument and policy
    finally:
        call(managed, "DELETE", "/api/policies/%2F/ct")
        conn.close()


def test_vhost_and_user_limits_and_binding_deletion_as_rabbitmq_has_them(managed):
    assert call(managed, "PUT", "/api/vhosts/lim-v", {})[0] == 201
    try:
        assert call(managed, "PUT", "/api/vhost-limits/lim-v/max-queues", {"value": 5})[0] == 204
        assert get(managed, "/api/vhost-limits/lim-v") == [
            {"vhost": "lim-v", "value": {"max-queues": 5}}]
        assert {"vhost": "lim-v", "value": {"max-queues": 5}} in get(managed,
                                                                     "/api/vhost-limits")
        assert get(managed, "/api/vhosts/lim-v")["limits"] == {"max-queues": 5}
        status, body = call(managed, "PUT", "/api/vhost-limits/lim-v/max-bogus", {"value": 1})
        assert status == 400 and "unrecognised limit(s) 'max-bogus'" in body["reason"]
        status, body = call(managed, "PUT", "/api/vhost-limits/lim-v/max-queues",
                            {"value": "x"})
        assert status == 400 and body["reason"] == "max-queues should be an integer, got 'x'"
        assert call(managed, "PUT", "/api/vhost-limits/nowhere/max-queues", {"value": 1}) == (
            404, {"error": "not_found", "reason": "vhost_not_found"})
        assert call(managed, "DELETE", "/api/vhost-limits/lim-v/max-queues")[0] == 204
        assert get(managed, "/api/vhost-limits/lim-v") == []
        assert call(managed, "PUT", "/api/user-limits/guest/max-channels", {"value": 50})[0] == 204
        assert get(managed, "/api/user-limits/guest") == [
            {"user": "guest", "value": {"max-channels": 50}}]
        assert call(managed, "DELETE", "/api/user-limits/guest/max-channels")[0] == 204
        assert get(managed, "/api/user-limits") == []
        # a binding goes by its properties_key, as RabbitMQ's DELETE takes it
        assert call(managed, "PUT", "/api/permissions/lim-v/guest",
                    {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
        assert call(managed, "PUT", "/api/exchanges/lim-v/x", {"type": "direct"})[0] == 201
        assert call(managed, "PUT", "/api/queues/lim-v/q", {})[0] == 201
        assert call(managed, "POST", "/api/bindings/lim-v/e/x/q/q",
                    {"routing_key": "k", "arguments": {"a": 1}})[0] == 201
        [binding] = [b for b in get(managed, "/api/bindings/lim-v") if b["source"] == "x"]
        path = f"/api/bindings/lim-v/e/x/q/q/{quote(binding['properties_key'], safe='')}"
        assert call(managed, "DELETE", path)[0] == 204
        assert call(managed, "DELETE", path)[0] == 404
        assert not [b for b in get(managed, "/api/bindings/lim-v") if b["source"] == "x"]
    finally:
        call(managed, "DELETE", "/api/vhosts/lim-v")


def test_definitions_import_refuses_unsupported_unless_told_to_skip(managed):
    document = {"vhosts": [{"name": "skip-v"}],
                "topic_permissions": [{"user": "guest", "vhost": "skip-v",
                                       "exchange": "amq.topic", "write": ".*", "read": ".*"}],
                "parameters": [{"vhost": "skip-v", "component": "vhost-limits",
                                "name": "limits", "value": {"max-connections": 4}}]}
    unsupported = ["topic_permissions[0]: topic permissions are not supported (user 'guest', "
                   "vhost 'skip-v', exchange 'amq.topic')"]
    status, body = call(managed, "POST", "/api/definitions", document)
    assert status == 400 and body["unsupported"] == body["problems"] == unsupported
    assert call(managed, "GET", "/api/vhosts/skip-v")[0] == 404
    try:
        assert call(managed, "POST", "/api/definitions?skip-unsupported=true", document) == (
            200, {"skipped": unsupported})
        assert get(managed, "/api/vhosts/skip-v")["limits"] == {"max-connections": 4}
    finally:
        call(managed, "DELETE", "/api/vhosts/skip-v")
