"""The plain_acl.yml model: parsing with line numbers, validation, and writing back.

A file is accepted or rejected as a whole: :func:`parse_acl_text` either returns an :class:`AclFile` or raises
:class:`AclConfigError` listing every problem, each naming the file, the line, the account and the field. Every
scalar is kept as the text that was written, so ``accessKey: 12345678`` is the string ``"12345678"``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from txmq.acl.permission import PERM_STRINGS, is_valid_perm
from txmq.acl.whitelist import WhitelistError, compile_pattern
from txmq.errors import ConfigError

MIN_KEY_LENGTH = 7  # RocketMQ: accessKey and secretKey must be longer than 6 characters

ACCOUNT_KEYS = (
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
)
TOP_LEVEL_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")
_PERM_CHOICES = ", ".join(PERM_STRINGS)


class AclConfigError(ConfigError):
    """An ACL file that was rejected; ``problems`` holds one line per problem."""

    def __init__(self, path: str, problems: Sequence[str]) -> None:
        self.path = path
        self.problems = list(problems)
        detail = "; ".join(self.problems)
        super().__init__(f"ACL file {path} rejected ({len(self.problems)} problem(s)): {detail}")


@dataclass(frozen=True, slots=True)
class Account:
    """One entry of ``accounts``. Perm strings are kept as written (validated); lists keep ``name=PERM`` order."""

    access_key: str
    secret_key: str
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: tuple[tuple[str, str], ...] = ()
    group_perms: tuple[tuple[str, str], ...] = ()

    def to_yaml(self) -> dict[str, Any]:
        out: dict[str, Any] = {"accessKey": self.access_key, "secretKey": self.secret_key}
        if self.white_remote_address is not None:
            out["whiteRemoteAddress"] = self.white_remote_address
        out["admin"] = self.admin
        if self.default_topic_perm is not None:
            out["defaultTopicPerm"] = self.default_topic_perm
        if self.default_group_perm is not None:
            out["defaultGroupPerm"] = self.default_group_perm
        if self.topic_perms:
            out["topicPerms"] = [f"{t}={p}" for t, p in self.topic_perms]
        if self.group_perms:
            out["groupPerms"] = [f"{g}={p}" for g, p in self.group_perms]
        return out

    def describe(self, *, mask_secret: bool = True) -> dict[str, Any]:
        """RocketMQ's PlainAccessConfig field names, for admin answers (the secret masked by default)."""
        out = self.to_yaml()
        out["secretKey"] = mask(self.secret_key) if mask_secret else self.secret_key
        out.setdefault("whiteRemoteAddress", None)
        out.setdefault("topicPerms", [])
        out.setdefault("groupPerms", [])
        return out


@dataclass(frozen=True, slots=True)
class AclFile:
    """One parsed file: its global whitelist entries and accounts, plus the digest of the bytes it came from."""

    path: str
    global_white_remote_addresses: tuple[str, ...] = ()
    accounts: tuple[Account, ...] = ()
    data_version: tuple[int, int] | None = None  # (timestamp, counter) as RocketMQ writes it
    md5: str = ""

    def account(self, access_key: str) -> Account | None:
        return next((a for a in self.accounts if a.access_key == access_key), None)

    def to_document(self) -> dict[str, Any]:
        """The file as plain YAML data, in RocketMQ's key order (what admin changes edit before writing)."""
        doc: dict[str, Any] = {
            "globalWhiteRemoteAddresses": list(self.global_white_remote_addresses),
            "accounts": [a.to_yaml() for a in self.accounts],
        }
        if self.data_version is not None:
            doc["dataVersion"] = [{"timestamp": self.data_version[0], "counter": self.data_version[1]}]
        return doc


def dump_document(doc: dict[str, Any]) -> bytes:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True).encode("utf-8")


def mask(secret: str) -> str:
    return secret[:2] + "*" * max(4, len(secret) - 2) if secret else ""


# -- parsing -------------------------------------------------------------------------------------------------------

_NULL_TAG = "tag:yaml.org,2002:null"
# YAML 1.1 booleans, as SnakeYAML (RocketMQ's parser) reads them.
_BOOL_WORDS = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False}


class _Problems:
    def __init__(self, path: str) -> None:
        self.path = path
        self.items: list[str] = []

    def add(self, node: yaml.Node | None, where: str, message: str) -> None:
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        self.items.append(f"{self.path}{line}: {where}: {message}")


def _scalar(node: yaml.Node) -> str | None:
    """A scalar as the text written (numbers stay as typed); None for YAML null."""
    if node.tag == _NULL_TAG:
        return None
    return str(node.value)


