"""What each user tag may do through the management API, endpoint by endpoint,
against a real broker. The expectations are RabbitMQ 3.10's answers to the same
requests (checked against a running RabbitMQ): management users see and change
objects of the vhosts they have permissions on; policymakers also manage those
vhosts' policies; monitoring users also see every vhost, connection, channel
and consumer and the node; administrators do everything. Only administrators
see users (and their password hashes), permissions and definitions."""

from __future__ import annotations

from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from ..support.broker import RunningBroker, wait_until
from .test_management_api import call

MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR = TAGS = (
    "management", "policymaker", "monitoring", "administrator")

# An expectation: a status, or a 401 with RabbitMQ's reason.
REASONS = {
    "adm": "Not administrator user",
    "mon": "Not monitor user",
    "vh": "User not authorised to access virtual host",
    "obj": "User not authorised to access object",
    "ref": "Access refused.",
    "nm": "Not management user",
}

# (method, path, body, expectations for management, policymaker, monitoring and
# administrator users). Every one of them has full permissions on vhost "a" and
# none on "b"; both hold a queue q, an exchange x bound to it and a policy p.
# Rows run in order for each user, so what a row creates the next one deletes.
TABLE = [
    ("GET", "/api/overview", None, "200 200 200 200"),
    ("GET", "/api/whoami", None, "200 200 200 200"),
    ("GET", "/api/healthchecks/node", None, "200 200 200 200"),
    ("GET", "/api/aliveness-test/a", None, "200 200 200 200"),
    ("GET", "/api/aliveness-test/b", None, "vh vh vh ref"),
    ("GET", "/api/nodes", None, "mon mon 200 200"),
    ("GET", "/api/vhosts", None, "200 200 200 200"),
    ("GET", "/api/vhosts/a", None, "adm adm adm 200"),
    ("PUT", "/api/vhosts/tmp", {}, "adm adm adm 201"),
    ("DELETE", "/api/vhosts/tmp", None, "adm adm adm 204"),
    ("GET", "/api/users", None, "adm adm adm 200"),
    ("GET", "/api/users/{me}", None, "adm adm adm 200"),
    ("PUT", "/api/users/tmp", {"password": "pw", "tags": ""}, "adm adm adm 201"),
    ("DELETE", "/api/users/tmp", None, "adm adm adm 204"),
    ("GET", "/api/permissions", None, "adm adm adm 200"),
    ("GET", "/api/permissions/a/{me}", None, "adm adm adm 200"),
    ("PUT", "/api/permissions/b/t-none", {"configure": "", "write": "", "read": ""},
     "adm adm adm 201"),
    ("DELETE", "/api/permissions/b/t-none", None, "adm adm adm 204"),
    ("GET", "/api/definitions", None, "adm adm adm 200"),
    ("POST", "/api/definitions", {}, "adm adm adm 204"),
    ("GET", "/api/queues", None, "200 200 200 200"),
    ("GET", "/api/queues/a", None, "200 200 200 200"),
    ("GET", "/api/queues/b", None, "vh vh vh 200"),
    ("GET", "/api/queues/a/q", None, "200 200 200 200"),
    ("GET", "/api/queues/b/q", None, "vh vh vh 200"),
    ("GET", "/api/queues/c/q", None, "404 404 404 404"),
    ("PUT", "/api/queues/a/tmp", {}, "201 201 201 201"),
    ("DELETE", "/api/queues/a/tmp", None, "204 204 204 204"),
    ("PUT", "/api/queues/b/tmp", {}, "vh vh vh ref"),
    ("DELETE", "/api/queues/a/q/contents", None, "204 204 204 204"),
    ("DELETE", "/api/queues/b/q/contents", None, "vh vh vh ref"),
    ("GET", "/api/exchanges", None, "200 200 200 200"),
    ("GET", "/api/exchanges/b", None, "vh vh vh 200"),
    ("GET", "/api/exchanges/b/x", None, "vh vh vh 200"),
    ("PUT", "/api/exchanges/a/tmp", {"type": "direct"}, "201 201 201 201"),
    ("DELETE", "/api/exchanges/a/tmp", None, "204 204 204 204"),
    ("PUT", "/api/exchanges/b/tmp", {"type": "direct"}, "vh vh vh ref"),
    ("GET", "/api/bindings", None, "200 200 200 200"),
    ("GET", "/api/bindings/b", None, "vh vh vh 200"),
    ("POST", "/api/bindings/a/e/x/q/q", {"routing_key": "k2"}, "201 201 201 201"),
    ("POST", "/api/bindings/b/e/x/q/q", {"routing_key": "k2"}, "vh vh vh ref"),
    ("GET", "/api/connections", None, "200 200 200 200"),
    ("GET", "/api/channels", None, "200 200 200 200"),
    ("GET", "/api/consumers", None, "200 200 200 200"),
    ("GET", "/api/policies", None, "200 200 200 200"),
    ("GET", "/api/policies/a", None, "200 200 200 200"),
    ("GET", "/api/policies/b", None, "vh vh vh 200"),
    ("GET", "/api/policies/a/p", None, "obj 200 obj 200"),
    ("GET", "/api/policies/b/p", None, "obj obj obj 200"),
    ("PUT", "/api/policies/a/tmp", {"pattern": "^zzz", "definition": {"max-length": 5}},
     "obj 201 obj 201"),
    ("DELETE", "/api/policies/a/tmp", None, "obj 204 obj 204"),
    ("PUT", "/api/policies/b/tmp", {"pattern": "^zzz", "definition": {"max-length": 5}},
     "obj obj obj 201"),
    ("DELETE", "/api/policies/b/tmp", None, "obj obj obj 204"),
]

