"""Operator control of transactions: txmq's admin requests 1300..1304 (``TxmqRequestCode``), JSON both ways.

List in-doubt transactions, show one transaction's history, resolve one by hand, resume a discarded one, and read the
counters. Request and answer bodies are documented in docs/transactions.md. Every error is answered with a code and a
remark a person can act on: an unknown id is QUERY_NOT_FOUND (22) with the id in the remark, a refused resolution or
resume TRANSACTION_FAILED (4), a malformed request SYSTEM_ERROR (1).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.txn import TransactionService
from txmq.protocol.codes import ResponseCode, TxmqRequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.txn.history import TransactionRecord
from txmq.txn.model import Decision, TxState

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig

log = logging.getLogger("txmq.broker.transactions")

MAX_LIST_LIMIT = 10_000


def _bad_request(remark: str) -> BrokerRefusal:
    """A malformed admin request."""
    return BrokerRefusal(ResponseCode.SYSTEM_ERROR, remark)


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    if not cmd.body:
        return {}
    try:
        data = orjson.loads(cmd.body)
    except orjson.JSONDecodeError as exc:
        raise _bad_request(f"[TXMQ] the request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _bad_request("[TXMQ] the request body must be a JSON object")
    return data


def _opt_str(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _bad_request(f"[TXMQ] {key} must be a string, got {value!r}")
    return value


def _opt_int(data: dict[str, Any], key: str, default: int | None, *, low: int = 0, high: int = 2**62) -> int | None:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _bad_request(f"[TXMQ] {key} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise _bad_request(f"[TXMQ] {key} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise _bad_request(f"[TXMQ] {key} must be between {low} and {high}, got {number}")
    return number


def _ident(data: dict[str, Any]) -> str:
    ident = _opt_str(data, "id")
    if ident is None:
        raise _bad_request('[TXMQ] give "id": a transaction id, UNIQ_KEY or msgId')
    return ident.strip()


class TransactionAdminProcessor:
    """The handlers of :class:`TxmqRequestCode`, bound to one broker."""

    def __init__(self, *, config: BrokerConfig, transactions: TransactionService) -> None:
        self.config = config
        self.transactions = transactions

    def handlers(self) -> dict[int, Any]:
        return {
            TxmqRequestCode.TXMQ_LIST_TRANSACTIONS: self._wrap(self.list_transactions),
            TxmqRequestCode.TXMQ_GET_TRANSACTION: self._wrap(self.get_transaction),
            TxmqRequestCode.TXMQ_RESOLVE_TRANSACTION: self._wrap(self.resolve),
            TxmqRequestCode.TXMQ_RESUME_TRANSACTION: self._wrap(self.resume),
            TxmqRequestCode.TXMQ_TRANSACTION_COUNTERS: self._wrap(self.counters),
        }

    def _wrap(self, handler: Any) -> Any:
        async def run(_conn: Any, cmd: RemotingCommand) -> RemotingCommand:
            service = self.transactions
            if not isinstance(service, TransactionService):
                raise BrokerRefusal(ResponseCode.SYSTEM_ERROR, "[TXMQ] transactions are not enabled on this broker")
            try:
                code, remark, answer = await handler(service, _body(cmd))
            except BrokerRefusal:
                raise
            except Exception as exc:  # never let one request take the handler down
                log.exception("transaction admin request %d failed", cmd.code)
                return cmd.response(ResponseCode.SYSTEM_ERROR, f"[TXMQ] {type(exc).__name__}: {exc}")
            if answer is not None:
                answer.setdefault("brokerName", self.config.broker_name)
                answer.setdefault("brokerAddr", self.config.broker_addr)
            return cmd.response(code, remark, body=orjson.dumps(answer) if answer is not None else b"")

        return run

    def _transaction(self, service: TransactionService, rec: TransactionRecord) -> dict[str, Any]:
        now = service.clock.now_ms()
        shown = rec.to_json(now)
        if rec.tx_id:  # a transaction of several messages: every one of them
            shown["messages"] = [m.summary(now) for m in service.members(rec)]
        return {"transaction": shown}

    def _not_found(self, ident: str) -> BrokerRefusal:
        return BrokerRefusal(
            ResponseCode.QUERY_NOT_FOUND,
            f"[TXMQ] no transaction {ident} on broker {self.config.broker_name} "
            "(looked up as transaction id, UNIQ_KEY, and msgId of the half, delivered or discarded message)",
        )

    async def list_transactions(self, service: TransactionService, data: dict[str, Any]) -> Any:
        states_raw = data.get("states")
        states = frozenset({TxState.PREPARED, TxState.DISCARDED})
        if states_raw is not None:
            if not isinstance(states_raw, list) or not states_raw:
                raise _bad_request('[TXMQ] states must be a non-empty list such as ["PREPARED", "DISCARDED"]')
            try:
                states = frozenset(TxState(str(s).upper()) for s in states_raw)
            except ValueError:
                raise _bad_request(
                    f"[TXMQ] unknown state in {states_raw!r}; states are {', '.join(s.value for s in TxState)}"
                ) from None
        total, found = service.list_in_doubt(
            group=_opt_str(data, "group"),
            topic=_opt_str(data, "topic"),
            older_than_ms=_opt_int(data, "olderThanMs", None),
            states=states,
            limit=_opt_int(data, "limit", 100, high=MAX_LIST_LIMIT) or 0,
        )
        now = service.clock.now_ms()
        return ResponseCode.SUCCESS, None, {"total": total, "transactions": [r.summary(now) for r in found]}

    async def get_transaction(self, service: TransactionService, data: dict[str, Any]) -> Any:
        ident = _ident(data)
        rec = service.find(ident)
        if rec is None:
            raise self._not_found(ident)
        return ResponseCode.SUCCESS, None, self._transaction(service, rec)

    async def resolve(self, service: TransactionService, data: dict[str, Any]) -> Any:
        ident = _ident(data)
        decision = str(data.get("decision") or "").upper()
        if decision not in (Decision.COMMIT, Decision.ROLLBACK):
            raise _bad_request(f'[TXMQ] "decision" must be COMMIT or ROLLBACK, got {data.get("decision")!r}')
        rec = service.find(ident)
        if rec is None:
            raise self._not_found(ident)
        code, remark = await service.operator_resolve(rec, decision)
        rec = service.find(ident) or rec
        return code, remark, self._transaction(service, rec)

    async def resume(self, service: TransactionService, data: dict[str, Any]) -> Any:
        ident = _ident(data)
        rec = service.find(ident)
        if rec is None:
            raise self._not_found(ident)
        code, remark = await service.resume(rec)
        return code, remark, self._transaction(service, rec)

    async def counters(self, service: TransactionService, _data: dict[str, Any]) -> Any:
        return ResponseCode.SUCCESS, None, {"counters": service.counter_values()}
