"""ACL files on disk: all-or-nothing reloads per file, deletions, and admin edits written atomically."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml

from txmq.acl.config import AccountChange, parse_acl_text
from txmq.acl.manager import AclAdminError, AclManager, default_paths

MAIN = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: mainUser01
    secretKey: mainSecret01
    defaultTopicPerm: PUB
"""
TEAM = """\
accounts:
  - accessKey: teamUser01
    secretKey: teamSecret01
    topicPerms: [orders=PUB]
"""


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    # Make the change visible even when the filesystem clock has not ticked since the last write.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    main, acl_dir = tmp_path / "conf" / "plain_acl.yml", tmp_path / "conf" / "acl"
    write(main, MAIN)
    write(acl_dir / "team.yml", TEAM)
    return main, acl_dir


def test_default_paths_sit_beside_the_store(tmp_path: Path) -> None:
    main, acl_dir = default_paths(tmp_path / "data" / "store")
    assert main == tmp_path / "data" / "conf" / "plain_acl.yml"
    assert acl_dir == tmp_path / "data" / "conf" / "acl"


def test_loads_the_main_file_and_the_folder(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    write(acl_dir / "more.yaml", "accounts:\n  - {accessKey: moreUser01, secretKey: moreSecret1}\n")
    write(acl_dir / "notes.txt", "not: an acl file")
    m = AclManager(main, acl_dir)
    assert m.reload()
    assert set(m.state.accounts) == {"mainUser01", "teamUser01", "moreUser01"}
    assert m.state.accounts["teamUser01"].source == str(acl_dir / "team.yml")


def test_a_change_is_picked_up(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    assert not m.reload()  # nothing changed
    write(acl_dir / "team.yml", TEAM.replace("orders=PUB", "orders=SUB"))
    assert m.reload()
    assert m.state.accounts["teamUser01"].resource_perms["orders"] == 8


def test_an_invalid_file_is_rejected_whole_and_the_last_good_version_stays(
    files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    before = m.state
    # One good edit and one bad one in the same file: neither applies.
    broken = MAIN.replace("defaultTopicPerm: PUB", "defaultTopicPerm: SUB") + "  - accessKey: short\n    secretKey: x\n"
    with caplog.at_level(logging.ERROR, logger="txmq.acl"):
        write(main, broken)
        assert not m.reload()
    assert m.state is before
    assert m.state.accounts["mainUser01"].default_topic_perm == 4  # still PUB
    assert "teamUser01" in m.state.accounts
    logged = caplog.text
    assert f"ACL file {main} rejected as a whole; its last good version stays in force" in logged
    assert f"{main}:6: accounts[1] (accessKey=short): field accessKey must be longer than 6 characters" in logged
    report = m.file_report()[str(main)]
    assert report["inForce"] is False and "accessKey must be longer" in report["error"]
    # Fixing the file applies the good edit.
    write(main, MAIN.replace("defaultTopicPerm: PUB", "defaultTopicPerm: SUB"))
    assert m.reload()
    assert m.state.accounts["mainUser01"].default_topic_perm == 8
    assert m.file_report()[str(main)]["inForce"] is True


def test_a_broken_new_file_adds_nothing_and_breaks_nothing(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    write(acl_dir / "new.yml", "accounts: [")
    assert not m.reload()
    assert set(m.state.accounts) == {"mainUser01", "teamUser01"}


def test_deleting_a_file_removes_its_accounts(files: tuple[Path, Path], caplog: pytest.LogCaptureFixture) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    (acl_dir / "team.yml").unlink()
    with caplog.at_level(logging.WARNING, logger="txmq.acl"):
        assert m.reload()
    assert set(m.state.accounts) == {"mainUser01"}
    assert "team.yml was removed: its 1 account(s) no longer apply" in caplog.text


def test_same_size_same_mtime_rewrite_is_caught_by_the_periodic_digest(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    team = acl_dir / "team.yml"
    st = team.stat()
    team.write_text(TEAM.replace("orders=PUB", "orders=SUB"))  # same length
    os.utime(team, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = any(m.reload() for _ in range(12))
    assert changed and m.state.accounts["teamUser01"].resource_perms["orders"] == 8


def test_update_account_creates_in_the_main_file_and_updates_in_place(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    where = m.update_account(AccountChange("newUser001", secret_key="newSecret01", topic_perms=[("t1", "PUB")]))
    assert where == str(main)
    assert m.state.accounts["newUser001"].resource_perms == {"t1": 4}
    # teamUser01 lives in team.yml: updated there, other fields kept.
    where = m.update_account(AccountChange("teamUser01", default_group_perm="SUB"))
    assert where == str(acl_dir / "team.yml")
    team = parse_acl_text((acl_dir / "team.yml").read_bytes(), "team.yml").account("teamUser01")
    assert team is not None and team.secret_key == "teamSecret01" and team.default_group_perm == "SUB"
    assert team.topic_perms == (("orders", "PUB"),)
    doc = yaml.safe_load((acl_dir / "team.yml").read_text())
    assert doc["dataVersion"][0]["counter"] == 1
    assert not [p for p in acl_dir.iterdir() if p.name.startswith(".")]  # no temporaries left behind


def test_invalid_admin_changes_are_refused_and_nothing_is_written(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    before = main.read_bytes()
    with pytest.raises(AclAdminError, match="is new, so it needs a secretKey"):
        m.update_account(AccountChange("brandNew01"))
    with pytest.raises(AclAdminError, match="secretKey must be longer than 6"):
        m.update_account(AccountChange("brandNew01", secret_key="abc"))
    with pytest.raises(AclAdminError, match="permission 'READ'"):
        m.update_account(AccountChange("mainUser01", topic_perms=[("t", "READ")]))
    with pytest.raises(AclAdminError, match="does not exist"):
        m.delete_account("nobody0001")
    with pytest.raises(AclAdminError, match="first segment"):
        m.update_global_whitelist("*.1.2.3")
    assert main.read_bytes() == before


def test_a_file_broken_on_disk_is_not_edited_on_top_of(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    write(main, "accounts: [")
    m.reload()
    with pytest.raises(AclAdminError, match="invalid on disk, fix it first"):
        m.update_account(AccountChange("mainUser01", default_topic_perm="SUB"))
    assert "mainUser01" in m.state.accounts  # the last good version still applies


def test_delete_account_and_global_whitelist(files: tuple[Path, Path]) -> None:
    main, acl_dir = files
    m = AclManager(main, acl_dir)
    m.reload()
    m.delete_account("teamUser01")
    assert "teamUser01" not in m.state.accounts
    assert yaml.safe_load((acl_dir / "team.yml").read_text())["accounts"] == []
    m.update_global_whitelist("10.0.0.1,192.168.1.{1,2}")
    assert yaml.safe_load(main.read_text())["globalWhiteRemoteAddresses"] == ["10.0.0.1", "192.168.1.{1,2}"]
    assert m.state.global_whitelist.matches("192.168.1.2")
    m.update_global_whitelist("")
    assert not m.state.global_whitelist


def test_numeric_keys_written_back_stay_strings(tmp_path: Path) -> None:
    main = tmp_path / "plain_acl.yml"
    m = AclManager(main, None)
    m.reload()
    m.update_account(AccountChange("12345678", secret_key="87654321"))
    assert "'12345678'" in main.read_text()
    assert m.state.accounts["12345678"].secret_key == "87654321"
