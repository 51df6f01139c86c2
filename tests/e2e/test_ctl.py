"""`warren ctl` against a real broker's management API."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pika
import pytest

from ..support.broker import ROOT, RunningBroker

# Started first: the two workers then finish together. Once, with two gateway
# processes: the command line speaks to the management API, and what it changes
# must reach the gateway a client lands on, either one.
pytestmark = [pytest.mark.slow, pytest.mark.run_once]


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    broker = RunningBroker(tmp_path_factory.mktemp("ctl") / "data", management=True,
                           gateways=2).start()
    yield broker
    broker.stop()


def ctl(broker, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "--url",
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
    assert bad.returncode == 1 and '[{<<"colour">>,1}] are not recognised policy settings' in bad.stderr
    ctl(managed, "clear-policy", "cap")
    ctl(managed, "--vhost", "ctl-vhost", "clear-permissions", "dave")
    ctl(managed, "delete-user", "dave")
    ctl(managed, "delete-vhost", "ctl-vhost")
    assert "dave" not in ctl(managed, "list", "users").stdout
    missing = ctl(managed, "delete-user", "nobody", check=False)
    assert missing.returncode == 1
    assert missing.stderr == "warren ctl: user 'nobody': Not Found [404 Object Not Found]\n"


def run_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", *args],
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
    assert refused.returncode == 1
    assert refused.stderr.startswith("warren ctl: list queues: Login failed (as user given by")
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
    assert lines[0] == (f"warren ctl: import of {path}: invalid definitions, nothing imported "
                        "[400 bad_request]")
    assert sorted(line.strip() for line in lines[1:]) == [
        "bindings[0].source: no exchange 'nowhere' in vhost 'ctl-bad'",
        "queues[0].arguments: expected `object`, got `array`",
        "queues[1].colour: unknown key"]
    assert "ctl-bad" not in ctl(managed, "list", "vhosts").stdout


def test_unreachable_broker_is_a_clear_error():
    result = subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "--url",
                             "http://127.0.0.1:9", "list", "queues"], capture_output=True,
                            text=True, timeout=30, cwd=ROOT)
    assert result.returncode == 1
    assert "cannot reach http://127.0.0.1:9" in result.stderr


def test_every_command_and_option_has_help():
    from warren.gateway.cli import ctl as ctl_module

    def walk(parser, where):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    assert choice.help, f"{where} {choice.dest}: no help"
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{where} {name}")
            elif not isinstance(action, argparse._HelpAction):
                yield where, action

    for where, action in walk(ctl_module._parser(), "warren ctl"):
        assert action.help, f"{where} {action.option_strings or action.dest}: no help"
    shown = run_ctl("declare", "queue", "--help")
    assert shown.returncode == 0 and "--auto-delete AUTO_DELETE" in shown.stdout


def test_target_from_option_environment_or_config_file(managed, tmp_path):
    """As rabbitmqadmin: --url, else $WARREN_MANAGEMENT_URL (and user/password
    variables), else the broker's warren.toml in the working directory."""
    def run_in(cwd, *args, **env):
        return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", *args],
                              capture_output=True, text=True, timeout=30, cwd=cwd,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **env})

    (tmp_path / "warren.toml").write_text(
        f'management_bind = "0.0.0.0"\nmanagement_port = {managed.management_port}\n'
        'default_user = "guest"\ndefault_pass = "guest"\n')
    from_file = run_in(tmp_path, "list", "vhosts")
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout.splitlines()[0].split() == ["name", "description", "limits"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert run_in(elsewhere, "list", "vhosts", "-c", str(tmp_path / "warren.toml")
                  ).returncode == 0
    assert run_in(elsewhere, "list", "vhosts",
                  WARREN_CONFIG=str(tmp_path / "warren.toml")).returncode == 0
    # the environment wins over the file, the option over the environment
    dead = "http://127.0.0.1:9"
    from_env = run_in(tmp_path, "list", "vhosts", WARREN_MANAGEMENT_URL=dead)
    assert from_env.returncode == 1 and f"cannot reach {dead}" in from_env.stderr
    assert run_in(tmp_path, "list", "vhosts", "--url", managed.http_url,
                  WARREN_MANAGEMENT_URL=dead).returncode == 0
    wrong = run_in(elsewhere, "list", "vhosts", WARREN_MANAGEMENT_URL=managed.http_url,
                   WARREN_MANAGEMENT_USER="guest", WARREN_MANAGEMENT_PASSWORD="wrong")
    assert wrong.returncode == 1 and "Login failed" in wrong.stderr
    assert run_in(elsewhere, "list", "vhosts", WARREN_MANAGEMENT_URL=managed.http_url,
                  WARREN_MANAGEMENT_PASSWORD="guest").returncode == 0
    # a broken file is named when it is needed, and not read when it is not
    (elsewhere / "warren.toml").write_text("not toml [")
    broken = run_in(elsewhere, "list", "vhosts")
    assert broken.returncode == 1 and broken.stderr.startswith(
        "warren ctl: warren.toml: not valid TOML")
    assert run_in(elsewhere, "list", "vhosts", "--url", managed.http_url, "-u", "guest", "-p",
                  "guest").returncode == 0


def test_declare_and_delete_as_rabbitmqadmin_does(managed):
    declared = ctl(managed, "declare", "queue", "name=adm-q", "durable=false",
                   'arguments={"x-max-length": 2}')
    assert declared.stdout == "queue 'adm-q' in vhost '/' declared\n"
    assert ctl(managed, "declare", "exchange", "--name", "adm-x", "--type", "topic"
               ).stdout == "exchange 'adm-x' in vhost '/' declared\n"
    assert ctl(managed, "declare", "binding", "source=adm-x", "destination=adm-q",
               "routing_key=a.*").stdout == (
        "binding from exchange 'adm-x' to queue 'adm-q' in vhost '/' declared\n")
    [queue] = [q for q in json.loads(ctl(managed, "list", "queues", "--json").stdout)
               if q["name"] == "adm-q"]
    assert (queue["durable"], queue["arguments"]) == (False, {"x-max-length": 2})
    conn = pika.BlockingConnection(pika.URLParameters(managed.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("adm-x", "a.b", b"routed")
    assert ch.queue_declare("adm-q", passive=True).method.message_count == 1
    assert ctl(managed, "delete", "binding", "source=adm-x", "destination=adm-q",
               "routing_key=a.*").stdout == (
        "binding from exchange 'adm-x' to queue 'adm-q' in vhost '/' deleted\n")
    ch.basic_publish("adm-x", "a.b", b"unrouted")
    assert ch.queue_declare("adm-q", passive=True).method.message_count == 1
    assert json.loads(ctl(managed, "purge", "queue", "name=adm-q", "--json").stdout) == {
        "ok": True, "message": "queue 'adm-q' in vhost '/' purged"}
    assert ch.queue_declare("adm-q", passive=True).method.message_count == 0
    conn.close()
    gone = ctl(managed, "delete", "binding", "source=adm-x", "destination=adm-q",
               "routing_key=a.*", check=False)
    assert gone.returncode == 1 and "no such binding with routing key 'a.*'" in gone.stderr
    bad = ctl(managed, "declare", "exchange", "name=adm-bad", "type=fancy", check=False)
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr == ("warren ctl: exchange 'adm-bad' in vhost '/': unknown exchange type "
                          "'fancy' [400 bad_request]\n")
    assert ctl(managed, "delete", "exchange", "name=adm-x", "-q").stdout == ""
    assert "adm-x" not in ctl(managed, "list", "exchanges").stdout
    assert ctl(managed, "delete", "queue", "name=adm-q"
               ).stdout == "queue 'adm-q' in vhost '/' deleted\n"
    assert "adm-q" not in ctl(managed, "list", "queues").stdout
    usage = ctl(managed, "declare", "queue", "durable=false", check=False)
    assert usage.returncode == 2 and "the following arguments are required: --name" in usage.stderr


def test_rabbitmqadmin_declare_and_delete_for_vhosts_users_permissions_policies(managed):
    """rabbitmqadmin's spelling works as typed (`user=`/`password=` name the object,
    not the credentials); each change says what it did."""
    steps = [
        (["declare", "vhost", "name=adm-v"], "vhost 'adm-v' added"),
        (["declare", "user", "name=adm-u", "password=s3cret", "tags=monitoring"],
         "user 'adm-u' added with tags monitoring"),
        (["declare", "permission", "vhost=adm-v", "user=adm-u", "configure=.*", "write=.*",
          "read=^r"], "permissions of user 'adm-u' in vhost 'adm-v' set"),
        (["declare", "policy", "vhost=adm-v", "name=cap", "pattern=^c",
          'definition={"max-length": 3}', "apply-to=queues", "priority=2"],
         "policy 'cap' in vhost 'adm-v' set"),
        (["declare", "vhost_limit", "vhost=adm-v", "name=max-queues", "value=4"],
         "limits of vhost 'adm-v' set: max-queues=4"),
    ]
    for args, said in steps:
        assert ctl(managed, *args).stdout == said + "\n"
    try:
        # (guest has full permissions on the vhost it created, as on RabbitMQ)
        assert json.loads(ctl(managed, "list", "permissions", "-V", "adm-v", "--json").stdout
                          ) == [{"user": "adm-u", "vhost": "adm-v", "configure": ".*",
                                 "write": ".*", "read": "^r"},
                                {"user": "guest", "vhost": "adm-v", "configure": ".*",
                                 "write": ".*", "read": ".*"}]
        assert json.loads(ctl(managed, "list", "policies", "-V", "adm-v", "--json").stdout
                          ) == [{"vhost": "adm-v", "name": "cap", "pattern": "^c",
                                 "apply-to": "queues", "definition": {"max-length": 3},
                                 "priority": 2}]
        assert "adm-v\t{\"max-queues\": 4}" in ctl(managed, "list", "vhosts", "name", "limits",
                                                  "-f", "tsv").stdout
        # the user signs in with the password given as password=
        assert ctl(managed, "show", "overview", "cluster_name", "-f", "tsv", "-u", "adm-u",
                   "-p", "s3cret").stdout.startswith("cluster_name\nwarren@")
    finally:
        for args, said in [
                (["delete", "vhost_limit", "vhost=adm-v", "name=max-queues"],
                 "limits of vhost 'adm-v' cleared: max-queues"),
                (["delete", "policy", "vhost=adm-v", "name=cap"],
                 "policy 'cap' in vhost 'adm-v' cleared"),
                (["delete", "permission", "vhost=adm-v", "user=adm-u"],
                 "permissions of user 'adm-u' in vhost 'adm-v' cleared"),
                (["delete", "user", "name=adm-u"], "user 'adm-u' deleted"),
                (["delete", "vhost", "name=adm-v"], "vhost 'adm-v' deleted")]:
            assert ctl(managed, *args).stdout == said + "\n"
    assert "adm-v" not in ctl(managed, "list", "vhosts").stdout


def test_vhost_filters_lists(managed):
    ctl(managed, "add-vhost", "ctl-only")
    try:
        ctl(managed, "-V", "ctl-only", "set-permissions", "guest", ".*", ".*", ".*")
        ctl(managed, "declare", "queue", "name=in-only", "--vhost", "ctl-only")
        ctl(managed, "declare", "queue", "name=in-default")
        only = ctl(managed, "list", "queues", "--vhost", "ctl-only", "--columns", "vhost,name",
                   "-f", "tsv").stdout
        assert only == "vhost\tname\nctl-only\tin-only\n"
        everywhere = ctl(managed, "list", "queues", "name", "-f", "tsv").stdout.splitlines()
        assert {"in-only", "in-default"} <= set(everywhere[1:])
        perms = json.loads(ctl(managed, "list", "permissions", "-V", "ctl-only", "-f", "json",
                               "--columns", "user,vhost").stdout)
        assert perms == [{"user": "guest", "vhost": "ctl-only"}]
        missing = ctl(managed, "list", "queues", "-V", "nowhere", check=False)
        assert (missing.returncode, missing.stderr) == (
            1, "warren ctl: list queues: no vhost 'nowhere' [404 Object Not Found]\n")
    finally:
        ctl(managed, "delete", "queue", "name=in-default")
        ctl(managed, "delete-vhost", "ctl-only")


def test_close_connection_with_a_reason(managed):
    conn = pika.BlockingConnection(pika.URLParameters(managed.url))
    port = conn._impl._transport._sock.getsockname()[1]
    rows = json.loads(ctl(managed, "list", "connections", "--json").stdout)
    [name] = [row["name"] for row in rows if f":{port} ->" in row["name"]]
    closed = ctl(managed, "close", "connection", f"name={name}", "reason=maintenance window")
    assert closed.stdout == f"connection '{name}' closed\n"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    assert raised.value.reply_code == 320
    assert "maintenance window" in raised.value.reply_text
    missing = ctl(managed, "close", "connection", "name=nope", check=False)
    assert missing.returncode == 1 and "connection 'nope': Not Found" in missing.stderr


def test_change_password_keeps_tags(managed):
    assert ctl(managed, "add-user", "erin", "old", "--tags", "monitoring"
               ).stdout == "user 'erin' added with tags monitoring\n"
    try:
        assert ctl(managed, "change-password", "erin", "new"
                   ).stdout == "password of user 'erin' changed\n"
        as_erin = ctl(managed, "list", "vhosts", "-u", "erin", "-p", "new")
        assert as_erin.returncode == 0
        old = ctl(managed, "list", "vhosts", "-u", "erin", "-p", "old", check=False)
        assert old.returncode == 1 and "Login failed" in old.stderr
        missing = ctl(managed, "change-password", "nobody", "x", check=False)
        assert missing.stderr.startswith("warren ctl: user 'nobody': Not Found")
    finally:
        ctl(managed, "delete-user", "erin")


def test_vhost_and_user_limits(managed):
    ctl(managed, "add-vhost", "ctl-limits")
    ctl(managed, "add-user", "lim", "pw")
    try:
        ctl(managed, "-V", "ctl-limits", "set-permissions", "lim", ".*", ".*", ".*")
        set_ = ctl(managed, "set-vhost-limits", '{"max-connections": 1}', "-V", "ctl-limits")
        assert set_.stdout == "limits of vhost 'ctl-limits' set: max-connections=1\n"
        assert json.loads(ctl(managed, "list", "vhost-limits", "-V", "ctl-limits", "--json"
                              ).stdout) == [{"vhost": "ctl-limits",
                                             "value": {"max-connections": 1}}]
        params = pika.ConnectionParameters("127.0.0.1", managed.port, "ctl-limits",
                                           pika.PlainCredentials("lim", "pw"))
        first = pika.BlockingConnection(params)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            pika.BlockingConnection(params)
        first.close()
        assert ctl(managed, "clear-vhost-limits", "-V", "ctl-limits").stdout == (
            "limits of vhost 'ctl-limits' cleared: max-connections\n")
        pika.BlockingConnection(params).close()
        assert ctl(managed, "set-user-limits", "lim", '{"max-channels": 1}').stdout == (
            "limits of user 'lim' set: max-channels=1\n")
        assert "max-channels" in ctl(managed, "list", "user_limits").stdout
        conn = pika.BlockingConnection(params)
        conn.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker):
            conn.channel()
        ctl(managed, "clear-user-limits", "lim", "max-channels")
        assert "lim" not in ctl(managed, "list", "user_limits").stdout
        bad = ctl(managed, "set-vhost-limits", '{"max-bogus": 1}', "-V", "ctl-limits",
                  check=False)
        assert bad.returncode == 1
        assert "unrecognised limit(s) 'max-bogus' (known: max-connections, max-queues)" \
            in bad.stderr
    finally:
        ctl(managed, "delete-user", "lim")
        ctl(managed, "delete-vhost", "ctl-limits")


RABBITMQ_EXPORT = ROOT / "tests" / "data" / "rabbitmq-3.10.8-definitions.json"
UNSUPPORTED = [
    "topic_permissions[0]: topic permissions are not supported (user 'guest', vhost "
    "'ctl-rmq', exchange 'amq.topic')",
    "parameters[0]: parameters of component 'operator_policy' are not supported ('op' in "
    "vhost 'ctl-rmq')",
    "global_parameters[0]: global parameter 'ctl-gp' is not supported",
    "policies[0].definition.ha-mode: policy key 'ha-mode' is not supported (policy 'ha' in "
    "vhost 'ctl-rmq')",
]


def test_import_of_a_rabbitmq_export_refuses_what_warren_lacks(managed):
    """A RabbitMQ 3.10.8 export (a vhost with limits, a topic permission, an operator
    policy, a global parameter, a policy with a mirroring key): refused whole,
    naming each unsupported item; --skip-unsupported imports the rest and says
    what it left out."""
    refused = ctl(managed, "import", str(RABBITMQ_EXPORT), check=False)
    assert refused.returncode == 1
    lines = refused.stderr.splitlines()
    assert lines[0] == (f"warren ctl: import of {RABBITMQ_EXPORT}: the definitions hold what "
                        "Warren does not support, nothing imported (skip-unsupported=true "
                        "imports the rest) [400 bad_request]")
    assert [line.strip() for line in lines[1:-1]] == UNSUPPORTED
    assert lines[-1] == "--skip-unsupported imports the rest and lists what it skips"
    assert "ctl-rmq" not in ctl(managed, "list", "vhosts").stdout
    assert "ctl-limited" not in ctl(managed, "list", "users").stdout

    imported = ctl(managed, "import", str(RABBITMQ_EXPORT), "--skip-unsupported")
    try:
        lines = imported.stdout.splitlines()
        assert lines[0] == (f"definitions imported from {RABBITMQ_EXPORT}; skipped, as Warren "
                            "does not support them (4):")
        assert [line.strip() for line in lines[1:]] == UNSUPPORTED
        limits = json.loads(ctl(managed, "list", "vhost_limits", "-V", "ctl-rmq", "--json"
                                ).stdout)
        assert limits == [{"vhost": "ctl-rmq", "value": {"max-queues": 50,
                                                         "max-connections": 10}}]
        assert json.loads(ctl(managed, "list", "user_limits", "--json").stdout) == [
            {"user": "ctl-limited", "value": {"max-channels": 3}}]
        policies = json.loads(ctl(managed, "list", "policies", "-V", "ctl-rmq", "--json",
                                  "--columns", "name,definition").stdout)
        assert sorted(policies, key=lambda p: p["name"]) == [
            {"name": "cap", "definition": {"max-length": 5}},
            {"name": "ha", "definition": {"max-length": 7}}]
        [queue] = json.loads(ctl(managed, "list", "queues", "-V", "ctl-rmq", "--json").stdout)
        assert (queue["name"], queue["type"]) == ("orders", "quorum")
        bindings = ctl(managed, "list", "bindings", "-V", "ctl-rmq", "--columns",
                       "source,destination,routing_key", "-f", "tsv").stdout
        assert "events\torders\torder.*" in bindings.splitlines()
        # RabbitMQ's password hash works: the user can sign in with its password
        as_user = ctl(managed, "list", "vhosts", "-u", "ctl-limited", "-p", "pw")
        assert as_user.returncode == 0
        # and Warren's export carries the limits where RabbitMQ's import reads them
        exported = json.loads(ctl(managed, "export", "-").stdout)
        assert {"value": {"max-queues": 50, "max-connections": 10}, "vhost": "ctl-rmq",
                "component": "vhost-limits", "name": "limits"} in exported["parameters"]
    finally:
        ctl(managed, "delete-vhost", "ctl-rmq")
        ctl(managed, "delete-user", "ctl-limited")


def test_publish_and_get_as_rabbitmqadmin_does(managed, tmp_path):
    """rabbitmqadmin 3.10's `publish` and `get`, as RabbitMQ answers them: an
    unrouted message is no error, the payload comes from stdin when not given,
    `get` requeues unless told otherwise and writes one body to payload_file."""
    ctl(managed, "declare", "queue", "name=pub-q", "durable=false")
    try:
        assert ctl(managed, "publish", "routing_key=pub-q", "payload=hello").stdout == (
            "message published to exchange 'amq.default' in vhost '/'\n")
        assert ctl(managed, "publish", "--routing-key", "nowhere", "--payload", "x").stdout == (
            "message published to exchange 'amq.default' in vhost '/' but NOT routed\n")
        piped = subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "--url",
                                managed.http_url, "publish", "routing_key=pub-q",
                                'properties={"headers": {"k": 1}}'],
                               input=b"\xff\x00bytes", capture_output=True, timeout=30, cwd=ROOT)
        assert piped.returncode == 0, piped.stderr
        table = ctl(managed, "get", "queue=pub-q", "count=5").stdout.splitlines()
        assert table[0].split() == ["routing_key", "exchange", "message_count", "payload",
                                    "payload_bytes", "payload_encoding", "properties",
                                    "redelivered"]
        assert len(table) == 4  # header, rule, two messages: requeued, not removed
        got = json.loads(ctl(managed, "get", "queue=pub-q", "count=5",
                             "ackmode=ack_requeue_false", "encoding=auto", "--json").stdout)
        assert [(m["payload"], m["payload_encoding"], m["payload_bytes"], m["redelivered"])
                for m in got] == [("hello", "string", 5, True),
                                  ("/wBieXRlcw==", "base64", 7, True)]
        assert got[1]["properties"]["headers"] == {"k": 1}
        assert ctl(managed, "get", "queue=pub-q").stdout == (
            "queue 'pub-q' in vhost '/' has no messages ready\n")
        ctl(managed, "publish", "routing_key=pub-q", "payload=AAE=", "payload_encoding=base64")
        body = tmp_path / "body"
        shown = ctl(managed, "get", "queue=pub-q", f"payload_file={body}", "-f", "tsv")
        assert shown.stdout.splitlines()[0].split("\t") == [
            "routing_key", "exchange", "message_count", "payload_bytes", "redelivered"]
        assert body.read_bytes() == b"\x00\x01"
        many = ctl(managed, "get", "queue=pub-q", "count=2", f"payload_file={body}",
                   check=False)
        assert (many.returncode, many.stderr) == (
            1, "warren ctl: --payload-file takes one message: --count must be 1\n")
        missing = ctl(managed, "publish", "exchange=pub-none", "routing_key=k", "payload=x",
                      check=False)
        assert missing.returncode == 1 and missing.stderr.startswith(
            "warren ctl: publish to exchange 'pub-none' in vhost '/': ")
        assert "no exchange 'pub-none' in vhost '/'" in missing.stderr
        missing = ctl(managed, "get", "queue=pub-none", check=False)
        assert missing.returncode == 1
        assert "no queue 'pub-none' in vhost '/'" in missing.stderr
        bad = ctl(managed, "get", "queue=pub-q", "count=abc", check=False)
        assert bad.returncode == 2 and "argument --count: invalid int value: 'abc'" in bad.stderr
    finally:
        ctl(managed, "delete", "queue", "name=pub-q")


