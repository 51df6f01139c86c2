"""The AMQP 0-9-1 specification (RabbitMQ's dialect), loaded from the vendored JSON.

Everything protocol-numeric -- constants, reply codes, class and method ids,
argument order, types and defaults -- comes from ``amqp-rabbitmq-0.9.1.json``
at import time, so nothing here is typed by hand.  The codec modules
(``fieldtable``, ``methods``, ``properties``) are generated from these tables.
"""

from __future__ import annotations

import json
import keyword
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

SPEC_PATH = Path(__file__).with_name("amqp-rabbitmq-0.9.1.json")
SPEC: dict[str, Any] = json.loads(SPEC_PATH.read_text(encoding="utf-8"))

#: The wire-level types that domains eventually resolve to.
PRIMITIVE_TYPES = frozenset(
    {"bit", "octet", "short", "long", "longlong", "shortstr", "longstr", "table", "timestamp"}
)

#: The value an argument takes when neither the caller nor the spec gives one.
TYPE_ZERO: dict[str, Any] = {
    "bit": False,
    "octet": 0,
    "short": 0,
    "long": 0,
    "longlong": 0,
    "timestamp": 0,
    "shortstr": "",
    "longstr": b"",
    "table": {},
}


def _constant_name(spec_name: str) -> str:
    return spec_name.replace("-", "_").upper()


def py_name(spec_name: str) -> str:
    """'no-wait' -> 'no_wait'; Python keywords get a trailing '_' ('global' -> 'global_')."""
    name = spec_name.replace("-", "_")
    return name + "_" if keyword.iskeyword(name) else name


# --- constants and reply codes -------------------------------------------------

CONSTANTS: dict[str, int] = {_constant_name(c["name"]): c["value"] for c in SPEC["constants"]}
# Also exported as module attributes: spec.FRAME_END, spec.NOT_FOUND, ...
globals().update(CONSTANTS)
if TYPE_CHECKING:  # which a type checker cannot see
    def __getattr__(name: str) -> int: ...

HARD_ERRORS: frozenset[int] = frozenset(
    c["value"] for c in SPEC["constants"] if c.get("class") == "hard-error"
)
SOFT_ERRORS: frozenset[int] = frozenset(
    c["value"] for c in SPEC["constants"] if c.get("class") == "soft-error"
)

#: Reply code -> name, for reply texts such as 'NOT_FOUND - no queue ...'.
#: Reply codes are the error constants (those with a class) plus REPLY-SUCCESS;
#: the rest are frame constants (FRAME-END is 206, so value ranges won't do).
REPLY_NAMES: dict[int, str] = {
    c["value"]: _constant_name(c["name"])
    for c in SPEC["constants"]
    if "class" in c or c["name"].startswith("REPLY-")
}


# --- domains, arguments, methods ----------------------------------------------

DOMAINS: dict[str, str] = {name: type_ for name, type_ in SPEC["domains"]}


def resolve_type(domain_or_type: str) -> str:
    """Follow domain aliases down to a primitive wire type."""
    seen = []
    name = domain_or_type
    while name not in PRIMITIVE_TYPES:
        if name in seen or name not in DOMAINS:
            raise ValueError(f"cannot resolve AMQP domain {domain_or_type!r}")
        seen.append(name)
        name = DOMAINS[name]
    return name


class ArgSpec(NamedTuple):
    """One method argument or content property."""

    name: str  # as in the spec: 'no-wait'
    py_name: str  # attribute name: 'no_wait'
    type: str  # resolved primitive type: 'bit', 'shortstr', ...
    default: Any  # effective default (spec default-value, else the type's zero)


class MethodSpec(NamedTuple):
    class_name: str  # 'basic'
    method_name: str  # 'publish'
    class_id: int
    method_id: int
    name: str  # 'basic.publish'
    arguments: tuple[ArgSpec, ...]
    synchronous: bool
    has_content: bool


def _arg_spec(arg: dict[str, Any]) -> ArgSpec:
    type_ = resolve_type(arg.get("type") or arg["domain"])
    default = arg.get("default-value", TYPE_ZERO[type_])
    if type_ == "longstr" and isinstance(default, str):
        default = default.encode("utf-8")  # longstr values are bytes
    return ArgSpec(arg["name"], py_name(arg["name"]), type_, default)


def _property_spec(prop: dict[str, Any]) -> ArgSpec:
    # Content properties are optional: absent (None) unless set.
    return ArgSpec(prop["name"], py_name(prop["name"]), resolve_type(prop.get("type") or prop["domain"]), None)


CLASS_IDS: dict[str, int] = {c["name"]: c["id"] for c in SPEC["classes"]}
CLASS_NAMES: dict[int, str] = {class_id: name for name, class_id in CLASS_IDS.items()}

METHODS_BY_ID: dict[tuple[int, int], MethodSpec] = {}
METHODS_BY_NAME: dict[str, MethodSpec] = {}
for _cls in SPEC["classes"]:
    for _m in _cls["methods"]:
        _method = MethodSpec(
            class_name=_cls["name"],
            method_name=_m["name"],
            class_id=_cls["id"],
            method_id=_m["id"],
            name=f"{_cls['name']}.{_m['name']}",
            arguments=tuple(_arg_spec(a) for a in _m["arguments"]),
            synchronous=bool(_m.get("synchronous", False)),
            has_content=bool(_m.get("content", False)),
        )
        METHODS_BY_ID[(_method.class_id, _method.method_id)] = _method
        METHODS_BY_NAME[_method.name] = _method
del _cls, _m, _method


def method_id(name: str) -> tuple[int, int]:
    """'basic.publish' -> (60, 40)."""
    m = METHODS_BY_NAME[name]
    return m.class_id, m.method_id


# The JSON has no <response> elements, so replies are inferred: a synchronous
# request is answered by its '-ok' method.  basic.get is the one request with a
# second possible reply (basic.get-empty), as in the XML spec's <response> list.
_EXTRA_RESPONSES = {"basic.get": ("basic.get-empty",)}

#: Synchronous request name -> the names of the methods that may answer it.
RESPONSES: dict[str, tuple[str, ...]] = {
    m.name: (m.name + "-ok",) + tuple(r for r in _EXTRA_RESPONSES.get(m.name, ()) if r in METHODS_BY_NAME)
    for m in METHODS_BY_NAME.values()
    if m.synchronous and m.name + "-ok" in METHODS_BY_NAME
}

BASIC_PROPERTIES: tuple[ArgSpec, ...] = tuple(
    _property_spec(p) for p in next(c for c in SPEC["classes"] if c["name"] == "basic")["properties"]
)
