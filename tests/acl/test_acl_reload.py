"""Hot reload on a running broker: grants and revocations apply within 10 s, a broken file changes nothing (and
the log says why), and deleting a file removes its accounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from acl_support import (
    BASE_ACL,
    PUB_KEY,
    PUB_SECRET,
    SUB_KEY,
    SUB_SECRET,
    TOPIC,
    conf_dir,
    create_topic,
    denial_of,
    send_one,
    start_acl_cluster,
    wait_for_log,
    write_file,
)

from txmq.testing import aeventually

pytestmark = pytest.mark.slow

TEAM = """\
accounts:
  - accessKey: teamUser001
    secretKey: teamSecret001
    topicPerms: [AclTopic=PUB]
"""


@pytest.fixture
async def cluster(make_cluster: Any, tmp_path: Path) -> Any:
    c = start_acl_cluster(make_cluster, tmp_path, extra_files={"team.yml": TEAM})
    await create_topic(c)
    return c


async def test_granting_and_revoking_a_topic_permission(cluster: Any) -> None:
    plain = conf_dir(cluster) / "plain_acl.yml"
    assert "No default permission" in await denial_of(cluster, SUB_KEY, SUB_SECRET)

    write_file(plain, BASE_ACL.replace(f"- {TOPIC}=SUB", f"- {TOPIC}=PUB|SUB"))
    result = await aeventually(
        lambda: send_one(cluster, SUB_KEY, SUB_SECRET), "the grant", timeout=10, retry_on=(Exception,)
    )
    assert result.status.value == "SEND_OK"

    write_file(plain, BASE_ACL)

    async def refused() -> bool:
        remark = await denial_of(cluster, SUB_KEY, SUB_SECRET)
        assert "No default permission for topic:AclTopic" in remark
        return True

    await aeventually(refused, "the revocation", timeout=10, retry_on=(Exception,))


async def test_an_invalid_file_keeps_every_account_working(cluster: Any) -> None:
    plain = conf_dir(cluster) / "plain_acl.yml"
    # A typo in one account, together with a change that would lock PUB_KEY out: the whole file is rejected.
    lock_out = BASE_ACL.replace(f"- {TOPIC}=PUB\n", f"- {TOPIC}=DENY\n")
    broken = lock_out.replace("defaultGroupPerm: SUB", "defaultGroupPerm: READ", 1)
    write_file(plain, broken)
    await wait_for_log(cluster, f"ACL file {plain} rejected as a whole; its last good version stays in force")
    problem = await wait_for_log(cluster, f"{plain}:")
    assert f"accounts[1] (accessKey={PUB_KEY}): field defaultGroupPerm: 'READ' is not one of" in problem
    # Every account still works as before: the publisher, the admin-created topic's consumer side, the team file.
    assert (await send_one(cluster, PUB_KEY, PUB_SECRET)).status.value == "SEND_OK"
    assert (await send_one(cluster, "teamUser001", "teamSecret001")).status.value == "SEND_OK"
    assert "No default permission" in await denial_of(cluster, SUB_KEY, SUB_SECRET)
    # Fixing the file applies the intended change.
    write_file(plain, lock_out)

    async def locked_out() -> bool:
        assert "No default permission" in await denial_of(cluster, PUB_KEY, PUB_SECRET)
        return True

    await aeventually(locked_out, "the fixed file", timeout=10, retry_on=(Exception,))


async def test_deleting_a_file_removes_its_accounts(cluster: Any) -> None:
    assert (await send_one(cluster, "teamUser001", "teamSecret001")).status.value == "SEND_OK"
    (conf_dir(cluster) / "acl" / "team.yml").unlink()

    async def gone() -> bool:
        assert (await denial_of(cluster, "teamUser001", "teamSecret001")).endswith("No acl config for teamUser001")
        return True

    await aeventually(gone, "the removal", timeout=10, retry_on=(Exception,))
    await wait_for_log(cluster, "team.yml was removed: its 1 account(s) no longer apply")
    assert (await send_one(cluster, PUB_KEY, PUB_SECRET)).status.value == "SEND_OK"


async def test_a_new_file_in_the_folder_adds_accounts(cluster: Any) -> None:
    assert (await denial_of(cluster, "lateUser001", "lateSecret001")).endswith("No acl config for lateUser001")
    write_file(
        conf_dir(cluster) / "acl" / "late.yaml",
        "accounts:\n  - {accessKey: lateUser001, secretKey: lateSecret001, topicPerms: [AclTopic=PUB]}\n",
    )
    result = await aeventually(
        lambda: send_one(cluster, "lateUser001", "lateSecret001"), "the new file", timeout=10, retry_on=(Exception,)
    )
    assert result.status.value == "SEND_OK"
