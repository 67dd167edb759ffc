"""Helpers for ACL integration tests: private `txmq dev` clusters with aclEnable=true and a plain_acl.yml."""

from __future__ import annotations

import os
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmq.client import Admin, Message, Producer
from txmq.errors import MQBrokerError
from txmq.testing import aeventually

ADMIN_KEY, ADMIN_SECRET = "adminUser01", "adminSecret01"
PUB_KEY, PUB_SECRET = "pubUser0001", "pubSecret0001"
SUB_KEY, SUB_SECRET = "subUser0001", "subSecret0001"
TOPIC = "AclTopic"

BASE_ACL = textwrap.dedent(
    f"""\
    globalWhiteRemoteAddresses: []
    accounts:
      - accessKey: {ADMIN_KEY}
        secretKey: {ADMIN_SECRET}
        admin: true
      - accessKey: {PUB_KEY}
        secretKey: {PUB_SECRET}
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - {TOPIC}=PUB
      - accessKey: {SUB_KEY}
        secretKey: {SUB_SECRET}
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - {TOPIC}=SUB
    """
)


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def write_file(path: Path, text: str) -> None:
    """Replace a file the way an operator's editor might (in place), bumping mtime past the last poll's view."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    before = path.stat().st_mtime_ns if existed else 0
    path.write_text(text)
    if existed:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, max(st.st_mtime_ns, before + 1_000_000)))


def start_acl_cluster(
    make_cluster: Callable[..., Any],
    tmp_path: Path,
    acl_text: str = BASE_ACL,
    *,
    extra_files: dict[str, str] | None = None,
    conf: dict[str, str] | None = None,
    name: str = "acl",
) -> Any:
    """A private cluster whose broker has aclEnable=true; files go where the broker looks by default."""
    conf_dir = tmp_path / name / "conf"
    write_file(conf_dir / "plain_acl.yml", acl_text)
    for file_name, text in (extra_files or {}).items():
        write_file(conf_dir / "acl" / file_name, text)
    return make_cluster({"aclEnable": "true", **(conf or {})}, name=name)


def conf_dir(cluster: Any) -> Path:
    return Path(cluster.data_dir) / "conf"


async def create_topic(cluster: Any, topic: str = TOPIC) -> None:
    async with Admin(
        cluster.namesrv_addr, access_key=ADMIN_KEY, secret_key=ADMIN_SECRET, instance_name=unique("admin")
    ) as admin:
        await admin.create_topic(topic, broker_addr=cluster.broker_addr, read_queue_nums=2, write_queue_nums=2)
        await aeventually(lambda: admin.topic_route(topic), f"a route for {topic}", retry_on=(Exception,))


async def send_one(
    cluster: Any, access_key: str | None, secret_key: str | None, topic: str = TOPIC, body: bytes = b"hello"
) -> Any:
    """One send with a fresh producer; raises MQBrokerError on a denial."""
    options: dict[str, Any] = {"instance_name": unique("p"), "retry_times_when_send_failed": 0}
    if access_key is not None:
        options.update(access_key=access_key, secret_key=secret_key)
    producer = Producer(unique("PG"), cluster.namesrv_addr, **options)
    await producer.start()
    try:
        return await producer.send(Message(topic, body))
    finally:
        await producer.shutdown()


async def denial_of(cluster: Any, access_key: str | None, secret_key: str | None, topic: str = TOPIC) -> str:
    """The broker's remark for a refused send (fails the test if the send went through)."""
    try:
        result = await send_one(cluster, access_key, secret_key, topic)
    except MQBrokerError as exc:
        assert exc.code == 1, exc
        return exc.remark or ""
    raise AssertionError(f"the send was accepted: {result}")


async def wait_for_log(cluster: Any, text: str, timeout: float = 10.0) -> str:
    """The first broker log line containing ``text``."""

    def line() -> str | None:
        return next((line for line in cluster.log_text().splitlines() if text in line), None)

    try:
        return await aeventually(line, f"a broker log line containing {text!r}", timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; log tail:\n{cluster.log_text()[-3000:]}") from None
