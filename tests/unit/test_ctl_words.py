"""`warren ctl`'s reading of rabbitmqadmin's name=value words (cli/ctl.py), in-process.
tests/e2e/test_ctl.py runs the commands against a broker."""

from __future__ import annotations


def test_name_value_words_become_options_only_where_rabbitmqadmin_has_them():
    from warren.gateway.cli.ctl import _rabbitmqadmin_style as rewrite

    assert rewrite(["-V", "v", "declare", "binding", "source=x", "--routing-key", "a=b",
                    "routing_key=k=1"]) == [
        "-V", "v", "declare", "binding", "--source=x", "--routing-key", "a=b",
        "--routing-key=k=1"]
    assert rewrite(["--json", "declare", "user", "name=u", "password=p"]) == [
        "--json", "declare", "user", "--name=u", "--new-password=p"]
    # a vhost named like a verb, and other commands' arguments, stay as they are
    assert rewrite(["--vhost", "delete", "list", "queues"]) == [
        "--vhost", "delete", "list", "queues"]
    assert rewrite(["set-policy", "purge", "^a=", "{}"]) == ["set-policy", "purge", "^a=", "{}"]