# The vhosts whose objects each list shows (management, policymaker, monitoring,
# administrator); "/" holds only exchanges.
OWN, AB, ALL = {"a"}, {"a", "b"}, {"/", "a", "b"}
VISIBLE = {
    "/api/vhosts": ("name", [OWN, OWN, ALL, ALL]),
    "/api/queues": ("vhost", [OWN, OWN, OWN, AB]),
    "/api/exchanges": ("vhost", [OWN, OWN, OWN, ALL]),
    "/api/bindings": ("vhost", [OWN, OWN, OWN, AB]),
    "/api/policies": ("vhost", [OWN, OWN, OWN, AB]),
}


@pytest.fixture(scope="module")
def tagged(tmp_path_factory, gateway_count):
    broker = RunningBroker(tmp_path_factory.mktemp("access") / "data", shards=1,
                           management=True).start()
    setup = [("PUT", "/api/vhosts/a", {}), ("PUT", "/api/vhosts/b", {})]
    for tag in (*TAGS, "none"):
        setup += [("PUT", f"/api/users/t-{tag}", {"password": "pw",
                                                   "tags": "" if tag == "none" else tag}),
                  ("PUT", f"/api/permissions/a/t-{tag}",
                   {"configure": ".*", "write": ".*", "read": ".*"})]
    for vhost in ("a", "b"):
        setup += [("PUT", f"/api/permissions/{vhost}/guest",
                   {"configure": ".*", "write": ".*", "read": ".*"}),
                  ("PUT", f"/api/queues/{vhost}/q", {}),
                  ("PUT", f"/api/exchanges/{vhost}/x", {"type": "fanout"}),
                  ("POST", f"/api/bindings/{vhost}/e/x/q/q", {"routing_key": "k"}),
                  ("PUT", f"/api/policies/{vhost}/p",
                   {"pattern": "^zzz", "definition": {"max-length": 5}})]
    for method, path, body in setup:
        status, answer = call(broker, method, path, body)
        assert status in (201, 204), (method, path, status, answer)
    yield broker
    broker.stop()


def expected(token: str) -> tuple[int, str | None]:
    return (401, REASONS[token]) if token in REASONS else (int(token), None)


@pytest.mark.parametrize("tag", TAGS)
def test_each_tag_against_every_endpoint(tagged, tag):
    column = TAGS.index(tag)
    user = f"t-{tag}"
    wrong = []
    for method, path, body, expectations in TABLE:
        path = path.replace("{me}", user)
        status, answer = call(tagged, method, path, body, user=user, password="pw")
        want_status, want_reason = expected(expectations.split()[column])
        reason = answer.get("reason") if status == 401 and isinstance(answer, dict) else None
        if (status, reason) != (want_status, want_reason):
            wrong.append(f"{method} {path}: {status} {reason!r}, want {want_status} "
                         f"{want_reason!r}")
    assert not wrong, "\n".join(wrong)


def test_a_user_without_tags_may_use_no_endpoint(tagged):
    for method, path, body, _ in TABLE:
        status, answer = call(tagged, method, path.replace("{me}", "t-none"), body,
                              user="t-none", password="pw")
        assert (status, answer["reason"]) == (401, "Not management user"), (method, path)


@pytest.mark.parametrize("tag", TAGS)
def test_lists_show_the_vhosts_a_tag_may_see(tagged, tag):
    for path, (field, visible) in VISIBLE.items():
        status, items = call(tagged, "GET", path, user=f"t-{tag}", password="pw")
        assert status == 200
        assert {item[field] for item in items} == visible[TAGS.index(tag)], path


