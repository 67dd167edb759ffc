"""Broker configuration: RocketMQ's ``broker.conf`` key names, RocketMQ's defaults except where durability wins."""

from __future__ import annotations

import dataclasses
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

from txmq.config import apply_properties, load_properties
from txmq.errors import ConfigError

log = logging.getLogger("txmq.broker")

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


def default_ip() -> str:
    """The address clients should use: the first non-loopback IPv4 address, else 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent; this only picks the outbound interface
            ip = s.getsockname()[0]
            if ip and not ip.startswith("0."):
                return ip
    except OSError:
        pass
    return "127.0.0.1"


@dataclass(slots=True)
class BrokerConfig:
    """Fields are the snake_case of RocketMQ's keys (``brokerClusterName`` -> ``broker_cluster_name``)."""

    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    listen_port: int = 10911
    broker_ip1: str = ""  # empty: detect
    namesrv_addr: str = ""  # "host:port;host:port"
    store_path_root_dir: str = "txmq-data/store"
    # Durable by default: RocketMQ defaults to ASYNC_FLUSH; txmq acknowledges only what is on disk.
    flush_disk_type: str = "SYNC_FLUSH"
    flush_interval_commit_log: int = 500
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    max_message_size: int = 4 * 1024 * 1024
    auto_create_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    broker_permission: int = 6
    long_polling_enable: bool = True
    enable_property_filter: bool = False  # SQL92 message filters (txmq.filter); RocketMQ's default is off too
    short_polling_time_mills: int = 1000
    region_id: str = "DefaultRegion"
    trace_on: bool = True
    store_reply_message_enable: bool = True  # request-reply: replies are stored on <cluster>_REPLY_TOPIC as well
    register_name_server_period: int = 30_000
    client_channel_expired_seconds: int = 120
    default_query_max_num: int = 32
    # Transactions
    reject_transaction_message: bool = False
    transaction_time_out: int = 6_000
    transaction_check_max: int = 15
    transaction_check_interval: int = 60_000
    max_pending_transactions: int = 1_000_000  # txmq: prepares fail with a clear error past this backlog
    # Retry and delay
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    # ACL
    acl_enable: bool = False
    acl_file: str = ""  # empty: <storePathRootDir>/../conf/plain_acl.yml
    acl_dir: str = ""  # empty: <storePathRootDir>/../conf/acl (every *.yml / *.yaml in it)
    acl_strict_mode: bool = False  # txmq: an account whitelist match no longer skips the signature check
    # The RocketMQ 5 gRPC door (the proxy's local mode, issue 14)
    grpc_listen_port: int = 8081  # 0: no gRPC door
    min_invisible_time_mills_for_recv: int = 10_000  # the proxy's lower bound on a receive's invisible duration
    # txmq: the long polling a push consumer is told to use (its close waits for a pending receive to end)
    grpc_push_long_polling_mills: int = 20_000
    # Monitoring (issue 17): Prometheus /metrics and the web console
    metrics_port: int = 5557  # RocketMQ's metricsPromExporterPort default; 0: no /metrics
    metrics_host: str = ""  # empty: the broker's listening host
    metrics_label_limit: int = 200  # txmq: past this many topics (or group+topic pairs) the rest share "_others"
    console_port: int = 0  # 0: no console in the broker (``txmq console`` serves one against a cluster)
    console_host: str = "127.0.0.1"
    console_sample_seconds: int = 10  # txmq: how often the console samples throughput and lag for its charts
    # With aclEnable: the account the console's admin calls are signed with (people log in with their own)
    console_access_key: str = ""
    console_secret_key: str = ""
    # Replication (issue 21): RocketMQ's roles and HA keys. brokerId 0 is the master, 1.. the slaves.
    broker_role: str = "ASYNC_MASTER"  # ASYNC_MASTER, SYNC_MASTER or SLAVE
    ha_listen_port: int = -1  # -1: listenPort + 1 (RocketMQ's 10912 next to 10911)
    ha_master_address: str = ""  # a slave's master HA address; empty: learnt from the name server's answer
    ha_send_heartbeat_interval: int = 5_000  # ms between a slave's offset reports when nothing new arrives
    ha_housekeeping_interval: int = 20_000  # ms of silence after which a master drops a slave's connection
    ha_max_gap_not_in_sync: int = 256 * 1024 * 1024  # a slave further behind than this does not count as in sync
    ha_transfer_batch_size: int = 1024 * 1024  # txmq: 1 MiB per shipment (RocketMQ: 32 KiB)
    sync_flush_timeout: int = 5_000  # ms a SYNC_MASTER waits for its slave before FLUSH_SLAVE_TIMEOUT
    slave_sync_interval: int = 10_000  # txmq: ms between a slave's copies of its master's metadata
    # Controller mode (automatic failover): RocketMQ 5's switch; controllerAddr names etcd endpoints here
    # (host:port;...), not a RocketMQ controller. Every replica, the master too, sets brokerId to its own id >= 1.
    enable_controller_mode: bool = False
    controller_addr: str = ""
    ha_controller_lease_millis: int = 3_000  # txmq: the master's etcd lease TTL (whole seconds, at least 2)
    ha_controller_poll_millis: int = 500  # txmq: how often each replica reads its brokerName's keys in etcd
    extra: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: object) -> BrokerConfig:
        config = cls()
        config.extra = apply_properties(config, load_properties(path))
        for key, value in overrides.items():
            setattr(config, key, value)
        if config.extra:
            log.info("broker.conf keys passed on to other parts: %s", ", ".join(sorted(config.extra)))
        return config

    @property
    def is_slave(self) -> bool:
        return self.broker_role.upper() == "SLAVE"

    def check_role(self) -> None:
        """RocketMQ's start-up rule: a master is brokerId 0, a slave has a brokerId above 0."""
        role = self.broker_role.upper()
        if role not in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
            raise ConfigError(f"brokerRole={self.broker_role}: use ASYNC_MASTER, SYNC_MASTER or SLAVE")
        self.broker_role = role
        if role == "SLAVE":
            if self.broker_id <= 0:
                raise ConfigError(f"brokerRole=SLAVE needs a brokerId above 0 (got {self.broker_id})")
        elif self.broker_id != 0:
            log.info("brokerRole=%s: brokerId %d becomes 0, the master's id", role, self.broker_id)
            self.broker_id = 0

    @property
    def advertised_ip(self) -> str:
        return self.broker_ip1 or default_ip()

    @property
    def broker_addr(self) -> str:
        return f"{self.advertised_ip}:{self.listen_port}"

    @property
    def namesrv_addrs(self) -> list[str]:
        return [a.strip() for a in self.namesrv_addr.replace(",", ";").split(";") if a.strip()]

    def store_properties(self) -> dict[str, str]:
        """The storage keys, in RocketMQ's names, for the store's own configuration."""
        keys = {
            "storePathRootDir": self.store_path_root_dir,
            "flushDiskType": self.flush_disk_type,
            "flushIntervalCommitLog": str(self.flush_interval_commit_log),
            "mappedFileSizeCommitLog": str(self.mapped_file_size_commit_log),
            "fileReservedTime": str(self.file_reserved_time),
            "deleteWhen": self.delete_when,
            "diskMaxUsedSpaceRatio": str(self.disk_max_used_space_ratio),
            "maxMessageSize": str(self.max_message_size),
        }
        keys.update(self.extra)
        return keys

    def replace(self, **changes: object) -> BrokerConfig:
        return dataclasses.replace(self, **changes)
