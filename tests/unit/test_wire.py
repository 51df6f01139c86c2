"""The inter-node link's wire (gateway/cluster/wire.py): frames come out of the
bytes whole whatever pieces the bytes arrive in, a frame too long or of no kind
is refused, a batch is cut into frames by its content, and the handshake opens
only between two nodes that know the same secret, refusing everything else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.cluster import wire
from warren.shards import records as r
from warren.shards.codec import decode_commands

SECRET = b"the cluster's secret"
A = wire.Identity("rabbit@a", 3, 2)

frames = st.lists(st.builds(wire.Frame, st.sampled_from(sorted(wire.KINDS)),
                            st.integers(0, 0xFFFF), st.binary(max_size=300)), max_size=8)


def read_all(reader: wire.FrameReader) -> list:
    got = []
    while (frame := reader.next_frame()) is not None:
        got.append(frame)
    return got


@given(frames)
def test_frames_come_out_whole_from_their_bytes(sent):
    reader = wire.FrameReader(max_frame=300)
    reader.receive_data(b"".join(wire.frame(*frame) for frame in sent))
    assert read_all(reader) == sent


@given(frames, st.data())
def test_frames_come_out_whole_from_bytes_in_any_pieces(sent, data):
    stream = b"".join(wire.frame(*frame) for frame in sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    reader = wire.FrameReader(max_frame=300)
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        reader.receive_data(stream[start:end])
        got += read_all(reader)
    assert got == sent


def test_frames_come_out_byte_by_byte():
    sent = [wire.Frame(wire.EVENTS, 7, b"x" * 40), wire.Frame(wire.SHARD_UP, 1, b"")]
    reader = wire.FrameReader(max_frame=100)
    got = []
    for byte in b"".join(wire.frame(*frame) for frame in sent):
        reader.receive_data(bytes([byte]))
        got += read_all(reader)
    assert got == sent


def test_a_frame_longer_than_the_limit_is_refused_before_its_payload():
    reader = wire.FrameReader(max_frame=10)
    reader.receive_data(wire.frame(wire.COMMANDS, 0, b"y" * 11)[:wire.HEADER_SIZE])
    with pytest.raises(wire.WireError, match="11 bytes"):
        reader.next_frame()


def test_a_frame_at_the_limit_is_read():
    reader = wire.FrameReader(max_frame=10)
    reader.receive_data(wire.frame(wire.COMMANDS, 0, b"y" * 10))
    assert reader.next_frame() == wire.Frame(wire.COMMANDS, 0, b"y" * 10)


@pytest.mark.parametrize("kind", [0, max(wire.KINDS) + 1, 255])
def test_a_frame_of_no_kind_is_refused(kind):
    reader = wire.FrameReader()
    reader.receive_data(wire.frame(kind, 0, b""))
    with pytest.raises(wire.WireError, match="kind"):
        reader.next_frame()


def test_until_the_handshake_a_frame_is_at_most_a_login():
    reader = wire.FrameReader()
    reader.receive_data(wire.frame(wire.COMMANDS, 0, b"z" * (wire.HANDSHAKE_MAX + 1)))
    with pytest.raises(wire.WireError):
        reader.next_frame()


def publish(size: int, n: int = 0) -> r.Publish:
    return r.Publish([1], "", "q", b"\x00\x00", bytes([n % 256]) * size, False, 65, n)


def decoded(frames: list) -> list:
    reader = wire.FrameReader(max_frame=wire.MAX_FRAME)
    for pieces in frames:
        reader.receive_data(b"".join(pieces))
    batches = read_all(reader)
    assert all(f.kind == wire.COMMANDS and f.shard == 5 for f in batches)
    return [decode_commands(f.payload) for f in batches]


def test_a_batch_is_one_frame():
    records = [publish(10, 1), r.Settle(1, 65, [1, 2], r.SETTLE_ACK), publish(20000, 2)]
    frames = wire.batch_frames(wire.COMMANDS, 5, records)
    assert decoded(frames) == [records]


def test_a_batch_over_the_content_limit_is_cut_between_records():
    big = wire.FRAME_CONTENT // 3
    records = [publish(big, n) for n in range(5)] + [r.Settle(1, 65, [1], r.SETTLE_ACK)]
    batches = decoded(wire.batch_frames(wire.COMMANDS, 5, records))
    assert len(batches) == 3
    assert [record for batch in batches for record in batch] == records


def test_a_message_larger_than_the_limit_is_a_frame_of_its_own():
    records = [publish(10, 1), publish(wire.FRAME_CONTENT + 1, 2), publish(10, 3)]
    batches = decoded(wire.batch_frames(wire.COMMANDS, 5, records))
    assert batches == [records[:1], records[1:2], records[2:]]


# -- the handshake -------------------------------------------------------------------


def handshake(secret_a: bytes = SECRET, secret_b: bytes = SECRET, identity=A):
    """Run it to the end; what B learned."""
    acceptor, dialer = wire.Acceptor(secret_b), wire.Dialer(secret_a, identity)
    login = dialer.login(frame_of(acceptor.hello()))
    identity, welcome = acceptor.login(frame_of(login))
    dialer.welcome(frame_of(welcome))
    return identity


def frame_of(data: bytes) -> wire.Frame:
    reader = wire.FrameReader()
    reader.receive_data(data)
    got = reader.next_frame()
    assert got is not None and reader.next_frame() is None
    return got


def test_two_nodes_with_one_secret_open_the_link():
    assert handshake() == A


@given(st.text(max_size=60).filter(lambda name: len(name.encode()) <= wire.MAX_NAME),
       st.integers(1, 63), st.integers(0, 63))
def test_b_learns_who_a_is(name, node, gateway):
    assert handshake(identity=wire.Identity(name, node, gateway)) == (name, node, gateway)


def test_b_refuses_a_that_does_not_know_the_secret():
    with pytest.raises(wire.WireError, match="MAC") as refused:
        handshake(secret_a=b"a guess")
    assert SECRET.decode() not in str(refused.value)


def test_a_refuses_b_that_does_not_know_the_secret():
    acceptor, dialer = wire.Acceptor(b"a guess"), wire.Dialer(SECRET, A)
    login = dialer.login(frame_of(acceptor.hello()))
    welcome = wire.frame(wire.WELCOME, 0, bytes(32))  # B cannot compute the right one
    with pytest.raises(wire.WireError, match="MAC"):
        dialer.welcome(frame_of(welcome))
    with pytest.raises(wire.WireError, match="MAC"):  # and B refuses A's login anyway
        acceptor.login(frame_of(login))


def test_a_login_is_good_for_its_own_connection_only():
    dialer = wire.Dialer(SECRET, A)
    login = dialer.login(frame_of(wire.Acceptor(SECRET).hello()))
    with pytest.raises(wire.WireError, match="MAC"):
        wire.Acceptor(SECRET).login(frame_of(login))  # another connection's nonce


def test_a_welcome_is_good_for_its_own_connection_only():
    acceptor = wire.Acceptor(SECRET)
    _, welcome = acceptor.login(frame_of(wire.Dialer(SECRET, A).login(frame_of(acceptor.hello()))))
    dialer = wire.Dialer(SECRET, A)
    dialer.login(frame_of(wire.Acceptor(SECRET).hello()))
    with pytest.raises(wire.WireError, match="MAC"):
        dialer.welcome(frame_of(welcome))


def test_a_changed_identity_is_refused():
    acceptor = wire.Acceptor(SECRET)
    login = frame_of(wire.Dialer(SECRET, A).login(frame_of(acceptor.hello())))
    forged = login.payload[:-1] + b"b"  # another name under A's MAC
    with pytest.raises(wire.WireError, match="MAC"):
        acceptor.login(login._replace(payload=forged))


@pytest.mark.parametrize("identity", [wire.Identity("n", 0, 0), wire.Identity("n", 64, 0),
                                      wire.Identity("n", 1, 64)])
def test_a_node_or_gateway_number_out_of_range_is_refused(identity):
    with pytest.raises(wire.WireError, match="out of range"):
        handshake(identity=identity)


def test_a_name_that_is_not_utf8_is_refused():
    acceptor = wire.Acceptor(SECRET, nonce=bytes(32))
    dialer = wire.Dialer(SECRET, A, nonce=bytes(32))
    login = frame_of(dialer.login(frame_of(acceptor.hello())))
    bad_name = b"\xff"
    mac = wire._mac(SECRET, b"warren-link-a", bytes(32), bytes(32), wire._identity.pack(3, 2),
                    bad_name)
    payload = wire._login.pack(wire.VERSION, bytes(32), mac, 3, 2) + bad_name
    with pytest.raises(wire.WireError, match="UTF-8"):
        acceptor.login(login._replace(payload=payload))


def test_a_name_too_long_cannot_be_sent():
    with pytest.raises(ValueError):
        wire.Dialer(SECRET, wire.Identity("x" * (wire.MAX_NAME + 1), 1, 0))


@pytest.mark.parametrize("frame", [
    wire.Frame(wire.COMMANDS, 0, b""),  # a frame before the handshake
    wire.Frame(wire.LOGIN, 0, b"short"),
    wire.Frame(wire.LOGIN, 0, bytes([wire.VERSION + 1]) + bytes(wire._login.size)),
])
def test_b_refuses_anything_but_a_login(frame):
    with pytest.raises(wire.WireError):
        wire.Acceptor(SECRET).login(frame)


@pytest.mark.parametrize("frame", [
    wire.Frame(wire.EVENTS, 0, b""),
    wire.Frame(wire.HELLO, 0, bytes(wire.NONCE_SIZE)),  # a byte short
    wire.Frame(wire.HELLO, 0, bytes([wire.VERSION + 1]) + bytes(wire.NONCE_SIZE)),
])
def test_a_refuses_anything_but_a_hello(frame):
    with pytest.raises(wire.WireError):
        wire.Dialer(SECRET, A).login(frame)


def test_a_refuses_a_welcome_before_the_hello():
    with pytest.raises(wire.WireError, match="MAC"):
        wire.Dialer(SECRET, A).welcome(wire.Frame(wire.WELCOME, 0, bytes(32)))


def test_a_refuses_a_frame_in_place_of_the_welcome():
    dialer = wire.Dialer(SECRET, A)
    dialer.login(frame_of(wire.Acceptor(SECRET).hello()))
    with pytest.raises(wire.WireError, match="welcome"):
        dialer.welcome(wire.Frame(wire.EVENTS, 0, b""))


@given(st.lists(st.integers(0, 3000), max_size=12))
def test_any_batch_comes_back_whole_in_frames_within_the_limit(sizes):
    limit = 2000
    records = [publish(size, n) for n, size in enumerate(sizes)] or [r.Sync(1)]
    original, wire.FRAME_CONTENT = wire.FRAME_CONTENT, limit
    try:
        batches = decoded(wire.batch_frames(wire.COMMANDS, 5, records))
    finally:
        wire.FRAME_CONTENT = original
    assert [record for batch in batches for record in batch] == records
    for batch in batches:
        content = sum(len(p.body) + len(p.properties) for p in batch if type(p) is r.Publish)
        assert content <= limit or len(batch) == 1


def test_a_revision_asked_comes_back_as_it_went():
    reader = wire.FrameReader()
    reader.receive_data(wire.revision_frame(wire.SEEN_ASK, 2**40 + 7))
    got = reader.next_frame()
    assert got.kind == wire.SEEN_ASK and wire.revision_of(got) == 2**40 + 7
    with pytest.raises(wire.WireError, match="revision"):
        wire.revision_of(wire.Frame(wire.SEEN, 0, b"\0" * 3))
