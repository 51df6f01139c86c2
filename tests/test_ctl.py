"""`warren ctl` against a real broker's management API."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from .conftest import ROOT, RunningBroker


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    broker = RunningBroker(tmp_path_factory.mktemp("ctl") / "data", management=True).start()
    yield broker
    broker.stop()


def ctl(broker, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "warren.gateway.cli", "ctl", "--url",
                             broker.http_url, *args], capture_output=True, text=True,
                            timeout=30, cwd=ROOT)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_list_queues_as_table_and_json(managed):
    conn = pika.BlockingConnection(pika.URLParameters(managed.url))
    ch = conn.channel()
    ch.queue_declare("ctl-q")
    ch.confirm_delivery()
    ch.basic_publish("", "ctl-q", b"x")
    table = ctl(managed, "list", "queues").stdout.splitlines()
    assert table[0].split() == ["vhost", "name", "type", "durable", "messages_ready",
                                "messages_unacknowledged", "consumers", "policy"]
    row = next(line for line in table if " ctl-q " in line)
    assert row.split()[:5] == ["/", "ctl-q", "classic", "False", "1"]
    rows = json.loads(ctl(managed, "--json", "list", "queues").stdout)
    assert next(q for q in rows if q["name"] == "ctl-q")["messages_ready"] == 1
    assert "ctl-q" in ctl(managed, "list", "bindings").stdout
    assert "amq.topic" in ctl(managed, "list", "exchanges").stdout
    ch.basic_consume("ctl-q", lambda *a: None, consumer_tag="ctl-consumer")
    assert "ctl-consumer" in ctl(managed, "list", "consumers").stdout
    assert "guest" in ctl(managed, "list", "connections").stdout
    assert ctl(managed, "list", "channels").stdout.count("\n") >= 3
    conn.close()


def test_users_vhosts_permissions_policies(managed):
    ctl(managed, "add-vhost", "ctl-vhost")
    ctl(managed, "add-user", "dave", "pw", "--tags", "monitoring")
    ctl(managed, "--vhost", "ctl-vhost", "set-permissions", "dave", ".*", ".*", ".*")
    assert "ctl-vhost" in ctl(managed, "list", "vhosts").stdout
    assert "dave" in ctl(managed, "list", "users").stdout
    perms = json.loads(ctl(managed, "--json", "list", "permissions").stdout)
    assert {"user": "dave", "vhost": "ctl-vhost", "configure": ".*", "write": ".*",
            "read": ".*"} in perms
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", managed.port, "ctl-vhost", pika.PlainCredentials("dave", "pw")))
    conn.close()
    ctl(managed, "set-policy", "cap", "^capped", '{"max-length": 3}', "--apply-to", "queues",
        "--priority", "4")
    policies = json.loads(ctl(managed, "--json", "list", "policies").stdout)
    assert {"vhost": "/", "name": "cap", "pattern": "^capped", "apply-to": "queues",
            "definition": {"max-length": 3}, "priority": 4} in policies
    bad = ctl(managed, "set-policy", "bad", ".*", '{"colour": 1}', check=False)
    assert bad.returncode == 1 and "unrecognised policy key 'colour'" in bad.stderr
    ctl(managed, "clear-policy", "cap")
    ctl(managed, "--vhost", "ctl-vhost", "clear-permissions", "dave")
    ctl(managed, "delete-user", "dave")
    ctl(managed, "delete-vhost", "ctl-vhost")
    assert "dave" not in ctl(managed, "list", "users").stdout
    missing = ctl(managed, "delete-user", "nobody", check=False)
    assert missing.returncode == 1 and "404" in missing.stderr


def run_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.gateway.cli", "ctl", *args],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)


def test_global_options_before_or_after_the_command(managed):
    """As `rabbitmqctl list_queues --formatter json`: every global option may follow
    the command, and one given before it is not reset by the command's parser."""
    url = managed.http_url
    after = run_ctl("list", "vhosts", "--json", "--url", url, "--user", "guest")
    assert after.returncode == 0, after.stderr
    assert {"name": "/"} in [{"name": v["name"]} for v in json.loads(after.stdout)]
    assert run_ctl("add-vhost", "ctl-late", "--url", url).returncode == 0
    late = run_ctl("set-permissions", "guest", "^late", ".*", ".*", "--vhost", "ctl-late",
                   "--url", url)
    assert late.returncode == 0, late.stderr
    early = run_ctl("--json", "--vhost", "ctl-late", "--url", url, "list", "permissions")
    assert {"user": "guest", "vhost": "ctl-late", "configure": "^late", "write": ".*",
            "read": ".*"} in json.loads(early.stdout)
    refused = run_ctl("--url", url, "list", "queues", "--password", "wrong")
    assert refused.returncode == 1 and "401" in refused.stderr
    assert run_ctl("delete-vhost", "ctl-late", "--url", url).returncode == 0


def test_purge_delete_export_import(managed, tmp_path):
    conn = pika.BlockingConnection(pika.URLParameters(managed.url))
    ch = conn.channel()
    ch.queue_declare("ctl-durable", durable=True)
    ch.confirm_delivery()
    for _ in range(3):
        ch.basic_publish("", "ctl-durable", b"x")
    ctl(managed, "purge-queue", "ctl-durable")
    assert ch.queue_declare("ctl-durable", passive=True).method.message_count == 0
    path = tmp_path / "defs.json"
    ctl(managed, "export", str(path))
    exported = json.loads(path.read_text())
    assert any(q["name"] == "ctl-durable" for q in exported["queues"])
    ctl(managed, "delete-queue", "ctl-durable")
    assert "ctl-durable" not in ctl(managed, "list", "queues").stdout
    ctl(managed, "import", str(path))
    assert "ctl-durable" in ctl(managed, "list", "queues").stdout
    conn.close()


def test_import_lists_every_problem_and_changes_nothing(managed, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({
        "vhosts": [{"name": "ctl-bad"}],
        "queues": [{"name": "q", "vhost": "ctl-bad", "arguments": []},
                   {"name": "r", "vhost": "ctl-bad", "colour": "red"}],
        "bindings": [{"source": "nowhere", "vhost": "ctl-bad", "destination": "q",
                      "destination_type": "queue", "routing_key": "", "arguments": {}}]}))
    result = ctl(managed, "import", str(path), check=False)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert "400 invalid definitions, nothing imported" in lines[0]
    assert sorted(line.strip() for line in lines[1:]) == [
        "bindings[0].source: no exchange 'nowhere' in vhost 'ctl-bad'",
        "queues[0].arguments: expected `object`, got `array`",
        "queues[1].colour: unknown key"]
    assert "ctl-bad" not in ctl(managed, "list", "vhosts").stdout


def test_unreachable_broker_is_a_clear_error():
    result = subprocess.run([sys.executable, "-m", "warren.gateway.cli", "ctl", "--url",
                             "http://127.0.0.1:9", "list", "queues"], capture_output=True,
                            text=True, timeout=30, cwd=ROOT)
    assert result.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in result.stderr
