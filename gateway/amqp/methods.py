"""AMQP 0-9-1 method frame payloads: one Python class per spec method.

The classes (``ConnectionStart``, ``BasicPublish``, ``BasicRecoverAsync``, ...)
are generated at import time from ``spec.METHODS_BY_ID``.  So is each class's
codec: like ``collections.namedtuple`` and ``dataclasses``, we write the source
of a straight-line ``encode``/``decode`` function per method and ``exec`` it,
so a call runs no per-argument interpretation.  Runs of fixed-width arguments
(integers and packed bit octets) become one precompiled ``struct.Struct``.
The generated source is kept on each class as ``_CODEC_SOURCE`` for reading.

Argument Python types: bit -> bool; octet, short, long, longlong, timestamp ->
int; shortstr -> str (UTF-8); longstr -> bytes (str, bytearray, memoryview
accepted on encode); table -> dict.

Decoding is strict like RabbitMQ's generated parser (rabbit_framing_amqp_0_9_1
matches the whole argument binary): a payload must contain exactly the
arguments, so truncated payloads *and trailing bytes* raise MalformedMethod.
Reserved bits in a bit octet are ignored.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from . import spec
from .fieldtable import FieldTableError, decode_table, encode_table
from .spec import ArgSpec, MethodSpec
from .strings import decode_longstr, decode_shortstr, encode_longstr, encode_shortstr


class CodecError(ValueError):
    """A method that cannot be encoded or decoded."""


class UnknownMethod(CodecError):
    """A (class-id, method-id) pair that is not in the spec."""

    def __init__(self, class_id: int, method_id: int) -> None:
        super().__init__(f"unknown method (class-id {class_id}, method-id {method_id})")
        self.class_id = class_id
        self.method_id = method_id


class MalformedMethod(CodecError):
    """A known method whose arguments are truncated, undecodable or followed by extra bytes."""


_METHOD_HEADER = Struct(">HH")  # class-id, method-id

# Integer arguments are unsigned on the wire.
_INT_FORMATS = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}


# Variable-length types: spec type -> (encoder, decoder) names in the codec namespace.
_VARIABLE_CODECS = {
    "shortstr": ("encode_shortstr", "decode_shortstr"),
    "longstr": ("encode_longstr", "decode_longstr"),
    "table": ("encode_table", "decode_table"),
}
_CODEC_GLOBALS = {
    "encode_shortstr": encode_shortstr,
    "decode_shortstr": decode_shortstr,
    "encode_longstr": encode_longstr,
    "decode_longstr": decode_longstr,
    "encode_table": encode_table,
    "decode_table": decode_table,
    "_new": object.__new__,
}


# --- codec generation ----------------------------------------------------------------


def _segments(arguments: tuple[ArgSpec, ...]) -> list[tuple[str, Any]]:
    """Group arguments into ('fixed', items) runs and ('shortstr'|'longstr'|'table', name).

    A fixed item is (kind, names, struct format): an integer argument
    ('int', [name], 'H') or a bit octet ('bits', [names], 'B'). Consecutive
    bits share an octet (the first in the least significant bit); a ninth bit
    starts a new one.
    """
    segments: list[tuple[str, Any]] = []
    previous_type = None
    for arg in arguments:
        if arg.type == "bit" or arg.type in _INT_FORMATS:
            if not segments or segments[-1][0] != "fixed":
                segments.append(("fixed", []))
            items = segments[-1][1]
            if arg.type != "bit":
                items.append(("int", [arg.py_name], _INT_FORMATS[arg.type]))
            elif previous_type == "bit" and len(items[-1][1]) < 8:
                items[-1][1].append(arg.py_name)
            else:
                items.append(("bits", [arg.py_name], "B"))
        else:
            segments.append((arg.type, arg.py_name))
        previous_type = arg.type
    return segments


def _codec_source(method: MethodSpec, namespace: dict[str, Any]) -> str:
    """Source of encode(m) -> bytes and decode(buf, offset) -> (method, offset).

    Structs the code refers to are added to namespace.
    """
    encode_parts: list[str] = []
    decode_lines: list[str] = ["m = _new(_cls)"]
    for index, (kind, detail) in enumerate(_segments(method.arguments)):
        if kind != "fixed":
            encoder, decoder = _VARIABLE_CODECS[kind]
            encode_parts.append(f"{encoder}(m.{detail})")
            decode_lines.append(f"m.{detail}, offset = {decoder}(buf, offset)")
            continue

        values, targets, bit_lines, wire_format = [], [], [], ""
        for item_kind, names, item_format in detail:
            wire_format += item_format
            if item_kind == "int":
                values.append(f"m.{names[0]}")
                targets.append(f"m.{names[0]}")
            else:
                octet = f"octet{len(targets)}"
                values.append(" | ".join(f"({1 << bit} if m.{name} else 0)" for bit, name in enumerate(names)))
                targets.append(octet)
                bit_lines += [f"m.{name} = bool({octet} & {1 << bit})" for bit, name in enumerate(names)]
        unpacker = Struct(">" + wire_format)
        namespace[f"_unpack{index}"] = unpacker.unpack_from
        decode_lines.append(f"{', '.join(targets)}, = _unpack{index}(buf, offset)")
        decode_lines.append(f"offset += {unpacker.size}")
        decode_lines += bit_lines
        if index == 0:
            # The first run carries the class-id and method-id too.
            namespace[f"_pack{index}"] = Struct(">HH" + wire_format).pack
            values = [str(method.class_id), str(method.method_id)] + values
        else:
            namespace[f"_pack{index}"] = unpacker.pack
        encode_parts.append(f"_pack{index}({', '.join(values)})")

    if not encode_parts or not encode_parts[0].startswith("_pack0("):
        namespace["_prefix"] = _METHOD_HEADER.pack(method.class_id, method.method_id)
        encode_parts.insert(0, "_prefix")
    encoded = encode_parts[0] if len(encode_parts) == 1 else f'b"".join(({", ".join(encode_parts)},))'
    return (
        f"# {method.name}\n"
        f"def encode(m):\n    return {encoded}\n\n"
        f"def decode(buf, offset):\n    " + "\n    ".join(decode_lines + ["return m, offset"]) + "\n"
    )


def _make_codec(cls: type[Method]) -> tuple[Callable[..., bytes], Callable[..., Any], str]:
    namespace: dict[str, Any] = dict(_CODEC_GLOBALS, _cls=cls)
    source = _codec_source(cls.SPEC, namespace)
    exec(compile(source, f"<codec {cls.NAME}>", "exec"), namespace)
    return namespace["encode"], namespace["decode"], source


def _make_init(arguments: tuple[ArgSpec, ...]) -> Callable[..., None]:
    """A keyword-only __init__ with the spec's defaults."""
    namespace: dict[str, Any] = {}
    params, body = [], []
    for arg in arguments:
        if arg.type == "table":
            # A fresh dict per instance; None also means an empty table.
            params.append(f"{arg.py_name}=None")
            body.append(f"self.{arg.py_name} = {{}} if {arg.py_name} is None else {arg.py_name}")
        else:
            namespace[f"_default_{arg.py_name}"] = arg.default
            params.append(f"{arg.py_name}=_default_{arg.py_name}")
            body.append(f"self.{arg.py_name} = {arg.py_name}")
    signature = "self, *, " + ", ".join(params) if params else "self"
    source = f"def __init__({signature}):\n    " + ("\n    ".join(body) or "pass")
    exec(source, namespace)
    return namespace["__init__"]


