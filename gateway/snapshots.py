"""Public, typed views of the gateway's state for the management API and the
metrics: what a connection, a channel and a consumer look like at one moment
(made by their snapshot() methods), and the broker's running totals. The
management code reads these, never the objects' private attributes, so the
connection and channel can change inside without breaking it."""

from __future__ import annotations

import msgspec


class ConsumerInfo(msgspec.Struct, frozen=True):
    tag: str
    vhost: str
    queue: str
    ack_required: bool
    prefetch_count: int
    exclusive: bool
    timed_out: bool  # cancelled by its timeout, listed until its deliveries are settled
    timeout_ms: int  # its consumer timeout, 0 when none
    arguments: dict
    holder: int = 0  # its id, which a stream's figures name its offset by


class ChannelInfo(msgspec.Struct, frozen=True):
    number: int
    consumers: tuple[ConsumerInfo, ...]
    consumer_count: int  # the consumers, and a direct reply-to consumer
    messages_unacknowledged: int
    messages_unconfirmed: int  # published in confirm mode, not yet confirmed
    prefetch_count: int  # basic.qos global=false: each new consumer's limit
    global_prefetch_count: int  # basic.qos global=true: the channel's limit
    confirm: bool
    transactional: bool
    closing: bool


class ConnectionInfo(msgspec.Struct, frozen=True):
    name: str  # "peer_host:peer_port -> host:port", as RabbitMQ names it
    user: str
    vhost: str
    peer_host: str
    peer_port: int
    host: str
    port: int
    tls: bool
    state: str  # running, flow, blocked or closing
    client_properties: dict
    connected_at: float  # seconds since the epoch
    frame_max: int
    channel_max: int
    heartbeat: int
    recv_oct: int  # bytes read from the socket
    recv_cnt: int  # socket reads
    send_oct: int  # bytes written
    send_cnt: int  # socket writes
    channels: tuple[ChannelInfo, ...]

    @property
    def user_provided_name(self) -> str | None:
        """The name the client gave itself (client property connection_name)."""
        name = self.client_properties.get("connection_name")
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        return name if isinstance(name, str) else None


class Totals:
    """Broker-wide counters since start, as RabbitMQ's rabbitmq_global_* and
    rabbitmq_*_opened/closed_total metrics count them; plain integers bumped on
    the hot path."""

    # the counters, as __slots__ names them in this order (as_dict's keys)
    connections_opened: int
    connections_closed: int
    channels_opened: int
    channels_closed: int
    received: int
    received_confirm: int
    routed: int
    unroutable_dropped: int
    unroutable_returned: int
    confirmed: int
    consume_manual_ack: int
    consume_auto_ack: int
    get_manual_ack: int
    get_auto_ack: int
    get_empty: int
    redelivered: int
    acknowledged: int
    queues_declared: int
    queues_created: int
    queues_deleted: int
    __slots__ = tuple(__annotations__)

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    @property
    def delivered(self) -> int:
        """Deliveries to consumers and basic.get answers with a message."""
        return (self.consume_manual_ack + self.consume_auto_ack + self.get_manual_ack
                + self.get_auto_ack)

    def as_dict(self) -> dict[str, int]:
        return {**{name: getattr(self, name) for name in self.__slots__},
                "delivered": self.delivered}
