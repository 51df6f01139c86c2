"""How a batch of ring records (records.py) becomes one ring record and back.

A batch is one msgpack array, so a loop turn's work for a shard (or a shard's
events for a gateway) costs one encode, one ring write and one doorbell. Large
bodies travel beside the msgpack instead of inside it (SIDE_BODY_MIN). Both
processes run these on every turn, so pip install compiles the module as it is
(warren.shards._batches: setup.py); this file stays the pure twin.
"""

from __future__ import annotations

import struct

import msgspec

from . import records as r

_command_encoder = msgspec.msgpack.Encoder()
_command_batch_decoder = msgspec.msgpack.Decoder(list[r.Command])
_event_batch_decoder = msgspec.msgpack.Decoder(list[r.Event])

# Bodies of at least this many bytes travel beside the batch instead of inside its
# msgpack: written into the ring once and copied out once, where msgpack would copy
# each twice more (encode, decode). Below it the bookkeeping costs more than the
# copies it saves (measured per message through a ring, encode to decode: 8 KiB
# 2.0 us inline, 2.8 us beside; 16 KiB 5.9 and 4.5; 64 KiB 11.3 and 9.8).
SIDE_BODY_MIN = 16 * 1024
_BODIED = (r.Publish, r.Deliver, r.GetReply)
# A record with side bodies: this marker (a byte msgpack never uses), the length
# of the batch's msgpack and the number of side bodies, then per side body its
# record's index in the batch and its length; the msgpack; the bodies in order.
_SIDE_MARKER = 0xC1
_side_prefix = struct.Struct("<BII")
_side_entry = struct.Struct("<II")


def encode_batch(records: list) -> bytes | list:
    """One ring record for a batch: bytes, or a list of pieces when large bodies
    go beside it (the ring writes pieces back to back, each copied once)."""
    side = []  # a loop, not a comprehension: one Python frame less a turn
    for i, record in enumerate(records):
        if type(record) in _BODIED and len(record.body) >= SIDE_BODY_MIN:
            side.append(i)
    if not side:
        return _command_encoder.encode(records)
    bodies = []
    for i in side:
        bodies.append(records[i].body)
        records[i].body = b""
    try:
        head = _command_encoder.encode(records)
    finally:
        for i, body in zip(side, bodies):
            records[i].body = body
    table = b"".join(_side_entry.pack(i, len(body)) for i, body in zip(side, bodies))
    return [_side_prefix.pack(_SIDE_MARKER, len(head), len(side)) + table, head, *bodies]


def _decode_sided(decoder: msgspec.msgpack.Decoder, batch) -> list:
    """Decode a ring record with side bodies (a view of the ring, or bytes); they
    are copied out of it once, into their records."""
    _, head_size, count = _side_prefix.unpack_from(batch, 0)
    pos = _side_prefix.size + count * _side_entry.size
    with memoryview(batch) as view:
        records = decoder.decode(view[pos:pos + head_size])
        pos += head_size
        for n in range(count):
            i, size = _side_entry.unpack_from(view, _side_prefix.size + n * _side_entry.size)
            records[i].body = bytes(view[pos:pos + size])
            pos += size
    return records


def decode_commands(batch) -> list:
    if batch[0] != _SIDE_MARKER:  # the common record: one call, no helper's frame
        return _command_batch_decoder.decode(batch)
    return _decode_sided(_command_batch_decoder, batch)


def decode_events(batch) -> list:
    if batch[0] != _SIDE_MARKER:
        return _event_batch_decoder.decode(batch)
    return _decode_sided(_event_batch_decoder, batch)
