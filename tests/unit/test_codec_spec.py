"""gateway.amqp.spec: the tables generated from the vendored JSON spec, checked
against known values and against pamqp's independently generated commands."""

import json
import re
from pathlib import Path

import pytest
from pamqp import commands as pamqp_commands

from warren.gateway.amqp import spec

# CI clones the repository with shared/ beside it, as in the workplace.
SHARED_SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "amqp-rabbitmq-0.9.1.json"


def pamqp_name_to_ours(pamqp_name: str) -> str:
    """'Basic.RecoverAsync' -> 'basic.recover-async'."""
    class_name, method_name = pamqp_name.split(".")
    return class_name.lower() + "." + re.sub(r"(?<!^)([A-Z])", r"-\1", method_name).lower()


PAMQP_METHODS = {pamqp_name_to_ours(cls.name): cls for cls in pamqp_commands.INDEX_MAPPING.values()}
# pamqp renames arguments that would shadow a builtin.
PAMQP_RENAMES = {("exchange.declare", "type"): "exchange_type", ("properties", "type"): "message_type"}


def test_vendored_spec_is_the_shared_copy():
    if not SHARED_SPEC.exists():
        pytest.skip("shared spec not available")
    assert spec.SPEC == json.loads(SHARED_SPEC.read_text())


def test_constants():
    assert spec.CONSTANTS["FRAME_METHOD"] == 1
    assert spec.CONSTANTS["FRAME_HEADER"] == 2
    assert spec.CONSTANTS["FRAME_BODY"] == 3
    assert spec.CONSTANTS["FRAME_HEARTBEAT"] == 8
    assert spec.CONSTANTS["FRAME_MIN_SIZE"] == 4096
    assert spec.CONSTANTS["FRAME_END"] == 206
    assert spec.CONSTANTS["REPLY_SUCCESS"] == 200
    assert spec.CONSTANTS["NOT_FOUND"] == 404
    assert spec.CONSTANTS["PRECONDITION_FAILED"] == 406
    assert spec.CONSTANTS["CONNECTION_FORCED"] == 320
    assert len(spec.CONSTANTS) == len(spec.SPEC["constants"])
    for name, value in spec.CONSTANTS.items():
        assert getattr(spec, name) == value
    assert spec.FRAME_END == 206 and spec.NOT_FOUND == 404


def test_error_classes_and_reply_names():
    assert spec.HARD_ERRORS == {320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541}
    assert spec.SOFT_ERRORS == {311, 312, 313, 403, 404, 405, 406}
    assert spec.REPLY_NAMES[404] == "NOT_FOUND"
    assert spec.REPLY_NAMES[200] == "REPLY_SUCCESS"
    assert spec.REPLY_NAMES[320] == "CONNECTION_FORCED"
    # Every error code has a name; frame constants are not reply codes.
    assert spec.HARD_ERRORS | spec.SOFT_ERRORS <= set(spec.REPLY_NAMES)
    assert 206 not in spec.REPLY_NAMES and 1 not in spec.REPLY_NAMES


def test_class_ids():
    assert spec.CLASS_IDS == {
        "connection": 10,
        "channel": 20,
        "access": 30,
        "exchange": 40,
        "queue": 50,
        "basic": 60,
        "confirm": 85,
        "tx": 90,
    }


@pytest.mark.parametrize(
    "name, ids",
    [
        ("connection.start", (10, 10)),
        ("connection.close-ok", (10, 51)),
        ("connection.update-secret", (10, 70)),
        ("channel.close", (20, 40)),
        ("exchange.unbind-ok", (40, 51)),
        ("queue.declare-ok", (50, 11)),
        ("basic.publish", (60, 40)),
        ("basic.get-empty", (60, 72)),
        ("basic.nack", (60, 120)),
        ("confirm.select", (85, 10)),
        ("tx.commit-ok", (90, 21)),
    ],
)
def test_method_ids(name, ids):
    assert spec.method_id(name) == ids
    assert spec.METHODS_BY_ID[ids].name == name


def test_method_tables_are_consistent():
    count = sum(len(c["methods"]) for c in spec.SPEC["classes"])
    assert len(spec.METHODS_BY_ID) == len(spec.METHODS_BY_NAME) == count
    for (class_id, method_id), method in spec.METHODS_BY_ID.items():
        assert spec.METHODS_BY_NAME[method.name] is method
        assert (method.class_id, method.method_id) == (class_id, method_id)
        assert method.name == f"{method.class_name}.{method.method_name}"
        assert spec.CLASS_IDS[method.class_name] == class_id
        for arg in method.arguments:
            assert arg.type in spec.PRIMITIVE_TYPES


