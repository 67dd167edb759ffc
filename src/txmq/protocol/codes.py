"""RocketMQ 4.x remoting codes: request codes, response codes, language codes and serialize types.

Names follow RocketMQ's ``RequestCode`` / ``ResponseCode`` / ``LanguageCode`` so that the reference docs read the same.
The enums are for readability; hot paths compare plain ints (an ``IntEnum`` member *is* an int).
"""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    """Request codes (rocketmq-wire.md §2.1). Direction noted where a broker sends the request to a client."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> client, oneway
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> client, oneway
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45  # a slave copies its master's delayOffset.json
    CHECK_CLIENT_CONFIG = 46
    UPDATE_AND_CREATE_ACL_CONFIG = 50
    DELETE_ACL_CONFIG = 51
    GET_BROKER_CLUSTER_ACL_INFO = 52
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_PRODUCER_CONNECTION_LIST = 204
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_SUBSCRIPTIONGROUP = 207
    GET_CONSUME_STATS = 208
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_KVLIST_BY_NAMESPACE = 219
    RESET_CONSUMER_CLIENT_OFFSET = 220  # broker -> client
    INVOKE_BROKER_TO_RESET_OFFSET = 222
    GET_TOPICS_BY_CLUSTER = 224
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    GET_SYSTEM_TOPIC_LIST_FROM_NS = 304
    GET_CONSUMER_RUNNING_INFO = 307  # admin -> broker -> client
    CONSUME_MESSAGE_DIRECTLY = 309  # admin -> broker -> client
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    PUSH_REPLY_MESSAGE_TO_CLIENT = 326
    ADD_WRITE_PERM_OF_BROKER = 327
    LITE_PULL_MESSAGE = 361  # RocketMQ 5 clients' DefaultLitePullConsumer: PULL_MESSAGE by another code


class ResponseCode(enum.IntEnum):
    """Response codes: the system ones (§1.7) and RocketMQ's ``ResponseCode`` (§2.2), 4.9.x numbering."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202  # sic: RocketMQ's spelling
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    # 209..211 are the 4.9.x ACL failures; RocketMQ 5 reuses these numbers for POLLING_* / BROKER_NOT_EXIST.
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215


class LanguageCode(enum.IntEnum):
    """The ``language`` of a command. JSON headers carry the name, binary headers the value (one byte)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(enum.IntEnum):
    """The header encoding, carried in the top byte of the frame's second int32."""

    JSON = 0
    ROCKETMQ = 1


# Plain-int aliases for hot paths.
SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
RPC_RESPONSE = 1  # flag bit 0
RPC_ONEWAY = 2  # flag bit 1


class TxmqConsumerRequestCode(enum.IntEnum):
    """txmq's own admin requests for consumer groups (range 1320..1329; not RocketMQ codes).

    Request and response fields are plain extFields; bodies are standard JSON.
    """

    # ext consumerGroup, topic, to ("earliest" | "latest" | epoch ms). Sets the group's offsets on this broker and
    # sends RESET_CONSUMER_CLIENT_OFFSET (220) to its online consumers. Body: {"offsets":[{..,"offset":n}],
    # "notifiedConsumers":n}.
    RESET_CONSUMER_OFFSET = 1320
    # ext consumerGroup, maxNum. Body: {"messages":[{...}]} for %DLQ%<group> on this broker.
    LIST_DEAD_LETTERS = 1321
    # ext consumerGroup, and msgIds (comma-separated offsetMsgIds or UNIQ_KEYs) or all=true.
    # Body: {"resent":[..],"alreadyResent":[..],"notFound":[..],"failed":[..]}.
    RESEND_DEAD_LETTERS = 1322


class TxmqRequestCode(enum.IntEnum):
    """txmq's own admin requests, 1300..1309 (unused by RocketMQ 4.x and 5.x). JSON bodies both ways; the bodies are
    documented in docs/transactions.md. 1305..1309 are reserved for transactions."""

    TXMQ_LIST_TRANSACTIONS = 1300
    TXMQ_GET_TRANSACTION = 1301
    TXMQ_RESOLVE_TRANSACTION = 1302
    TXMQ_RESUME_TRANSACTION = 1303
    TXMQ_TRANSACTION_COUNTERS = 1304


class TxmqReplicaRequestCode(enum.IntEnum):
    """txmq's own admin requests for replication, 1330..1339 (not RocketMQ codes). JSON bodies both ways."""

    # To a slave. Body {"brokerRole": "ASYNC_MASTER" | "SYNC_MASTER", "force": bool}. The slave stops copying, becomes
    # brokerId 0 with that role and registers as the master; refused while the name server still lists a master of
    # its brokerName (unless force). Answer {"brokerRole", "brokerId", "maxOffset", "previousMaster"}.
    TXMQ_PROMOTE_BROKER = 1330
