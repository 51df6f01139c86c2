"""An exchange and its bindings: which destinations a message goes to.

A destination is ("queue", name) or ("exchange", name). A binding is the
triple (destination, routing key, arguments); two bindings that differ only in
their arguments are distinct, as in RabbitMQ. Each type keeps an index suited
to its matching: direct a dict by key, topic a trie, fanout the set of
destinations, headers a list of (arguments, destination) it matches in turn.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable

from .topic import TopicTrie

if TYPE_CHECKING:
    from warren.storage.metastore import PolicyDef

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
QUEUE = "queue"
RENEW_EXCHANGE = "amq.warren.renew"  # lock renewal (see Channel._renew), routes nothing
EXCHANGE = "exchange"


def arguments_key(arguments: dict) -> str:
    """A canonical, hashable form of binding arguments."""
    return repr(sorted(arguments.items())) if arguments else ""


class Exchange:
    __slots__ = ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments",
                 "alternate", "policy", "bindings", "_direct", "_trie", "_fanout", "_headers")

    def __init__(self, vhost: str, name: str, type: str, durable: bool = True,
                 auto_delete: bool = False, internal: bool = False, arguments: dict | None = None):
        self.vhost = vhost
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.policy: PolicyDef | None = None  # the policy that applies to it (policies.py)
        value = self.arguments.get("alternate-exchange")
        self.alternate: str | None = value if isinstance(value, str) and value else None
        # (destination, routing key, arguments key) -> arguments
        self.bindings: dict[tuple, dict] = {}
        self._direct: dict[str, Counter] = {}  # routing key -> destination -> bindings
        self._trie = TopicTrie() if type == "topic" else None
        self._fanout: Counter = Counter()  # fanout and topic: destination -> bindings
        self._headers: list[tuple[dict, tuple]] = []

    def bind(self, destination: tuple, routing_key: str, arguments: dict) -> bool:
        """Add a binding; False if it existed already."""
        key = (destination, routing_key, arguments_key(arguments))
        if key in self.bindings:
            return False
        self.bindings[key] = arguments
        if self.type == "headers":
            self._headers.append((arguments, destination))
        elif self.type == "fanout":
            self._fanout[destination] += 1
        else:
            counts = self._direct.setdefault(routing_key, Counter())
            counts[destination] += 1
            if self._trie is not None and counts[destination] == 1:
                self._trie.add(routing_key, destination)
        return True

    def unbind(self, destination: tuple, routing_key: str, arguments: dict) -> bool:
        """Remove a binding; False if there was none."""
        key = (destination, routing_key, arguments_key(arguments))
        if self.bindings.pop(key, None) is None:
            return False
        if self.type == "headers":
            self._headers = [(a, d) for a, d in self._headers
                             if not (d == destination and arguments_key(a) == key[2])]
        elif self.type == "fanout":
            _decrement(self._fanout, destination)
        else:
            counts = self._direct[routing_key]
            _decrement(counts, destination)
            if destination not in counts:
                if self._trie is not None:
                    self._trie.remove(routing_key, destination)
                if not counts:
                    del self._direct[routing_key]
        return True

    def has_binding(self, destination: tuple, routing_key: str, arguments: dict) -> bool:
        return (destination, routing_key, arguments_key(arguments)) in self.bindings

    def route(self, routing_key: str, headers: Callable[[], dict]) -> set[tuple]:
        """The destinations of a message; `headers()` gives its headers (decoded only
        when a headers exchange asks)."""
        if self.type == "direct":
            counts = self._direct.get(routing_key)
            return set(counts) if counts else set()
        if self.type == "fanout":
            return set(self._fanout)
        if self._trie is not None:
            return self._trie.match(routing_key)
        if not self._headers:
            return set()
        message_headers = headers()
        return {destination for arguments, destination in self._headers
                if headers_match(arguments, message_headers)}


def _decrement(counts: Counter, destination: tuple) -> None:
    counts[destination] -= 1
    if counts[destination] <= 0:
        del counts[destination]


def headers_match(binding: dict, headers: dict) -> bool:
    """RabbitMQ's headers matching. x-match: 'all' (default) or 'any' compare the
    binding's arguments but those starting with 'x-', and ignore message headers
    starting with 'x-'; 'all-with-x' and 'any-with-x' include them. A binding
    argument with no value (void) matches the header's presence."""
    mode = binding.get("x-match", "all")
    with_x = mode in ("all-with-x", "any-with-x")
    want_all = mode in ("all", "all-with-x")
    matched = False
    for name, expected in binding.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        present = name in headers
        ok = present and (expected is None or _same_value(headers[name], expected))
        if want_all and not ok:
            return False
        if ok:
            if not want_all:
                return True
            matched = True
    return want_all or matched


def _same_value(a, b) -> bool:
    # Booleans are not integers here: header true does not match argument 1.
    return a == b and isinstance(a, bool) == isinstance(b, bool)
