"""NOTIFY_CONSUMER_IDS_CHANGED: a consumer group's live members hear when its membership changes."""

from __future__ import annotations

from typing import Any

from txmq.broker.clients import ClientRegistry
from txmq.broker.subscriptions import SubscriptionGroupManager
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand


class ConsumerIdsNotifier:
    def __init__(self, clients: ClientRegistry, subscriptions: SubscriptionGroupManager) -> None:
        self.clients = clients
        self.subscriptions = subscriptions

    def notify_consumer_ids_changed(self, group: str) -> None:
        cfg = self.subscriptions.groups.get(group)
        if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
            return
        for conn in self.clients.consumer_connections(group):
            if not conn.closed:
                conn.send_oneway(
                    RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
                )

    def connection_closed(self, conn: Any) -> None:
        for group in self.clients.connection_closed(conn):
            self.notify_consumer_ids_changed(group)