def test_set_user_tags_keeps_the_password(managed):
    """As rabbitmqctl set_user_tags: the tags are replaced, the password stays."""
    ctl(managed, "add-user", "tagged", "pw", "--tags", "monitoring")
    try:
        assert ctl(managed, "set-user-tags", "tagged", "administrator", "management"
                   ).stdout == "tags of user 'tagged' set to administrator,management\n"
        [user] = [u for u in json.loads(ctl(managed, "list", "users", "--json").stdout)
                  if u["name"] == "tagged"]
        assert user["tags"] == ["administrator", "management"]
        # an administrator now, and still signing in with its password
        assert ctl(managed, "list", "users", "-u", "tagged", "-p", "pw").returncode == 0
        assert ctl(managed, "set-user-tags", "tagged").stdout == (
            "tags of user 'tagged' set to none\n")
        missing = ctl(managed, "set-user-tags", "nobody", "administrator", check=False)
        assert (missing.returncode, missing.stderr) == (
            1, "warren ctl: user 'nobody': Not Found [404 Object Not Found]\n")
        # rabbitmqadmin's `declare user ... password_hash=`: the twin signs in with pw
        ctl(managed, "declare", "user", "name=twin", f"password_hash={user['password_hash']}",
            "tags=management")
        assert ctl(managed, "list", "vhosts", "-u", "twin", "-p", "pw").returncode == 0
        neither = ctl(managed, "declare", "user", "name=none", check=False)
        assert (neither.returncode, neither.stderr) == (
            1, "warren ctl: declare user: give a password or a password_hash (one of them)\n")
    finally:
        ctl(managed, "delete-user", "tagged")
        ctl(managed, "delete-user", "twin", check=False)