# --- the Method base class and its generated subclasses ---------------------------


class Fields:
    """Equal when of one type with equal FIELDS; mutable, so not hashable. Methods
    and basic properties share it."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]]

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.FIELDS)

    __hash__ = None  # type: ignore[assignment]


class Method(Fields):
    """Base class of all generated method classes."""

    __slots__ = ()

    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    NAME: ClassVar[str]  # 'basic.publish'
    SPEC: ClassVar[MethodSpec]
    SYNCHRONOUS: ClassVar[bool]
    HAS_CONTENT: ClassVar[bool]
    # FIELDS: py names, in wire order
    _encode: ClassVar[staticmethod[[Method], bytes]]
    _decode: ClassVar[staticmethod[[Any, int], tuple[Method, int]]]
    _CODEC_SOURCE: ClassVar[str]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({fields})"


def _camel_case(method: MethodSpec) -> str:
    words = [method.class_name] + method.method_name.split("-")
    return "".join(word.capitalize() for word in words)


def _make_method_class(method: MethodSpec) -> type[Method]:
    fields = tuple(arg.py_name for arg in method.arguments)
    class_name = _camel_case(method)
    cls: type[Method] = type(
        class_name,
        (Method,),
        {
            "__slots__": fields,
            "__init__": _make_init(method.arguments),
            "__module__": __name__,
            "__qualname__": class_name,
            "__doc__": f"AMQP {method.name} ({method.class_id}, {method.method_id}).",
            "CLASS_ID": method.class_id,
            "METHOD_ID": method.method_id,
            "NAME": method.name,
            "SPEC": method,
            "SYNCHRONOUS": method.synchronous,
            "HAS_CONTENT": method.has_content,
            "FIELDS": fields,
        },
    )
    encode, decode, source = _make_codec(cls)
    cls._encode = staticmethod(encode)
    cls._decode = staticmethod(decode)
    cls._CODEC_SOURCE = source
    return cls


BY_ID: dict[tuple[int, int], type[Method]] = {}
BY_NAME: dict[str, type[Method]] = {}
for _method_spec in spec.METHODS_BY_ID.values():
    _cls = _make_method_class(_method_spec)
    BY_ID[(_cls.CLASS_ID, _cls.METHOD_ID)] = _cls
    BY_NAME[_cls.NAME] = _cls
    globals()[_cls.__name__] = _cls
del _method_spec, _cls
if TYPE_CHECKING:  # the classes made above, which a type checker cannot see
    def __getattr__(name: str) -> Any: ...

__all__ = [
    "CodecError",
    "UnknownMethod",
    "MalformedMethod",
    "Method",
    "BY_ID",
    "BY_NAME",
    "encode_method",
    "decode_method",
] + [cls.__name__ for cls in BY_ID.values()]


# --- encode / decode ---------------------------------------------------------------


def encode_method(method: Method) -> bytes:
    """The method frame payload: class-id, method-id, then the arguments."""
    try:
        return method._encode(method)
    except (StructError, TypeError, ValueError) as exc:  # includes FieldTableError, UnicodeError
        raise CodecError(f"cannot encode {method!r}: {exc}") from exc


def decode_method(payload: bytes | bytearray | memoryview) -> Method:
    """Decode a method frame payload. Raises UnknownMethod or MalformedMethod."""
    if isinstance(payload, memoryview) and (payload.format != "B" or payload.ndim != 1):
        payload = payload.cast("B")
    if len(payload) < 4:
        raise MalformedMethod("method frame payload shorter than class-id + method-id")
    class_id, method_id = _METHOD_HEADER.unpack_from(payload, 0)
    cls = BY_ID.get((class_id, method_id))
    if cls is None:
        raise UnknownMethod(class_id, method_id)
    try:
        method, offset = cls._decode(payload, 4)
    except MalformedMethod as exc:
        raise MalformedMethod(f"{cls.NAME}: {exc}") from None
    except (StructError, IndexError):
        raise MalformedMethod(f"{cls.NAME}: truncated arguments") from None
    except UnicodeDecodeError:
        raise MalformedMethod(f"{cls.NAME}: shortstr is not valid UTF-8") from None
    except FieldTableError as exc:
        raise MalformedMethod(f"{cls.NAME}: bad field table: {exc}") from None
    if offset != len(payload):
        raise MalformedMethod(f"{cls.NAME}: {len(payload) - offset} unexpected bytes after the arguments")
    return method
