"""The crash campaign's oracle (``count_anomalies``) counts each kind of anomaly it is shown: a campaign that
finds nothing means something only if its oracle finds a planted fault."""

from __future__ import annotations

from txmq.chaos.crash import ORDERED, PLAIN, TX, Ledger, count_anomalies
from txmq.chaos.report import PartResult
from txmq.client import MessageExt


def stored(topic: str, *bodies: str, queue_id: int = 0) -> list[MessageExt]:
    return [MessageExt(topic, b.encode(), queue_id=queue_id) for b in bodies]


def healthy() -> tuple[
    Ledger, dict[str, list[MessageExt]], set[bytes], list[tuple[str, bytes]], list[tuple[str, bytes]]
]:
    ledger = Ledger()
    for b in (b"plain-1-0-0", b"plain-1-0-1", b"ord-3-0", b"ord-3-1"):
        ledger.tried.add(b)
        ledger.acked.add(b)
    ledger.tx_tried |= {b"tx-1-0-0", b"tx-1-0-1"}
    ledger.tx_declined.add(b"tx-1-0-1")
    store = {
        PLAIN: stored(PLAIN, "plain-1-0-0", "plain-1-0-1"),
        ORDERED: stored(ORDERED, "ord-3-0", "ord-3-1"),
        TX: stored(TX, "tx-1-0-0"),
    }
    consumed = [(PLAIN, b"plain-1-0-0"), (PLAIN, b"plain-1-0-1"), (TX, b"tx-1-0-0"), (PLAIN, b"plain-1-0-0")]
    ordered = [(ORDERED, b"ord-3-0"), (ORDERED, b"ord-3-1")]
    return ledger, store, {b"tx-1-0-0"}, consumed, ordered


def run(*args: object) -> PartResult:
    result = PartResult("crash")
    count_anomalies(result, *args)  # type: ignore[arg-type]
    return result


def test_a_healthy_history_has_no_anomaly_and_counts_redeliveries_apart() -> None:
    result = run(*healthy())
    assert result.ok, result.examples
    assert result.info["redelivered_plain"] == 1


def test_an_acknowledged_send_missing_from_the_store_is_lost() -> None:
    ledger, store, committed, consumed, ordered = healthy()
    store[PLAIN] = store[PLAIN][:1]
    assert run(ledger, store, committed, consumed, ordered).must_be_zero["lost"] == 1


def test_a_committed_transaction_not_visible_is_lost_and_a_declined_one_visible_is_unexpected() -> None:
    ledger, store, committed, consumed, ordered = healthy()
    store[TX] = stored(TX, "tx-1-0-1")
    result = run(ledger, store, committed, [*consumed, (TX, b"tx-1-0-1")], ordered)
    assert result.must_be_zero["lost"] >= 1 and result.must_be_zero["unexpected"] >= 1


def test_a_body_stored_twice_is_duplicated() -> None:
    ledger, store, committed, consumed, ordered = healthy()
    store[TX] = stored(TX, "tx-1-0-0", "tx-1-0-0")
    assert run(ledger, store, committed, consumed, ordered).must_be_zero["duplicated"] == 1


def test_order_breaks_in_the_store_and_in_first_deliveries_are_reordered() -> None:
    ledger, store, committed, consumed, ordered = healthy()
    store[ORDERED] = stored(ORDERED, "ord-3-1", "ord-3-0")
    assert run(ledger, store, committed, consumed, ordered).must_be_zero["reordered"] == 1
    ledger, store, committed, consumed, ordered = healthy()
    result = run(ledger, store, committed, consumed, [(ORDERED, b"ord-3-1"), (ORDERED, b"ord-3-0")])
    assert result.must_be_zero["reordered"] == 1
    ledger, store, committed, consumed, ordered = healthy()  # a redelivery from an older offset is not a reorder
    result = run(ledger, store, committed, consumed, [*ordered, (ORDERED, b"ord-3-0"), (ORDERED, b"ord-3-1")])
    assert result.ok and result.info["redelivered_ordered"] == 2


def test_a_stored_body_nobody_sent_is_unexpected_and_an_undelivered_one_is_counted() -> None:
    ledger, store, committed, consumed, ordered = healthy()
    store[PLAIN] = [*store[PLAIN], *stored(PLAIN, "plain-9-9-9")]
    assert run(ledger, store, committed, consumed, ordered).must_be_zero["unexpected"] == 1
    ledger, store, committed, consumed, ordered = healthy()
    undelivered = [c for c in consumed if c[1] != b"plain-1-0-1"]
    assert run(ledger, store, committed, undelivered, ordered).must_be_zero["not_delivered"] == 1