def test_columns_may_follow_options(managed):
    """`list queues -V team name messages`, as rabbitmqadmin takes it; a word that
    is no column or option is still refused elsewhere."""
    ctl(managed, "declare", "queue", "name=col-q", "durable=false")
    try:
        listed = ctl(managed, "list", "queues", "-V", "/", "name", "-f", "tsv", "messages")
        assert listed.stdout.splitlines()[0] == "name\tmessages"
        assert "col-q\t0" in listed.stdout.splitlines()
        shown = ctl(managed, "show", "overview", "-f", "tsv", "cluster_name")
        assert shown.stdout.startswith("cluster_name\nwarren@")
        stray = ctl(managed, "delete-user", "-q", "someone", "extra", check=False)
        assert stray.returncode == 2 and "unrecognized arguments: extra" in stray.stderr
        unknown = ctl(managed, "list", "queues", "--colour", check=False)
        assert unknown.returncode == 2 and "unrecognized arguments: --colour" in unknown.stderr
    finally:
        ctl(managed, "delete", "queue", "name=col-q")


def test_import_of_deeply_nested_arguments_is_refused_cleanly(managed, tmp_path):
    """ctl sends the file as it is: the API refuses what Python's JSON would
    recurse on, and ctl says so, with no traceback."""
    depth = 5000
    path = tmp_path / "deep.json"
    path.write_text('{"queues": [{"name": "deep", "vhost": "/", "durable": true, '
                    '"auto_delete": false, "arguments": {"x-a": ' + '{"a": ' * depth + "1"
                    + "}" * depth + "}}]}")
    result = ctl(managed, "import", str(path), check=False)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"warren ctl: import of {path}: ")
    assert "Traceback" not in result.stderr
    assert "deep" not in ctl(managed, "list", "queues", "name").stdout.split()
    not_json = tmp_path / "not.json"
    not_json.write_bytes(b"\xff{")
    result = ctl(managed, "import", str(not_json), check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr


def test_config_files_without_the_management_keys(managed, tmp_path):
    """A warren.toml without management_bind (or empty) means the broker's
    defaults, as the broker reads it; a wrong value is named, not a traceback."""
    def run_with(text: str, **env) -> subprocess.CompletedProcess:
        (tmp_path / "warren.toml").write_text(text)
        return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "list",
                               "vhosts"], capture_output=True, text=True, timeout=30,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), **env})

    found = run_with(f"management_port = {managed.management_port}\n")
    assert found.returncode == 0, found.stderr
    # the URL from the environment, the user and password from the file's defaults
    found = run_with("", WARREN_MANAGEMENT_URL=managed.http_url)
    assert found.returncode == 0, found.stderr
    for text, said in [
            ('management_port = "x"\n', "management_port: expected int, got 'x'"),
            ("management_port = true\n", "management_port: expected int, got True"),
            ("management_port = 70000\n", "management_port: must be a port number"),
            ("management_bind = 1\n", "management_bind: expected str, got 1"),
            ('management_bind = "a/b"\n', "management_bind: not an address or host name"),
            ("default_user = []\n", "default_user: expected str, got []")]:
        result = run_with(text)
        assert result.returncode == 1, (text, result.stderr)
        assert result.stderr.startswith(f"warren ctl: warren.toml: {said}"), (text, result.stderr)
    (tmp_path / "warren.toml").write_bytes(b"port = \xff\n")
    result = subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "ctl", "list",
                             "vhosts"], capture_output=True, text=True, timeout=30,
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (result.returncode, result.stderr) == (
        1, "warren ctl: warren.toml: not valid TOML: not UTF-8 text\n")


