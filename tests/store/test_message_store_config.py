"""StoreConfig: RocketMQ's defaults and key names, broker.conf loading, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmq.errors import ConfigError
from txmq.store.config import ROCKETMQ_KEYS, FlushDiskType, Preallocate, StoreConfig


def test_defaults_are_rocketmqs() -> None:
    cfg = StoreConfig()
    assert cfg.mapped_file_size_commit_log == 1024 * 1024 * 1024
    assert cfg.mapped_file_size_consume_queue == 6_000_000 and cfg.consume_queue_entries_per_file == 300_000
    assert cfg.flush_interval_commit_log == 500 and cfg.flush_interval_consume_queue == 1000
    assert (cfg.file_reserved_time, cfg.delete_when, cfg.disk_max_used_space_ratio) == (72, "04", 75)
    assert cfg.max_message_size == 4 * 1024 * 1024
    assert (cfg.max_hash_slot_num, cfg.max_index_num) == (5_000_000, 20_000_000)
    assert cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH  # txmq's one deliberate difference: durable by default
    assert cfg.delay_levels_ms()[:3] == [1000, 5000, 10_000] and cfg.delay_levels_ms()[-1] == 7_200_000


def test_broker_conf_round_trip(tmp_path: Path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "# a RocketMQ broker.conf\n"
        "brokerName=broker-a\n"
        "storePathRootDir=/data/store\n"
        "flushDiskType=ASYNC_FLUSH\n"
        "mappedFileSizeCommitLog=65536\n"
        "deleteWhen=03;05\n"
        "fileReservedTime = 48\n"
        "warmMapedFileEnable=true\n"
        "messageDelayLevel=1s 2m 3h\n"
        "groupCommitWaitMicros=0\n"
    )
    cfg = StoreConfig.from_file(conf, max_message_size=1024)
    assert cfg.store_path_root_dir == "/data/store" and cfg.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert cfg.mapped_file_size_commit_log == 65536 and cfg.file_reserved_time == 48
    assert cfg.delete_hours() == {3, 5} and cfg.max_message_size == 1024
    assert cfg.effective_preallocate is Preallocate.ZERO
    assert cfg.delay_levels_ms() == [1000, 120_000, 10_800_000]
    assert cfg.group_commit_wait_us == 0 and StoreConfig().group_commit_wait_us == 300
    props = cfg.to_properties()
    assert set(props) == set(ROCKETMQ_KEYS) and props["flushDiskType"] == "ASYNC_FLUSH"
    assert props["warmMapedFileEnable"] == "true"
    assert StoreConfig.from_properties(props) == cfg


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("flushDiskType", "SOMETIMES", "flushDiskType"),
        ("mappedFileSizeCommitLog", "big", "mappedFileSizeCommitLog"),
        ("mappedFileSizeCommitLog", "100", "at least 4096"),
        ("mappedFileSizeConsumeQueue", "1001", "multiple of 20"),
        ("diskMaxUsedSpaceRatio", "99", "1..95"),
        ("checkCRCOnRecover", "maybe", "checkCRCOnRecover"),
        ("messageDelayLevel", "1s 5x", "messageDelayLevel"),
        ("groupCommitWaitMicros", "-1", "0..100000"),
        ("groupCommitWaitMicros", "100001", "0..100000"),
    ],
)
def test_bad_values_are_config_errors(key: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StoreConfig.from_properties({key: value})
