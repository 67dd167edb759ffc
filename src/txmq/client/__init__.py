"""txmq's Python client for RocketMQ 4.x brokers (txmq or Apache RocketMQ): asyncio first, blocking in ``.sync``.

``Producer``, ``TransactionProducer``, ``PushConsumer``, ``PullConsumer`` and ``Admin`` share one
:class:`ClientInstance` per process and name-server set (routes, connections, heartbeats). ``txmq.client.sync`` has
the same classes without ``await``.
"""

from txmq.client.admin import Admin, ClusterInfo, ConsumeStats, OffsetWrapper, TopicOffset
from txmq.client.config import ClientConfig
from txmq.client.instance import ClientInstance
from txmq.client.message import (
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageModel,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from txmq.client.producer import Producer
from txmq.client.pull_consumer import PullConsumer
from txmq.client.push_consumer import PushConsumer
from txmq.client.route import TopicRoute
from txmq.client.selection import QueueSelector, allocate_averagely, select_by_hash
from txmq.client.transaction import (
    LocalTransactionState,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
)
from txmq.errors import MQBrokerError, MQClientError, NoRouteError

MQClient = ClientInstance  # RocketMQ's other name for the shared core

__all__ = [
    "Admin",
    "ClientConfig",
    "ClientInstance",
    "ClusterInfo",
    "ConsumeFromWhere",
    "ConsumeOrderlyStatus",
    "ConsumeStats",
    "ConsumeStatus",
    "LocalTransactionState",
    "MQBrokerError",
    "MQClient",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "NoRouteError",
    "OffsetWrapper",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueSelector",
    "SendResult",
    "SendStatus",
    "TopicOffset",
    "TopicRoute",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
    "select_by_hash",
]
