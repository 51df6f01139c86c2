"""rabbitmqadmin, RabbitMQ's own command-line client of the management API,
against Warren: its everyday commands (list, show, declare, delete, publish, get,
purge, close, export, import), the scenario RabbitMQ 3.10.8 passes too. The
script is not Warren's to ship: the test unpacks it from Debian's rabbitmq-server
package (downloaded, not installed: tests/debian.py), and is skipped, saying so,
where apt cannot download it."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from ..support.broker import managed_broker, wait_closed, wait_until
from ..support.debian import unpacked

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes

VHOST = "j-av"
LISTED = ("connections", "channels", "consumers", "exchanges", "queues", "bindings", "users",
          "vhosts", "permissions", "nodes", "parameters", "policies", "operator_policies",
          "vhost_limits")


@pytest.fixture(scope="module")
def script():
    found = unpacked("rabbitmq-server", "/usr/bin/rabbitmqadmin")
    if found is None:
        pytest.skip("no rabbitmqadmin: apt could not download Debian's rabbitmq-server package")
    return found


@pytest.fixture(scope="module")
def managed(tmp_path_factory, gateway_count):
    yield from managed_broker(tmp_path_factory, "rabbitmqadmin")


def admin(script: str, http_port: int):
    """rabbitmqadmin against the API on `http_port`: its output, JSON decoded
    when it is JSON; AssertionError, with what it printed, when it fails."""

    def run(*args: str, vhost: str = VHOST):
        done = subprocess.run([sys.executable, script, "-H", "127.0.0.1", "-P", str(http_port),
                               "-u", "guest", "-p", "guest", "-V", vhost, "-f", "raw_json",
                               *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        try:
            return json.loads(done.stdout)
        except ValueError:
            return done.stdout

    return run


def scenario(run, amqp_port: int, tmp_path) -> None:
    run("declare", "vhost", f"name={VHOST}")
    # the creator of a vhost may use it at once, as on RabbitMQ
    run("declare", "exchange", "name=j-ax", "type=direct")
    run("declare", "queue", "name=j-aq")  # durable="true", as rabbitmqadmin sends it
    run("declare", "queue", "name=j-aq2", "queue_type=classic", 'arguments={"x-max-length": 10}')
    run("declare", "binding", "source=j-ax", "destination=j-aq", "routing_key=k")
    run("declare", "user", "name=j-au", "password=pw", "tags=management")
    run("declare", "permission", f"vhost={VHOST}", "user=j-au", "configure=.*", "write=.*",
        "read=.*")
    run("declare", "policy", "name=j-ap", "pattern=^j-aq2$", 'definition={"max-length": 5}',
        "apply-to=queues")
    run("declare", "vhost_limit", f"vhost={VHOST}", "name=max-queues", "value=100")
    assert run("publish", "exchange=j-ax", "routing_key=k", "payload=hello") == \
        "Message published\n"
    assert run("publish", "routing_key=j-aq2", "payload=direct") == "Message published\n"
    # count is sent as the string "1"
    got = run("get", "queue=j-aq")
    assert [(m["payload"], m["redelivered"]) for m in got] == [("hello", False)]
    got = run("get", "queue=j-aq", "count=5", "ackmode=ack_requeue_false")
    assert [(m["payload"], m["redelivered"]) for m in got] == [("hello", True)]
    assert run("get", "queue=j-aq") == []
    run("purge", "queue", "name=j-aq2")
    wait_until(lambda: run("list", "queues", "name", "messages") ==
               [{"name": "j-aq", "messages": 0}, {"name": "j-aq2", "messages": 0}], timeout=15,
               interval=0.5)
    conn = pika.BlockingConnection(pika.URLParameters(
        f"amqp://j-au:pw@127.0.0.1:{amqp_port}/{VHOST}"))
    channel = conn.channel()
    channel.basic_consume("j-aq", lambda *args: None)
    try:

        def listing() -> dict | None:
            listed = {what: run("list", what) for what in LISTED}
            # (RabbitMQ lists a connection once its stats are out, within seconds)
            return listed if all(listed[what] for what in ("connections", "channels",
                                                           "consumers")) else None

        listed = wait_until(listing, timeout=15, interval=0.5)
        assert [c["user"] for c in listed["connections"] if c["vhost"] == VHOST] == ["j-au"]
        assert [c["user"] for c in listed["channels"] if c["vhost"] == VHOST] == ["j-au"]
        assert [c["queue"]["name"] for c in listed["consumers"]] == ["j-aq"]
        assert {"j-ax", "amq.direct"} <= {x["name"] for x in listed["exchanges"]}
        assert [q["name"] for q in listed["queues"]] == ["j-aq", "j-aq2"]
        assert ("j-ax", "j-aq", "k") in [(b["source"], b["destination"], b["routing_key"])
                                          for b in listed["bindings"]]
        assert "j-au" in [u["name"] for u in listed["users"]]
        assert VHOST in [v["name"] for v in listed["vhosts"]]
        assert (VHOST, "j-au") in [(p["vhost"], p["user"]) for p in listed["permissions"]]
        assert len(listed["nodes"]) == 1
        assert {"vhost": VHOST, "component": "vhost-limits", "name": "limits",
                "value": {"max-queues": 100}} in listed["parameters"]
        assert [p["name"] for p in listed["policies"] if p["vhost"] == VHOST] == ["j-ap"]
        assert listed["operator_policies"] == []
        assert {"vhost": VHOST, "value": {"max-queues": 100}} in listed["vhost_limits"]
        assert run("show", "overview")[0]["object_totals"]["queues"] >= 2
        name = listed["connections"][0]["name"]
        run("close", "connection", f"name={name}")

        wait_closed(conn)
    finally:
        if conn.is_open:
            conn.close()
    exported = tmp_path / "definitions.json"
    run("export", str(exported))
    definitions = json.loads(exported.read_text())
    assert "j-ax" in [x["name"] for x in definitions["exchanges"]]
    run("delete", "binding", "source=j-ax", "destination_type=queue", "destination=j-aq",
        "properties_key=k")
    run("delete", "queue", "name=j-aq")
    run("delete", "exchange", "name=j-ax")
    run("import", str(exported))  # brings them back
    assert "j-aq" in [q["name"] for q in run("list", "queues")]
    assert ("j-ax", "j-aq") in [(b["source"], b["destination"]) for b in run("list", "bindings")]
    run("delete", "policy", "name=j-ap")
    run("delete", "vhost_limit", f"vhost={VHOST}", "name=max-queues")
    run("delete", "permission", f"vhost={VHOST}", "user=j-au")
    run("delete", "user", "name=j-au")
    run("delete", "vhost", f"name={VHOST}")
    assert VHOST not in [v["name"] for v in run("list", "vhosts")]


def test_rabbitmqadmin_s_everyday_commands(script, managed, tmp_path):
    scenario(admin(script, managed.listener_port("http")), managed.port, tmp_path)