def test_py_names_and_domain_resolution():
    qos = spec.METHODS_BY_NAME["basic.qos"]
    assert [a.py_name for a in qos.arguments] == ["prefetch_size", "prefetch_count", "global_"]
    declare = spec.METHODS_BY_NAME["exchange.declare"]
    assert [a.py_name for a in declare.arguments][2:4] == ["type", "passive"]
    assert spec.py_name("no-wait") == "no_wait"
    # Domains resolve to primitive types.
    consume = spec.METHODS_BY_NAME["basic.consume"]
    assert consume.arguments[0].type == "short"  # domain 'short'
    assert consume.arguments[1].type == "shortstr"  # domain 'queue-name'
    declare_ok = spec.METHODS_BY_NAME["queue.declare-ok"]
    assert [a.type for a in declare_ok.arguments] == ["shortstr", "long", "long"]
    start = spec.METHODS_BY_NAME["connection.start"]
    assert start.arguments[2].type == "table"  # domain 'peer-properties'


def test_defaults():
    start = {a.py_name: a.default for a in spec.METHODS_BY_NAME["connection.start"].arguments}
    assert start == {
        "version_major": 0,
        "version_minor": 9,
        "server_properties": {},
        "mechanisms": b"PLAIN",  # longstr defaults become bytes
        "locales": b"en_US",
    }
    reject = {a.py_name: a.default for a in spec.METHODS_BY_NAME["basic.reject"].arguments}
    assert reject == {"delivery_tag": 0, "requeue": True}
    close = {a.py_name: a.default for a in spec.METHODS_BY_NAME["channel.close"].arguments}
    assert close == {"reply_code": 0, "reply_text": "", "class_id": 0, "method_id": 0}


def test_flags():
    assert spec.METHODS_BY_NAME["basic.publish"].has_content
    assert not spec.METHODS_BY_NAME["basic.publish"].synchronous
    assert spec.METHODS_BY_NAME["basic.get-ok"].has_content
    assert spec.METHODS_BY_NAME["queue.declare"].synchronous
    assert not spec.METHODS_BY_NAME["queue.declare-ok"].synchronous


def test_responses():
    assert spec.RESPONSES["basic.get"] == ("basic.get-ok", "basic.get-empty")
    assert spec.RESPONSES["queue.declare"] == ("queue.declare-ok",)
    assert spec.RESPONSES["connection.close"] == ("connection.close-ok",)
    assert "basic.publish" not in spec.RESPONSES
    for request, replies in spec.RESPONSES.items():
        assert spec.METHODS_BY_NAME[request].synchronous
        assert all(reply in spec.METHODS_BY_NAME for reply in replies)


def test_basic_properties():
    assert [p.py_name for p in spec.BASIC_PROPERTIES] == [
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    ]
    assert all(p.default is None for p in spec.BASIC_PROPERTIES)


# --- against pamqp -------------------------------------------------------------------


def test_pamqp_knows_the_same_methods():
    # pamqp leaves out the deprecated access class; everything else must match.
    ours = {name for name, m in spec.METHODS_BY_NAME.items() if m.class_name != "access"}
    assert set(PAMQP_METHODS) == ours


@pytest.mark.parametrize("name", sorted(PAMQP_METHODS))
def test_method_matches_pamqp(name):
    pamqp_cls = PAMQP_METHODS[name]
    ours = spec.METHODS_BY_NAME[name]
    assert pamqp_cls.frame_id == ours.method_id
    assert pamqp_cls.index == ours.class_id << 16 | ours.method_id
    assert pamqp_cls.synchronous == ours.synchronous
    pamqp_args = list(pamqp_cls.__slots__)
    assert pamqp_args == [PAMQP_RENAMES.get((name, a.py_name), a.py_name) for a in ours.arguments]
    assert [pamqp_cls.amqp_type(a) for a in pamqp_args] == [a.type for a in ours.arguments]
    pamqp_replies = {pamqp_name_to_ours(r) for r in pamqp_cls.valid_responses}
    assert pamqp_replies == set(spec.RESPONSES.get(name, ()))


def test_class_ids_match_pamqp():
    for class_name, class_id in spec.CLASS_IDS.items():
        if class_name == "access":
            continue
        assert getattr(pamqp_commands, class_name.capitalize()).frame_id == class_id


def test_basic_properties_match_pamqp():
    pamqp_props = pamqp_commands.Basic.Properties
    names = [PAMQP_RENAMES.get(("properties", p.py_name), p.py_name) for p in spec.BASIC_PROPERTIES]
    assert list(pamqp_props.__slots__) == names
    assert [pamqp_props.amqp_type(n) for n in names] == [p.type for p in spec.BASIC_PROPERTIES]
    # Property i is flagged by bit 15 - i of the first flag word.
    assert [pamqp_props.flags[n] for n in names] == [1 << (15 - i) for i in range(len(names))]
