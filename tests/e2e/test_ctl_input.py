"""`warren ctl` answers whatever a user types and whatever a configuration file
holds with a result, a reason (exit 1) or its usage (exit 2), never a traceback:
in-process, the commands against a real broker, the files against no network."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from unittest import mock

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warren.gateway.cli import ctl, ctlclient

from ..support.broker import RunningBroker

pytestmark = [pytest.mark.slow, pytest.mark.run_once]  # its brokers choose their gateway processes

ENVIRONMENT = (ctlclient.URL_VARIABLE, ctlclient.USER_VARIABLE, ctlclient.PASSWORD_VARIABLE,
               ctlclient.CONFIG_VARIABLE)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A broker to talk to, and an empty working directory: whatever file a generated
    `export` names is written there."""
    broker = RunningBroker(tmp_path_factory.mktemp("ctl-input") / "data", shards=1,
                           management=True).start()
    workdir = tmp_path_factory.mktemp("ctl-cwd")
    (workdir / "defs.json").write_text('{"queues": [{"name": "fuzz", "vhost": "%2F"}]}')
    (workdir / "deep.json").write_text('{"a": ' * 3000 + "1" + "}" * 3000)
    (workdir / "binary").write_bytes(b"\xff\xfe\x00")
    yield broker, workdir
    broker.stop()


def run(argv: list[str], stdin: bytes = b"") -> tuple[int, str]:
    """Exit code and stderr of `warren ctl ARGV`, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin))):
        try:
            code = ctl.main(argv)
        except SystemExit as exit:  # argparse's usage errors and --help
            code = exit.code
    return code, err.getvalue()


def _leaves(parser: argparse.ArgumentParser, path: tuple = ()):
    """Each full command (('declare', 'queue'), ...) and the parser of its arguments."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*path, name))
            return
    yield path, parser


VALUES = ["", "-", "x", "0", "-1", "1", "99999999999999999999", "true", "maybe", "{}", "[]",
          '{"x-max-length": 2}', '{"a": {"b": []}}', "not json", "%2F", "..", "fuzz",
          "defs.json", "deep.json", "binary", "amq.direct", "amq.default", "日本", "a\nb",
          "a b", "\udcff", "http://127.0.0.1:9", "http://[::1", "http://127.0.0.1:99999",
          "localhost:abc", "ack_requeue_false", "base64", "queue", "exchange", "administrator"]
# free words may not hold "/" (no path outside the working directory) or ":" (no URL,
# so no name to look up or host to reach), nor NUL, which no command line can hold
FREE = st.text(st.characters(blacklist_characters="/:\x00", blacklist_categories=("Cs",)),
               max_size=12)
VALUE = st.one_of(st.sampled_from(VALUES), FREE)


def _value(action: argparse.Action) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(sorted(map(str, action.choices))), VALUE) \
        if action.choices else VALUE


@st.composite
def _typed(draw, path: tuple, parser: argparse.ArgumentParser) -> list[str]:
    """One command as a user might type it: its words, each argument a likely or an
    odd value, options in any order and either spelling, now and then a word too few
    or too many."""
    chunks = []  # positional arguments in order, options between them
    for action in parser._actions:
        if action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        count = draw(st.integers(0, 3)) if action.nargs == "*" else 1
        chunks += [[draw(_value(action))] for _ in range(count)]
    options = [a for a in parser._actions if a.option_strings
               and not isinstance(a, argparse._HelpAction)
               and a.dest not in ("url", "config")]  # the broker stays the one to reach
    chosen = [a for a in options if a.required]
    chosen += draw(st.lists(st.sampled_from(options), max_size=3))
    for action in chosen:
        if action.nargs == 0:
            chunk = [draw(st.sampled_from(action.option_strings))]
        elif draw(st.booleans()):  # rabbitmqadmin's name=value
            chunk = [f"{action.dest}={draw(_value(action))}"]
        else:
            chunk = [draw(st.sampled_from(action.option_strings)), draw(_value(action))]
        chunks.insert(draw(st.integers(0, len(chunks))), chunk)
    words = [*path, *(word for chunk in chunks for word in chunk)]
    slip = draw(st.integers(0, 9))
    if slip == 0 and len(words) > len(path):
        del words[draw(st.integers(len(path), len(words) - 1))]
    elif slip == 1:
        words.insert(draw(st.integers(0, len(words))), draw(VALUE))
    return words


COMMANDS = [(path, parser) for path, parser in _leaves(ctl._parser())]
TYPED = st.sampled_from(COMMANDS).flatmap(lambda leaf: _typed(*leaf))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.one_of(TYPED, st.lists(VALUE, max_size=4)), stdin=st.binary(max_size=20))
def test_anything_typed_is_answered_without_a_traceback(place, command, stdin):
    broker, workdir = place
    with mock.patch.dict(os.environ, {ctlclient.URL_VARIABLE: broker.http_url}), \
            contextlib.chdir(workdir):
        for name in ENVIRONMENT[1:]:
            os.environ.pop(name, None)
        # every command names the broker first; a generated --url may still win
        code, err = run(["--url", broker.http_url, *command], stdin)
    # 64 and 69: the quorum commands' usage and not-found errors, rabbitmq-queues' codes
    assert code in (0, 1, 2, 64, 69), (command, code, err)
    assert "Traceback" not in err


def _toml_value() -> st.SearchStrategy[str]:
    return st.sampled_from([
        '"127.0.0.1"', '"0.0.0.0"', '"::"', '"::1"', '""', '"localhost"', '"host name"',
        '"a/b"', '"[::1"', '"日本"', '"x@y"', '"%"', "15672", "0", "-1", "65536", "70000",
        "1.5", "nan", "true", "[1]", '["a"]', "{a = 1}", "1979-05-27", "08:00:00",
        '"\\u0000"', '"a\\nb"', "2_000"])


CONFIG_LINE = st.tuples(
    st.sampled_from(["management_bind", "management_port", "default_user", "default_pass",
                     "port", "colour", "[section]", "management_port.x"]),
    _toml_value()).map(lambda pair: pair[0] if pair[0].startswith("[")
                       else f"{pair[0]} = {pair[1]}")
CONFIG = st.one_of(st.lists(CONFIG_LINE, max_size=6).map("\n".join).map(str.encode),
                   st.binary(max_size=40), st.text(max_size=40).map(str.encode))


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ctl-config")


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(content=CONFIG, via=st.sampled_from(["option", "environment", "working directory"]))
def test_any_configuration_file_is_answered_without_a_traceback(config_dir, content, via):
    """Whatever the file holds, ctl uses it or names what is wrong; the request is
    stopped where it would leave (no host a file names is ever reached)."""
    workdir = config_dir
    (workdir / "warren.toml").write_bytes(content)
    refused = requests.ConnectionError("refused")
    options = ["-c", "warren.toml"] if via == "option" else []
    environment = {ctlclient.CONFIG_VARIABLE: "warren.toml"} if via == "environment" else {}
    with mock.patch.dict(os.environ, environment), contextlib.chdir(workdir), \
            mock.patch.object(requests.adapters.HTTPAdapter, "send", side_effect=refused):
        for name in ENVIRONMENT[:3] + ((ctlclient.CONFIG_VARIABLE,) if not environment else ()):
            os.environ.pop(name, None)
        code, err = run([*options, "list", "vhosts"])
    assert code == 1, err
    assert "Traceback" not in err
    assert err.startswith(("warren ctl: cannot reach ", "warren ctl: warren.toml: ")), err