def _mapping(node: yaml.MappingNode, problems: _Problems, where: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            problems.add(key_node, where, "keys must be plain names")
            continue
        key = str(key_node.value)
        if key in out:
            problems.add(key_node, where, f"key {key!r} appears twice")
            continue
        out[key] = (key_node, value_node)
    return out


def _string_list(node: yaml.Node, problems: _Problems, where: str) -> list[tuple[yaml.Node, str]] | None:
    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return []
    if not isinstance(node, yaml.SequenceNode):
        problems.add(node, where, "must be a list")
        return None
    items: list[tuple[yaml.Node, str]] = []
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode) or item.tag == _NULL_TAG:
            problems.add(item, where, "list items must be plain values")
            continue
        items.append((item, str(item.value)))
    return items


def _perm_list(node: yaml.Node, problems: _Problems, where: str, kind: str) -> tuple[tuple[str, str], ...]:
    items = _string_list(node, problems, where)
    if items is None:
        return ()
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item_node, text in items:
        name, sep, perm = text.rpartition("=")
        name, perm = name.strip(), perm.strip()
        if not sep or not name:
            problems.add(item_node, where, f"{text!r} is not {kind}=PERM")
            continue
        if not is_valid_perm(perm):
            problems.add(item_node, where, f"{text!r}: permission {perm!r} is not one of {_PERM_CHOICES}")
            continue
        if name in seen:
            problems.add(item_node, where, f"{kind} {name!r} is listed twice")
            continue
        seen.add(name)
        out.append((name, perm))
    return tuple(out)


def _check_whitelist(node: yaml.Node, text: str, problems: _Problems, where: str) -> None:
    try:
        compile_pattern(text)
    except WhitelistError as exc:
        problems.add(node, where, str(exc))


def _parse_account(node: yaml.Node, index: int, problems: _Problems) -> Account | None:
    where = f"accounts[{index}]"
    if not isinstance(node, yaml.MappingNode):
        problems.add(node, where, "each account must be a mapping of accessKey, secretKey, ...")
        return None
    fields = _mapping(node, problems, where)
    ak_entry = fields.get("accessKey")
    access_key = _scalar(ak_entry[1]) if ak_entry and isinstance(ak_entry[1], yaml.ScalarNode) else None
    if access_key is not None:
        where = f"accounts[{index}] (accessKey={access_key})"
    for key, (key_node, _) in fields.items():
        if key not in ACCOUNT_KEYS:
            problems.add(key_node, where, f"unknown field {key!r} (known: {', '.join(ACCOUNT_KEYS)})")
    before = len(problems.items)

    def text_field(name: str, *, required: bool = False) -> str | None:
        entry = fields.get(name)
        if entry is None:
            if required:
                problems.add(node, where, f"field {name} is missing")
            return None
        if not isinstance(entry[1], yaml.ScalarNode):
            problems.add(entry[1], where, f"field {name} must be a single value")
            return None
        value = _scalar(entry[1])
        if value is None and required:
            problems.add(entry[1], where, f"field {name} is empty")
        return value

    keys: dict[str, str | None] = {}
    for name in ("accessKey", "secretKey"):
        value = keys[name] = text_field(name, required=True)
        if value is not None and len(value) < MIN_KEY_LENGTH:
            problems.add(fields[name][1], where, f"field {name} must be longer than 6 characters")
    secret_key = keys["secretKey"]
    white = text_field("whiteRemoteAddress")
    if white is not None:
        _check_whitelist(fields["whiteRemoteAddress"][1], white, problems, f"{where} field whiteRemoteAddress")
    admin = False
    if "admin" in fields:
        admin_node = fields["admin"][1]
        admin_text = _scalar(admin_node) if isinstance(admin_node, yaml.ScalarNode) else None
        truth = _BOOL_WORDS.get(admin_text.strip().lower()) if admin_text is not None else None
        if truth is not None:
            admin = truth
        elif admin_text is not None or not isinstance(admin_node, yaml.ScalarNode):
            problems.add(admin_node, where, f"field admin must be true or false, not {admin_text!r}")
    defaults: dict[str, str | None] = {}
    for name in ("defaultTopicPerm", "defaultGroupPerm"):
        value = text_field(name)
        if value is not None and not is_valid_perm(value):
            problems.add(fields[name][1], where, f"field {name}: {value!r} is not one of {_PERM_CHOICES}")
        defaults[name] = value.strip() if value is not None else None
    perms: dict[str, tuple[tuple[str, str], ...]] = {}
    for name, kind in (("topicPerms", "topic"), ("groupPerms", "group")):
        perms[name] = _perm_list(fields[name][1], problems, f"{where} field {name}", kind) if name in fields else ()
    topic_perms, group_perms = perms["topicPerms"], perms["groupPerms"]
    if len(problems.items) > before or access_key is None or secret_key is None:
        return None
    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_remote_address=white,
        admin=admin,
        default_topic_perm=defaults["defaultTopicPerm"],
        default_group_perm=defaults["defaultGroupPerm"],
        topic_perms=topic_perms,
        group_perms=group_perms,
    )