def test_non_latin1_credentials_and_reasons(managed):
    """RabbitMQ reads Basic credentials and X-Reason as UTF-8: so does ctl send them."""
    ctl(managed, "add-user", "日本", "pässwörd", "--tags", "management")
    try:
        assert ctl(managed, "list", "vhosts", "-u", "日本", "-p", "pässwörd").returncode == 0
        wrong = ctl(managed, "list", "vhosts", "-u", "日本", "-p", "x", check=False)
        assert wrong.returncode == 1 and "Login failed" in wrong.stderr
    finally:
        ctl(managed, "delete-user", "日本")
    conn = pika.BlockingConnection(pika.URLParameters(managed.url))
    port = conn._impl._transport._sock.getsockname()[1]
    [name] = [row["name"] for row in json.loads(ctl(managed, "list", "connections", "--json"
                                                    ).stdout) if f":{port} ->" in row["name"]]
    ctl(managed, "close", "connection", f"name={name}", "reason=maintenance — 日本")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.process_data_events(0.05)
    assert "maintenance — 日本" in raised.value.reply_text


RABBITMQ_VHOST_EXPORT = ROOT / "tests" / "data" / "rabbitmq-3.10.8-vhost-definitions.json"


def test_export_and_import_of_one_vhost(managed, tmp_path):
    """As rabbitmqadmin's `-V v export` and `-V v import`: RabbitMQ's per-vhost form
    (no vhosts or users; queues, exchanges and bindings without their vhost), read
    into whichever vhost is named."""
    for name in ("ctl-from", "ctl-to"):
        ctl(managed, "add-vhost", name)
        ctl(managed, "-V", name, "set-permissions", "guest", ".*", ".*", ".*")
    try:
        imported = ctl(managed, "import", str(RABBITMQ_VHOST_EXPORT), "-V", "ctl-from")
        assert imported.stdout == (f"definitions imported from {RABBITMQ_VHOST_EXPORT} into "
                                   "vhost 'ctl-from'\n")
        bindings = ctl(managed, "list", "bindings", "-V", "ctl-from", "source", "destination",
                       "routing_key", "-f", "tsv").stdout.splitlines()
        assert "events\torders\torder.*" in bindings
        path = tmp_path / "one.json"
        ctl(managed, "export", str(path), "-V", "ctl-from")
        exported = json.loads(path.read_text())
        assert sorted(exported) == ["bindings", "exchanges", "parameters", "policies",
                                    "queues", "rabbit_version"]
        assert [(q["name"], q["arguments"], "vhost" in q) for q in exported["queues"]] == [
            ("orders", {"x-max-length": 100}, False)]
        assert [(p["name"], p["vhost"]) for p in exported["policies"]] == [("cap", "ctl-from")]
        ctl(managed, "import", str(path), "-V", "ctl-to")
        [queue] = json.loads(ctl(managed, "list", "queues", "-V", "ctl-to", "--json").stdout)
        assert (queue["name"], queue["arguments"]) == ("orders", {"x-max-length": 100})
        assert "events\torders\torder.*" in ctl(
            managed, "list", "bindings", "-V", "ctl-to", "source", "destination",
            "routing_key", "-f", "tsv").stdout.splitlines()
        missing = ctl(managed, "export", "-", "-V", "ctl-nowhere", check=False)
        assert (missing.returncode, missing.stderr) == (
            1, "warren ctl: export: no vhost 'ctl-nowhere' [404 Object Not Found]\n")
    finally:
        ctl(managed, "delete-vhost", "ctl-from")
        ctl(managed, "delete-vhost", "ctl-to")