def test_overview_totals_and_node_details_follow_the_tag(tagged):
    _, monitor = call(tagged, "GET", "/api/overview", user="t-monitoring", password="pw")
    _, manager = call(tagged, "GET", "/api/overview", user="t-management", password="pw")
    assert "node" in monitor and "listeners" in monitor
    assert "node" not in manager and "listeners" not in manager
    assert manager["object_totals"]["queues"] == 1
    assert manager["object_totals"]["exchanges"] == len(call(tagged, "GET", "/api/exchanges/a")[1])
    assert monitor["object_totals"]["queues"] == 2
    assert monitor["object_totals"]["exchanges"] == len(call(tagged, "GET", "/api/exchanges")[1])


def test_no_password_hash_reaches_a_non_administrator(tagged):
    for tag in (MANAGEMENT, POLICYMAKER, MONITORING):
        for path in ("/api/users", "/api/users/guest", "/api/definitions"):
            status, answer = call(tagged, "GET", path, user=f"t-{tag}", password="pw")
            assert status == 401 and "password_hash" not in str(answer), (tag, path)


def test_permissions_apply_to_changes_through_the_api(tagged):
    """A management user whose permissions cover only names starting with 'mine-'
    (RabbitMQ answers these with 401 'Access refused.')."""
    assert call(tagged, "PUT", "/api/users/t-limited", {"password": "pw",
                                                        "tags": "management"})[0] == 201
    assert call(tagged, "PUT", "/api/permissions/a/t-limited",
                {"configure": "^mine-", "write": "^mine-", "read": "^mine-"})[0] == 201
    for method, path, body, want in [
            ("PUT", "/api/queues/a/other", {}, 401),
            ("PUT", "/api/queues/a/mine-q", {}, 201),
            ("DELETE", "/api/queues/a/q", None, 401),
            ("DELETE", "/api/queues/a/q/contents", None, 401),
            ("PUT", "/api/exchanges/a/other", {"type": "direct"}, 401),
            ("DELETE", "/api/exchanges/a/x", None, 401),
            ("POST", "/api/bindings/a/e/x/q/q", {}, 401),
            ("POST", "/api/bindings/a/e/x/q/mine-q", {}, 401),  # no read on x
            ("DELETE", "/api/queues/a/mine-q", None, 204)]:
        status, answer = call(tagged, method, path, body, user="t-limited", password="pw")
        assert status == want, (method, path, status, answer)
        if status == 401:
            assert answer["reason"] == "Access refused."
    assert call(tagged, "GET", "/api/queues/a/q")[0] == 200
    assert call(tagged, "GET", "/api/exchanges/a/other")[0] == 404


def test_connections_channels_and_consumers_of_others(tagged):
    def connect(tag: str):
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", tagged.port, "a", pika.PlainCredentials(f"t-{tag}", "pw")))
        conn.channel().basic_consume("q", lambda *args: None)
        return conn

    conns = {tag: connect(tag) for tag in (MANAGEMENT, MONITORING, ADMINISTRATOR)}
    try:
        def names() -> dict:
            listed = call(tagged, "GET", "/api/connections")[1]
            return {c["user"]: quote(c["name"], safe="") for c in listed}

        named = wait_until(lambda: len(names()) == 3 and names())

        def users(path: str, tag: str) -> set:
            status, items = call(tagged, "GET", path, user=f"t-{tag}", password="pw")
            assert status == 200
            return {item.get("user") or item["channel_details"]["user"] for item in items}

        everyone = {"t-management", "t-monitoring", "t-administrator"}
        for path in ("/api/connections", "/api/channels", "/api/consumers", "/api/consumers/a"):
            assert users(path, MANAGEMENT) == {"t-management"}, path
            assert users(path, POLICYMAKER) == set(), path
            assert users(path, MONITORING) == everyone, path
            assert users(path, ADMINISTRATOR) == everyone, path
        # one's own connection; any to read for monitors, to close for administrators
        for tag, target, method, want in [
                (MANAGEMENT, "t-administrator", "GET", 401),
                (MANAGEMENT, "t-management", "GET", 200),
                (MONITORING, "t-administrator", "GET", 200),
                (MONITORING, "t-administrator", "DELETE", 401),
                (MANAGEMENT, "t-administrator", "DELETE", 401),
                (MONITORING, "t-monitoring", "DELETE", 204),
                (ADMINISTRATOR, "t-management", "DELETE", 204)]:
            status, answer = call(tagged, method, "/api/connections/" + named[target],
                                  user=f"t-{tag}", password="pw")
            assert status == want, (tag, target, method, answer)
            if status == 401:
                assert answer["reason"] == "User not authorised to access object"
        wait_until(lambda: set(names()) == {"t-administrator"})
    finally:
        for conn in conns.values():
            try:
                conn.close()
            except pika.exceptions.AMQPError:
                pass  # closed through the API
