"""The HA core without IO: frames, and both sessions' tables walked over every (state, input) pair."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txmq.ha.session import (
    MASTER_TRANSITIONS,
    SLAVE_TRANSITIONS,
    Acked,
    Apply,
    Fail,
    IllegalHaTransition,
    MasterInput,
    MasterSession,
    MasterState,
    SendAccept,
    SendRefuse,
    SendReport,
    SlaveInput,
    SlaveSession,
    SlaveState,
)
from txmq.ha.wire import (
    VERSION,
    Accept,
    Data,
    HaProtocolError,
    Hello,
    MasterFrameDecoder,
    Refuse,
    Report,
    SlaveFrameDecoder,
    encode_accept,
    encode_data_header,
    encode_hello,
    encode_refuse,
    encode_report,
)

SEG = 1 << 20
HELLO = Hello(VERSION, SEG, "broker-a")

# -- frames


def test_frames_round_trip_fed_a_byte_at_a_time() -> None:
    wire = encode_hello("broker-a", SEG) + encode_report(12345)
    decoder = SlaveFrameDecoder()
    frames = [f for b in wire for f in decoder.feed(bytes([b]))]
    assert frames == [HELLO, Report(12345)]
    wire = encode_accept(0, 99) + encode_data_header(7, 3) + b"abc" + encode_refuse("no") + encode_data_header(10, 0)
    decoder2 = MasterFrameDecoder()
    frames = [f for b in wire for f in decoder2.feed(bytes([b]))]
    assert frames == [Accept(0, 99), Data(7, b"abc"), Refuse("no"), Data(10, b"")]


@pytest.mark.parametrize(
    "junk",
    [b"GET / HTTP/1.1\r\n", b"\x00\x00\x00\x00\x00\x00\x00\x10", b"HTTP", b"H" + b"TXHB" + bytes(11)],
)
def test_a_stranger_is_told_apart_at_its_first_bytes(junk: bytes) -> None:
    with pytest.raises(HaProtocolError):
        SlaveFrameDecoder().feed(junk)


def test_the_master_side_refuses_oversized_or_unknown_frames() -> None:
    with pytest.raises(HaProtocolError, match="data frame"):
        MasterFrameDecoder().feed(encode_data_header(0, 1 << 30))
    with pytest.raises(HaProtocolError, match="unknown frame"):
        MasterFrameDecoder().feed(b"Z")


@given(st.binary(max_size=64))
def test_garbage_never_escapes_as_anything_but_a_protocol_error(junk: bytes) -> None:
    for decoder in (SlaveFrameDecoder(), MasterFrameDecoder()):
        try:
            decoder.feed(junk)
        except HaProtocolError:
            pass


# -- the master's session


def master_in(state: MasterState) -> MasterSession:
    s = MasterSession(broker_name="broker-a", segment_size=SEG, chunk_size=100, window=250)
    if state is MasterState.AWAIT_HELLO:
        return s
    s.hello(HELLO, min_offset=0, max_offset=1000)
    if state is MasterState.AWAIT_REPORT:
        return s
    s.report(Report(0), min_offset=0, max_offset=1000)
    if state is MasterState.STREAMING:
        return s
    s.close("test")
    return s


def feed_master(s: MasterSession, event: MasterInput) -> object:
    if event is MasterInput.HELLO:
        return s.hello(HELLO, min_offset=0, max_offset=1000)
    if event is MasterInput.REPORT:
        return s.report(Report(0), min_offset=0, max_offset=1000)
    if event is MasterInput.SHIPPED:
        return s.shipped(s.shipped_to, s.shipped_to + 10)
    return s.close("test")


@pytest.mark.parametrize("state", list(MasterState))
@pytest.mark.parametrize("event", list(MasterInput))
def test_every_master_state_and_input(state: MasterState, event: MasterInput) -> None:
    s = master_in(state)
    target = MASTER_TRANSITIONS.get((state, event))
    if target is None:
        with pytest.raises(IllegalHaTransition):
            feed_master(s, event)
        assert s.state is state
        return
    feed_master(s, event)
    assert s.state is target


def test_master_greets_a_replica_of_its_own_broker_only() -> None:
    for hello, why in [
        (Hello(VERSION, SEG, "broker-b"), "broker-b"),
        (Hello(VERSION, SEG * 2, "broker-a"), "segment size"),
        (Hello(VERSION + 1, SEG, "broker-a"), "version"),
    ]:
        s = master_in(MasterState.AWAIT_HELLO)
        effects = s.hello(hello, min_offset=0, max_offset=10)
        assert isinstance(effects[0], SendRefuse) and why in effects[0].reason
        assert isinstance(effects[-1], Fail) and s.state is MasterState.CLOSED
    s = master_in(MasterState.AWAIT_HELLO)
    assert s.hello(HELLO, min_offset=5, max_offset=10) == [SendAccept(5, 10)]


def test_master_refuses_offsets_it_cannot_serve() -> None:
    beyond = master_in(MasterState.AWAIT_REPORT)
    effects = beyond.report(Report(1001), min_offset=0, max_offset=1000)
    assert isinstance(effects[0], SendRefuse) and "beyond" in effects[0].reason
    retired = master_in(MasterState.AWAIT_REPORT)
    effects = retired.report(Report(10), min_offset=500, max_offset=1000)
    assert isinstance(effects[0], SendRefuse) and "starts at 500" in effects[0].reason
    stranger = master_in(MasterState.AWAIT_HELLO)
    assert isinstance(stranger.report(Report(0), min_offset=0, max_offset=0)[0], SendRefuse)


def test_master_ships_in_chunks_within_the_window_and_tracks_acks() -> None:
    s = master_in(MasterState.AWAIT_REPORT)
    assert s.report(Report(40), min_offset=0, max_offset=1000) == [Acked(40)]
    assert s.next_chunk(1000) == (40, 140)  # chunk_size 100
    s.shipped(40, 120)  # the driver shipped less (a record boundary)
    assert s.next_chunk(1000) == (120, 220)
    s.shipped(120, 220)
    assert s.next_chunk(1000) == (220, 290)  # window: 250 bytes past the last ack (40)
    s.shipped(220, 290)
    assert s.next_chunk(1000) is None
    assert s.report(Report(290), min_offset=0, max_offset=1000) == [Acked(290)]
    assert s.report(Report(290), min_offset=0, max_offset=1000) == []  # a heartbeat
    assert s.next_chunk(300) == (290, 300)
    effects = s.report(Report(200), min_offset=0, max_offset=1000)
    assert isinstance(effects[0], SendRefuse) and "went back" in effects[0].reason


def test_master_refuses_a_slave_claiming_bytes_never_shipped() -> None:
    s = master_in(MasterState.STREAMING)
    s.shipped(0, 50)
    effects = s.report(Report(60), min_offset=0, max_offset=1000)
    assert isinstance(effects[0], SendRefuse) and "only 50 was shipped" in effects[0].reason


def test_shipped_out_of_order_is_a_driver_bug() -> None:
    s = master_in(MasterState.STREAMING)
    with pytest.raises(IllegalHaTransition):
        s.shipped(10, 20)


# -- the slave's session


def slave_in(state: SlaveState) -> SlaveSession:
    s = SlaveSession(durable=100)
    if state is SlaveState.GREETING:
        return s
    if state is SlaveState.REPLICATING:
        s.accept(Accept(0, 1000))
        return s
    s.close("test")
    return s


def feed_slave(s: SlaveSession, event: SlaveInput) -> object:
    if event is SlaveInput.ACCEPT:
        return s.accept(Accept(0, 1000))
    if event is SlaveInput.REFUSE:
        return s.refuse(Refuse("no"))
    if event is SlaveInput.DATA:
        return s.data(Data(s.expected, b"abc"))
    if event is SlaveInput.APPLIED:
        s.expected = s.durable + 3  # as if 3 bytes were handed to the store
        return s.applied(s.durable + 3)
    return s.close("test")


@pytest.mark.parametrize("state", list(SlaveState))
@pytest.mark.parametrize("event", list(SlaveInput))
def test_every_slave_state_and_input(state: SlaveState, event: SlaveInput) -> None:
    s = slave_in(state)
    target = SLAVE_TRANSITIONS.get((state, event))
    if target is None:
        with pytest.raises(IllegalHaTransition):
            feed_slave(s, event)
        assert s.state is state
        return
    feed_slave(s, event)
    assert s.state is target


def test_slave_applies_contiguous_bytes_and_reports_what_is_durable() -> None:
    s = SlaveSession(durable=100)
    assert s.accept(Accept(0, 500)) == [SendReport(100)]
    assert s.data(Data(100, b"x" * 50)) == [Apply(100, b"x" * 50)]
    assert s.data(Data(150, b"y" * 10)) == [Apply(150, b"y" * 10)]
    assert s.data(Data(160, b"")) == []  # heartbeat
    assert s.applied(150) == [SendReport(150)]
    assert s.applied(160) == [SendReport(160)]
    effects = s.data(Data(999, b"z"))
    assert isinstance(effects[0], Fail) and "continues at 160" in effects[0].reason


def test_slave_with_bytes_the_master_lacks_stops() -> None:
    s = SlaveSession(durable=600)
    effects = s.accept(Accept(0, 500))
    assert isinstance(effects[0], Fail) and "beyond the master's end 500" in effects[0].reason
    assert s.state is SlaveState.CLOSED


# -- both ends together


@settings(deadline=None, max_examples=60)  # a loaded CI machine must not fail it on time
@given(st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=30), st.integers(8, 120))
def test_master_and_slave_converge_on_the_master_log(appends: list[int], chunk: int) -> None:
    """Random log growth and chunk sizes: the slave's durable end always equals the master's acked offset and
    never passes what was shipped; at the end it has everything."""
    master = MasterSession(broker_name="broker-a", segment_size=SEG, chunk_size=chunk, window=chunk * 3)
    slave = SlaveSession(durable=0)
    master.hello(HELLO, min_offset=0, max_offset=0)
    (report,) = slave.accept(Accept(0, 0))
    assert isinstance(report, SendReport)
    master.report(Report(report.offset), min_offset=0, max_offset=0)
    end = 0
    for size in [*appends, 0, 0, 0] + [0] * (sum(appends) // max(chunk, 1) + 2):
        end += size
        # ship everything the session allows, then apply and acknowledge
        while (rng := master.next_chunk(end)) is not None:
            start, stop = rng
            master.shipped(start, stop)
            (apply,) = slave.data(Data(start, bytes(stop - start)))
            assert isinstance(apply, Apply)
            (rep,) = slave.applied(apply.offset + len(apply.data))
            assert isinstance(rep, SendReport)
            master.report(Report(rep.offset), min_offset=0, max_offset=end)
            assert master.acked == slave.durable <= master.shipped_to <= end
    assert slave.durable == end


def test_the_ha_core_does_no_io() -> None:
    """txmq.ha imports only itself, txmq.errors and IO-free standard modules (the driver is txmq.broker.ha)."""
    import ast
    from pathlib import Path

    import txmq.ha

    forbidden = {"asyncio", "socket", "os", "pathlib", "io", "threading", "subprocess", "selectors"}
    modules = sorted(Path(txmq.ha.__file__).parent.glob("*.py"))
    assert len(modules) == 5  # __init__, wire, session, election, waits
    for module in modules:
        for node in ast.walk(ast.parse(module.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            for name in names:
                if name.split(".")[0] == "txmq":
                    assert name.startswith(("txmq.ha", "txmq.errors")), f"{module.name} imports {name}"
                else:
                    assert name.split(".")[0] not in forbidden, f"{module.name} imports {name}"


def test_coalesce_merges_applies_that_follow_each_other_within_a_segment() -> None:
    from txmq.ha.session import Apply, Fail, SendReport, coalesce

    a, b, c = Apply(100, b"x" * 20), Apply(120, b"y" * 10), Apply(130, b"z" * 5)
    assert coalesce([a, b, c], 1000) == [Apply(100, b"x" * 20 + b"y" * 10 + b"z" * 5)]
    # a gap, another segment, or another effect in between keeps them apart, in order
    assert coalesce([a, Apply(200, b"w")], 1000) == [a, Apply(200, b"w")]
    assert coalesce([Apply(990, b"a" * 10), Apply(1000, b"b" * 5)], 1000) == [
        Apply(990, b"a" * 10),
        Apply(1000, b"b" * 5),
    ]
    assert coalesce([SendReport(100), a, b, Fail("x"), c], 1000) == [
        SendReport(100),
        Apply(100, b"x" * 20 + b"y" * 10),
        Fail("x"),
        c,
    ]
    assert coalesce([], 1000) == [] and coalesce([a], 1000) == [a]