def _data_version(node: yaml.Node) -> tuple[int, int] | None:
    # RocketMQ writes [{timestamp: .., counter: ..}]; it carries no meaning for access, so a strange one is ignored.
    try:
        data = yaml.safe_load(yaml.serialize(node))
        entry = data[0] if isinstance(data, list) else data
        return int(entry["timestamp"]), int(entry["counter"])
    except Exception:
        return None


def parse_acl_text(text: str | bytes, path: str) -> AclFile:
    """Parse and validate one ACL file's content; raise :class:`AclConfigError` naming every problem."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    md5 = hashlib.md5(raw).hexdigest()
    problems = _Problems(path)
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AclConfigError(path, [f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    try:
        root = yaml.compose(decoded, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise AclConfigError(path, [f"{path}{line}: not valid YAML: {reason}"]) from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL_TAG):
        return AclFile(path=path, md5=md5)
    if not isinstance(root, yaml.MappingNode):
        raise AclConfigError(path, [f"{path}:{root.start_mark.line + 1}: the top level must be a mapping"])
    top = _mapping(root, problems, "top level")
    for key, (key_node, _) in top.items():
        if key not in TOP_LEVEL_KEYS:
            problems.add(key_node, "top level", f"unknown key {key!r} (known: {', '.join(TOP_LEVEL_KEYS)})")
    white: list[str] = []
    if "globalWhiteRemoteAddresses" in top:
        items = _string_list(top["globalWhiteRemoteAddresses"][1], problems, "globalWhiteRemoteAddresses")
        for item_node, value in items or []:
            _check_whitelist(item_node, value, problems, "globalWhiteRemoteAddresses")
            white.append(value)
    accounts: list[Account] = []
    if "accounts" in top:
        node = top["accounts"][1]
        if isinstance(node, yaml.SequenceNode):
            seen: dict[str, int] = {}
            for index, item in enumerate(node.value):
                account = _parse_account(item, index, problems)
                if account is None:
                    continue
                if account.access_key in seen:
                    problems.add(
                        item,
                        f"accounts[{index}] (accessKey={account.access_key})",
                        f"accessKey already defined by accounts[{seen[account.access_key]}]",
                    )
                    continue
                seen[account.access_key] = index
                accounts.append(account)
        elif not (isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG):
            problems.add(node, "accounts", "must be a list of accounts")
    version = _data_version(top["dataVersion"][1]) if "dataVersion" in top else None
    if problems.items:
        raise AclConfigError(path, problems.items)
    return AclFile(path, tuple(white), tuple(accounts), version, md5)


def load_acl_file(path: str | Path) -> AclFile:
    """Read and parse one file (an unreadable file is an :class:`AclConfigError` too)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AclConfigError(str(path), [f"{path}: cannot read: {exc.strerror}"]) from None
    return parse_acl_text(data, str(path))


@dataclass(slots=True)
class AccountChange:
    """Fields of an UPDATE_AND_CREATE_ACL_CONFIG request; None means "leave as it is"."""

    access_key: str
    secret_key: str | None = None
    white_remote_address: str | None = None
    admin: bool | None = None
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: list[tuple[str, str]] | None = None
    group_perms: list[tuple[str, str]] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def apply(self, existing: Account | None) -> dict[str, Any]:
        """The merged account as a YAML mapping (validated later by parsing the whole file)."""
        base: dict[str, Any] = existing.to_yaml() if existing is not None else {"accessKey": self.access_key}
        if self.secret_key is not None:
            base["secretKey"] = self.secret_key
        if self.white_remote_address is not None:
            base["whiteRemoteAddress"] = self.white_remote_address
        if self.admin is not None:
            base["admin"] = self.admin
        base.setdefault("admin", False)
        if self.default_topic_perm is not None:
            base["defaultTopicPerm"] = self.default_topic_perm
        if self.default_group_perm is not None:
            base["defaultGroupPerm"] = self.default_group_perm
        if self.topic_perms is not None:
            base["topicPerms"] = [f"{t}={p}" for t, p in self.topic_perms]
        if self.group_perms is not None:
            base["groupPerms"] = [f"{g}={p}" for g, p in self.group_perms]
        return base


def parse_perm_pairs(text: str | None) -> list[tuple[str, str]] | None:
    """``topicA=PUB,topicB=SUB`` (the admin header's form) as pairs; None stays None, "" is an empty list."""
    if text is None:
        return None
    pairs: list[tuple[str, str]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, perm = item.rpartition("=")
        pairs.append((name.strip(), perm.strip()) if name else (item, ""))
    return pairs
