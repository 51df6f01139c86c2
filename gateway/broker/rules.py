"""One declaration path for queues, exchanges and bindings, whichever door they
come in by: AMQP (session/declaring.py), the management API's PUT and POST,
and definitions import. Each is checked here once, with RabbitMQ's reply codes
and texts, and applied to the catalogue (broker/catalogue.py). Refusals are
AMQPErrors; each door words them its way (a channel closes, HTTP answers 400,
401 or 404, an import lists them). What only one door has stays there:
permissions (but for those a new queue or exchange needs on where it sends
messages, which a door passes in as `allow`), server-named queues, exclusive
ownership, passive declarations."""

from __future__ import annotations

from typing import Callable

from warren.storage.queuespec import QueueSpec

from ..amqp import spec
from ..errors import AMQPError, exchange_name, queue_name
from ..values import QueueMeta
from . import arguments
from .catalogue import Catalogue
from .exchange import EXCHANGE, EXCHANGE_TYPES, QUEUE, Exchange

# A door's permission check: allow(access, kind, name) raises its refusal.
Allow = Callable[[str, str, str], None]

# -- queues ---------------------------------------------------------------------


def check_queue_name(name: str) -> None:
    if name.startswith("amq."):
        raise AMQPError(spec.ACCESS_REFUSED,
                        f"queue name '{name}' contains reserved prefix 'amq.*'")


def check_queue(catalogue: Catalogue, queue: QueueSpec, server_named: bool = False,
                allow: Allow | None = None) -> None:
    """A new queue's refusals, in RabbitMQ's order: its name (unless the server chose
    it), its dead-letter exchange, its type's properties, its arguments, the vhost's
    queue limit."""
    if not server_named:
        check_queue_name(queue.name)
    what = queue_name(queue.vhost, queue.name)
    check_route(allow, QUEUE, queue.name, queue.arguments, "x-dead-letter-exchange", what)
    arguments.check_queue_type(queue.arguments, queue.durable, queue.exclusive,
                               queue.auto_delete, what)
    arguments.validate(queue.arguments, arguments.QUEUE_ARGUMENTS, what)
    limit = catalogue.vhost_limit(queue.vhost, "max-queues")
    # (none yet while an import that adds it is checked)
    vhost = catalogue.vhosts.get(queue.vhost)
    if 0 <= limit <= (len(vhost.queues) if vhost else 0):
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"cannot declare queue '{queue.name}' in vhost '{queue.vhost}': vhost "
                        f"queue limit ({limit}) is reached")


def check_equivalent_queue(current: QueueSpec, queue: QueueSpec) -> None:
    """406 when a redeclaration differs from the queue that exists."""
    what = queue_name(queue.vhost, queue.name)
    _equivalent("durable", what, queue.durable, current.durable)
    _equivalent("auto_delete", what, queue.auto_delete, current.auto_delete)
    arguments.assert_equivalent(queue.arguments, current.arguments, arguments.QUEUE_ARGUMENTS,
                                what)


def declare_queue(catalogue: Catalogue, queue: QueueSpec, owner=None,
                  server_named: bool = False,
                  allow: Allow | None = None) -> tuple[QueueMeta, bool]:
    """The queue `queue` describes, and whether it was created: an existing one must
    be equivalent, a new one pass check_queue. `owner` is the connection of an
    exclusive queue (whose exclusivity AMQP checks before this)."""
    existing = catalogue.vhosts[queue.vhost].queues.get(queue.name)
    if existing is not None:
        check_equivalent_queue(existing.spec, queue)
        return existing, False
    check_queue(catalogue, queue, server_named, allow)
    return catalogue.create_queue(queue, owner), True


# -- exchanges ------------------------------------------------------------------


def check_exchange_type(kind: str) -> None:
    if kind not in EXCHANGE_TYPES:
        raise AMQPError(spec.COMMAND_INVALID, f"unknown exchange type '{kind}'")


