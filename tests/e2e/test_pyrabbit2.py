"""pyrabbit2's whole client against Warren's management API: every call of
pyrabbit2.api.Client that a broker without clustering and plugins answers, in
the order an operator makes them, each with the result RabbitMQ 3.10.8 gives
(checked there with this same scenario). Shovels are a plugin Warren does not
have; get_bindings_from_exchange, get_bindings_to_exchange and
get_bindings_between_exch_and_queue are empty in pyrabbit2 1.0.7 (no call)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from ..support.broker import managed_broker, wait_closed, wait_until

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes

pyrabbit2 = pytest.importorskip("pyrabbit2")

VHOST, USER = "j-pv", "j-pu"


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "pyrabbit2")


def scenario(client, amqp_port: int) -> list[str]:
    """Every call, asserting what RabbitMQ answers; the calls made, in order."""
    made = []

    def call(name: str, *args, **kwargs):
        made.append(name)
        return getattr(client, name)(*args, **kwargs)

    assert call("get_whoami")["name"] == "guest"
    assert call("get_overview")["management_version"]
    assert len(call("get_nodes")) == 1
    assert call("get_cluster_name")["name"]
    assert call("get_extensions") == call("get_extensions")  # a list, whatever it holds
    assert call("create_vhost", VHOST)
    assert call("get_vhost", VHOST)["name"] == VHOST
    assert VHOST in call("get_vhost_names")
    assert VHOST in [v["name"] for v in call("get_all_vhosts")]
    # RabbitMQ gives the vhost's creator full permissions on it
    assert call("get_permission", VHOST, "guest")["configure"] == ".*"
    assert call("create_user", USER, "pw", tags="management")
    assert USER in [u["name"] for u in call("get_users")]
    assert call("set_vhost_permissions", VHOST, USER, ".*", ".*", ".*")
    assert call("get_permission", VHOST, USER) == {
        "user": USER, "vhost": VHOST, "configure": ".*", "write": ".*", "read": ".*"}
    assert {p["user"] for p in call("get_vhost_permissions", VHOST)} == {"guest", USER}
    assert [p["vhost"] for p in call("get_user_permissions", USER)] == [VHOST]
    assert (VHOST, USER) in [(p["vhost"], p["user"]) for p in call("get_permissions")]
    # exchanges: pyrabbit2 sends "arguments": [] for none
    assert call("create_exchange", VHOST, "j-px", "direct") is True
    assert call("get_exchange", VHOST, "j-px")["type"] == "direct"
    assert "j-px" in [x["name"] for x in call("get_exchanges", VHOST)]
    assert "j-px" in [x["name"] for x in call("get_exchanges")]
    # queues
    call("create_queue", VHOST, "j-pq", durable=True, arguments={"x-max-length": 100})
    assert call("get_queue", VHOST, "j-pq")["arguments"] == {"x-max-length": 100}
    assert "j-pq" in [q["name"] for q in call("get_queues", VHOST)]
    assert "j-pq" in [q["name"] for q in call("get_queues")]
    assert call("create_binding", VHOST, "j-px", "j-pq", "k")  # "arguments": [] too
    bindings = call("get_queue_bindings", VHOST, "j-pq")
    assert [(b["source"], b["routing_key"]) for b in bindings] == [("", "j-pq"), ("j-px", "k")]
    assert ("j-px", "j-pq") in [(b["source"], b["destination"]) for b in call("get_bindings")]
    for name in ("get_bindings_from_exchange", "get_bindings_to_exchange",
                 "get_bindings_between_exch_and_queue"):
        assert call(name, VHOST, "j-px", *(["j-pq"] if "between" in name else [])) is None
    # messages
    assert call("publish", VHOST, "j-px", "k", "hello") is True
    assert call("publish", VHOST, "j-px", "k", "aGk=", payload_enc="base64") is True
    wait_until(lambda: client.get_queue(VHOST, "j-pq").get("messages") == 2, timeout=15)
    assert call("get_queue_depth", VHOST, "j-pq") == 2
    call("get_queue_depths", VHOST)
    call("get_queue_depths", VHOST, ["j-pq"])
    got = call("get_messages", VHOST, "j-pq", count=1, requeue=True)
    assert [m["payload"] for m in got] == ["hello"]
    got = call("get_messages", VHOST, "j-pq", count=5, truncate=1)
    assert [m["payload"] for m in got] == ["h", "h"]  # not requeued; cut to a byte
    call("publish", VHOST, "j-px", "k", "again")
    wait_until(lambda: client.get_queue(VHOST, "j-pq").get("messages") == 1, timeout=15)
    call("purge_queue", VHOST, "j-pq")
    call("publish", VHOST, "j-px", "k", "again")
    wait_until(lambda: client.get_queue(VHOST, "j-pq").get("messages") == 1, timeout=15)
    assert call("purge_queues", [("j-pq", VHOST)]) is True
    wait_until(lambda: client.get_queue(VHOST, "j-pq").get("messages") == 0, timeout=15)
    assert call("get_queue_depth", VHOST, "j-pq") == 0
    # policies
    call("create_policy", VHOST, "j-pp", pattern="^j-pq$", definition={"max-length": 5},
         priority=1, **{"apply-to": "queues"})
    assert call("get_policy", VHOST, "j-pp")["definition"] == {"max-length": 5}
    assert "j-pp" in [p["name"] for p in call("get_all_policies")]
    call("delete_policy", VHOST, "j-pp")
    # a client's connection and channel, seen and closed
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://{USER}:pw@127.0.0.1:{amqp_port}/{VHOST}"))
    conn.channel()
    try:
        names = wait_until(lambda: [c["name"] for c in client.get_connections() or []
                                    if c["vhost"] == VHOST], timeout=15)
        made.append("get_connections")
        assert call("get_connection", names[0])["user"] == USER
        channels = wait_until(lambda: [c["name"] for c in client.get_channels() or []
                                       if c["vhost"] == VHOST], timeout=15)
        made.append("get_channels")
        assert call("get_channel", channels[0])["vhost"] == VHOST
        call("delete_connection", names[0])

        wait_closed(conn)
    finally:
        if conn.is_open:
            conn.close()
    assert "j-px" in str(call("get_definitions")["exchanges"])
    assert call("is_alive", VHOST) is True
    # and away again
    call("delete_binding", VHOST, "j-px", "j-pq", "k")
    assert [b["source"] for b in client.get_queue_bindings(VHOST, "j-pq")] == [""]
    call("delete_queue", VHOST, "j-pq")
    call("delete_exchange", VHOST, "j-px")
    call("delete_permission", VHOST, USER)
    call("delete_user", USER)
    call("delete_vhost", VHOST)
    assert VHOST not in client.get_vhost_names()
    return made


def test_pyrabbit2_s_whole_client(managed):
    client = pyrabbit2.api.Client(f"127.0.0.1:{managed.listener_port('http')}", "guest", "guest",
                                  timeout=10)
    made = scenario(client, managed.port)
    public = {name for name in dir(pyrabbit2.api.Client)
              if not name.startswith("_") and callable(getattr(pyrabbit2.api.Client, name))}
    assert public - set(made) == {"get_shovel", "get_all_shovels", "create_shovel",
                                  "delete_shovel"}
