"""The transaction driver: it carries out what the transaction core (:mod:`txmq.txn`) decides, with the store, the
check journal and the producers' connections of every door."""

from txmq.broker.txn.producers import CheckChannel, ProducerChecks
from txmq.broker.txn.service import TransactionService

__all__ = ["CheckChannel", "ProducerChecks", "TransactionService"]