def check_exchange(exchange: Exchange, allow: Allow | None = None) -> None:
    """A new exchange's refusals: its type, its name, its alternate exchange, its
    arguments."""
    check_exchange_type(exchange.type)
    if exchange.name == "":
        raise AMQPError(spec.ACCESS_REFUSED, "operation not permitted on the default exchange")
    if exchange.name.startswith("amq."):
        raise AMQPError(spec.ACCESS_REFUSED,
                        f"exchange name '{exchange.name}' contains reserved prefix 'amq.*'")
    what = exchange_name(exchange.vhost, exchange.name)
    check_route(allow, EXCHANGE, exchange.name, exchange.arguments, "alternate-exchange", what)
    arguments.validate(exchange.arguments, arguments.EXCHANGE_ARGUMENTS, what)


def declare_exchange(catalogue: Catalogue, exchange: Exchange,
                     allow: Allow | None = None) -> tuple[Exchange, bool]:
    """The exchange `exchange` describes, and whether it was created: an existing one
    (a predeclared amq.* one too) must be equivalent, a new one pass check_exchange."""
    existing = catalogue.vhosts[exchange.vhost].exchanges.get(exchange.name)
    if existing is None:
        check_exchange(exchange, allow)
        catalogue.add_exchange(exchange)
        return exchange, True
    what = exchange_name(exchange.vhost, exchange.name)
    check_exchange_type(exchange.type)
    _equivalent("type", what, exchange.type, existing.type)
    _equivalent("durable", what, exchange.durable, existing.durable)
    _equivalent("auto_delete", what, exchange.auto_delete, existing.auto_delete)
    _equivalent("internal", what, exchange.internal, existing.internal)
    arguments.assert_equivalent(exchange.arguments, existing.arguments,
                                arguments.EXCHANGE_ARGUMENTS, what)
    return existing, False


# -- where a new queue or exchange sends messages ------------------------------------


def check_route(allow: Allow | None, kind: str, name: str, declared: dict, argument: str,
                what: str) -> None:
    """RabbitMQ's rule for a new queue's dead-letter exchange and a new exchange's
    alternate one: whoever declares it must be allowed to read it and to write to
    the exchange named, or it could send messages where it may not publish. 406
    first when the name is no string. Without `allow` (a door for administrators
    only) nothing but the type is checked."""
    target = arguments.exchange_named(declared, argument, what)
    if allow is not None and target is not None:
        allow("read", kind, name)
        allow("write", EXCHANGE, target)


# -- bindings -------------------------------------------------------------------


def binding_ends(catalogue: Catalogue, vhost: str, source: str, destination: tuple) -> tuple:
    """The source exchange and the destination (queue or exchange) of a binding;
    404 for the missing one, the source first (RabbitMQ's order)."""
    found = catalogue.vhosts[vhost]
    exchange = found.exchanges.get(source)
    if exchange is None:
        raise AMQPError(spec.NOT_FOUND, f"no {exchange_name(vhost, source)}")
    kind, name = destination
    target = (found.queues if kind == QUEUE else found.exchanges).get(name)
    if target is None:
        describe = queue_name if kind == QUEUE else exchange_name
        raise AMQPError(spec.NOT_FOUND, f"no {describe(vhost, name)}")
    return exchange, target


def bind(catalogue: Catalogue, vhost: str, source: str, destination: tuple,
         routing_key: str, binding_arguments: dict) -> None:
    """Bind `destination` ((QUEUE or EXCHANGE, name)) to the exchange `source`; both
    must exist, and neither end be the default exchange."""
    not_default(source)
    if destination[0] == EXCHANGE:
        not_default(destination[1])
    exchange, _ = binding_ends(catalogue, vhost, source, destination)
    catalogue.bind(exchange, destination, routing_key, binding_arguments)


def not_default(name: str) -> None:
    """RabbitMQ refuses every declaration, deletion and binding of the default
    exchange, a passive declaration included."""
    if name == "":
        raise AMQPError(spec.ACCESS_REFUSED, "operation not permitted on the default exchange")


def _equivalent(arg: str, what: str, received, current) -> None:
    if received != current:
        raise AMQPError(spec.PRECONDITION_FAILED,
                        f"inequivalent arg '{arg}' for {what}: received "
                        f"'{_show(received)}' but current is '{_show(current)}'")


def _show(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
