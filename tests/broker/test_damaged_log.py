"""A live broker on a damaged commit log: txmq's pull consumer gets every good message and never a damaged one,
after a clean stop and after kill -9, and the broker's log names the damaged offsets."""

from __future__ import annotations

from pathlib import Path

from txmq.chaos.common import create_topics
from txmq.client import Message, Producer, PullConsumer, PullStatus
from txmq.protocol.record import body_len_pos
from txmq.testing import DevCluster

SEGMENT = 256 * 1024
TOPIC = "DamagedLogTopic"


def _flip(data_dir: Path, phys: int) -> None:
    path = data_dir / "store" / "commitlog" / f"{phys - phys % SEGMENT:020d}"
    at = phys % SEGMENT + body_len_pos(0) + 4 + 200  # IPv4 hosts on loopback: the body starts after BODYLEN
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x44]))


async def _pull_all(namesrv: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with PullConsumer("DamagedLogReaders", namesrv, instance_name="damaged-reader") as reader:
        (mq,) = await reader.fetch_queues(TOPIC)
        offset = 0
        while offset < count:
            # One at a time, so that a pull lands exactly on a damaged record too.
            result = await reader.pull(mq, "*", offset, 1 if offset % 50 < 3 else 16)
            assert result.status in (PullStatus.FOUND, PullStatus.NO_MATCHED_MSG), result.status
            assert result.next_begin_offset > offset
            got += [m.body for m in result.messages]
            offset = result.next_begin_offset
    return got


async def test_pull_moves_past_damaged_records_after_a_clean_stop_and_a_kill(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "dev", {"mappedFileSizeCommitLog": str(SEGMENT)})
    cluster.start(timeout=60)
    try:
        await create_topics(cluster.namesrv_addr, {TOPIC: 1})
        bodies = [f"damaged-log-{i:04d}|".encode() + bytes(2000) for i in range(300)]
        offsets: list[int] = []
        async with Producer("DamagedLogProducers", cluster.namesrv_addr, instance_name="damaged-p") as producer:
            for body in bodies:
                offsets.append(int((await producer.send(Message(TOPIC, body))).offset_msg_id[-16:], 16))
        assert offsets[-1] > 2 * SEGMENT

        cluster.stop()
        _flip(cluster.data_dir, offsets[50])  # an early segment, which a clean start does not read
        before = len(cluster.log_text())
        cluster.start(timeout=60)
        assert await _pull_all(cluster.namesrv_addr, 300) == bodies[:50] + bodies[51:]
        assert f"offset {offsets[50]}" in cluster.log_text()[before:]

        cluster.kill()
        _flip(cluster.data_dir, offsets[290])  # the last segment, which crash recovery verifies
        before = len(cluster.log_text())
        cluster.start(timeout=60)
        text = cluster.log_text()[before:]
        assert f"damaged [{offsets[290]}, {offsets[291]})" in text and "cut the torn tail" not in text
        got = await _pull_all(cluster.namesrv_addr, 300)
        assert got == bodies[:50] + bodies[51:290] + bodies[291:]
        assert "Traceback" not in cluster.log_text()
    finally:
        cluster.stop()
