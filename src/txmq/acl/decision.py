"""The access decision (rocketmq-wire.md §5.2-5.4): compiled accounts, resources per request code, and checks.

:func:`compile_acl` turns parsed files into one immutable :class:`AclState`; :func:`decide` answers one request
with ``None`` (allowed) or a :class:`Denial`. Nothing here does IO, so the whole decision is unit-testable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from txmq.acl import permission as perm
from txmq.acl.config import Account, AclFile
from txmq.acl.signer import ACCESS_KEY, verify_signature
from txmq.acl.whitelist import Whitelist, compile_pattern
from txmq.protocol.codes import RequestCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.topics import TRACE_TOPIC

log = logging.getLogger("txmq.acl")

TXMQ_CUSTOM_ADMIN_CODE_MIN = 1300  # txmq's own admin request codes start here; all of them need an admin account

ADMIN_CODES = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        # Not admin-only in RocketMQ 4.9, but changing who may do what has to be.
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
        RequestCode.DELETE_ACL_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
    }
)


def needs_admin(code: int) -> bool:
    return code in ADMIN_CODES or code >= TXMQ_CUSTOM_ADMIN_CODE_MIN


@dataclass(frozen=True, slots=True)
class CompiledAccount:
    access_key: str
    secret_key: str
    whitelist: Whitelist
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    resource_perms: Mapping[str, int]  # topic -> bits, "%RETRY%group" -> bits
    source: str
    account: Account


@dataclass(frozen=True, slots=True)
class AclState:
    """Everything the decision needs, swapped as one object on reload."""

    global_whitelist: Whitelist = field(default_factory=Whitelist)
    accounts: Mapping[str, CompiledAccount] = field(default_factory=dict)
    files: tuple[AclFile, ...] = ()
    strict: bool = False


def compile_account(account: Account, source: str) -> CompiledAccount:
    resources: dict[str, int] = {t: perm.parse_perm(p) for t, p in account.topic_perms}
    for group, p in account.group_perms:
        resources[perm.RETRY_PREFIX + group] = perm.parse_perm(p)
    return CompiledAccount(
        access_key=account.access_key,
        secret_key=account.secret_key,
        whitelist=compile_pattern(account.white_remote_address),
        admin=account.admin,
        default_topic_perm=perm.parse_perm(account.default_topic_perm),
        default_group_perm=perm.parse_perm(account.default_group_perm),
        resource_perms=resources,
        source=source,
        account=account,
    )


def compile_acl(files: Sequence[AclFile], *, strict: bool = False) -> tuple[AclState, list[str]]:
    """Merge files in load order (the first definition of an accessKey wins); return the state and warnings."""
    accounts: dict[str, CompiledAccount] = {}
    white: list[str] = []
    warnings: list[str] = []
    for f in files:
        white.extend(f.global_white_remote_addresses)
        for account in f.accounts:
            first = accounts.get(account.access_key)
            if first is not None:
                warnings.append(
                    f"accessKey {account.access_key} in {f.path} is ignored: {first.source} defines it first"
                )
                continue
            accounts[account.access_key] = compile_account(account, f.path)
            if account.white_remote_address and account.white_remote_address.strip() and not strict:
                warnings.append(
                    f"accessKey {account.access_key} ({f.path}): requests from whiteRemoteAddress "
                    f"{account.white_remote_address!r} skip the signature and permission checks "
                    "(set aclStrictMode=true to check them)"
                )
    return AclState(Whitelist.compile(white), accounts, tuple(files), strict), warnings


# -- resources per request code (§5.3) ------------------------------------------------------------------------------


class ResourceError(Exception):
    """The request cannot be read well enough to know what it touches (a malformed heartbeat body)."""


def _retry(group: str | None) -> str | None:
    return perm.RETRY_PREFIX + group if group else None


def resources_for(cmd: RemotingCommand) -> list[tuple[str, int]]:
    """The (resource, needed permission) pairs of a request; an empty list means signature (and admin) only."""
    ext = cmd.ext_fields
    code = cmd.code
    out: list[tuple[str | None, int]] = []
    if code == RequestCode.SEND_MESSAGE:
        topic = ext.get("topic")
        if topic and topic.startswith(perm.RETRY_PREFIX):
            out.append((_retry(ext.get("group")), perm.SUB))
        else:
            out.append((topic, perm.PUB))
    elif code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        # RocketMQ 4.9.8 checks nothing for SEND_BATCH_MESSAGE; a batch needs PUB on its topic here, like a send.
        topic = ext.get("b")
        if topic and topic.startswith(perm.RETRY_PREFIX):
            out.append((_retry(ext.get("a")), perm.SUB))
        else:
            out.append((topic, perm.PUB))
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        out.append((_retry(ext.get("group")), perm.SUB))
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
        out.append((ext.get("topic"), perm.SUB))
        out.append((_retry(ext.get("consumerGroup")), perm.SUB))
    elif code == RequestCode.QUERY_MESSAGE:
        out.append((ext.get("topic"), perm.SUB))
    elif code == RequestCode.HEART_BEAT:
        try:
            data = orjson.loads(cmd.body) if cmd.body else {}
            for consumer in data.get("consumerDataSet") or []:
                out.append((_retry(str(consumer.get("groupName") or "")), perm.SUB))
                for sub in consumer.get("subscriptionDataSet") or []:
                    out.append((str(sub.get("topic") or "") or None, perm.SUB))
        except (orjson.JSONDecodeError, AttributeError, TypeError) as exc:
            raise ResourceError(f"heartbeat body cannot be read for the access check: {exc}") from None
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        out.append((_retry(ext.get("consumerGroup")), perm.SUB))
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        out.append((_retry(ext.get("consumerGroup")), perm.SUB))
        out.append((ext.get("topic"), perm.SUB))
    return [(r, p) for r, p in out if r]


# -- the decision (§5.2, §5.4) --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a request was refused. ``reason`` starts with RocketMQ's wording so that people can search for it."""

    reason: str
    access_key: str | None = None
    forbidden: bool = False  # the caller is known (signature checked) but lacks the permission

    @property
    def remark(self) -> str:
        return f"[TXMQ ACL] {self.reason}"


def check_resources(account: CompiledAccount, needed: Sequence[tuple[str, int]]) -> Denial | None:
    """§5.4: explicit perms first, else the topic or group default; an admin with no explicit perms passes."""
    if not needed:
        return None
    owned_map = account.resource_perms
    if not owned_map and account.admin:
        return None
    for resource, needed_bits in needed:
        owned = owned_map.get(resource)
        group = perm.is_group_resource(resource)
        if owned is None:
            owned = account.default_group_perm if group else account.default_topic_perm
            source = "defaultGroupPerm" if group else "defaultTopicPerm"
        else:
            source = "groupPerms" if group else "topicPerms"
        if not perm.check_perm(needed_bits, owned):
            return Denial(
                f"No default permission for {perm.describe_resource(resource)} "
                f"(accessKey={account.access_key} needs {perm.perm_name(needed_bits)}, "
                f"its {source} gives {perm.perm_name(owned)})",
                account.access_key,
                True,
            )
    return None


def decide(state: AclState, peer_ip: str, cmd: RemotingCommand) -> Denial | None:
    """Allow (None) or deny one 4.x request from ``peer_ip``."""
    ext = cmd.ext_fields
    return decide_access(
        state,
        peer_ip,
        ext.get(ACCESS_KEY) or "",
        lambda secret: verify_signature(ext, cmd.body, secret),
        admin_only=needs_admin(cmd.code),
        what=f"request code={cmd.code}",
        resources=lambda: resources_for(cmd),
    )


def decide_access(
    state: AclState,
    peer_ip: str,
    access_key: str,
    signature_ok: Callable[[str], bool],
    *,
    admin_only: bool,
    what: str,
    resources: Callable[[], Sequence[tuple[str, int]]],
) -> Denial | None:
    """The decision for any door: ``signature_ok(secret_key)`` checks the request's signature as that door signs;
    ``resources()`` lists the (resource, permission) pairs it needs (may raise :class:`ResourceError`).

    In strict mode an account's whiteRemoteAddress restricts where it may connect from instead of replacing the
    signature, and requests that carry an AccessKey are checked even from globally whitelisted addresses.
    """
    if state.global_whitelist.matches(peer_ip) and not (state.strict and access_key):
        return None
    if not access_key:
        return Denial("No accessKey is configured (the request carries no AccessKey)")
    account = state.accounts.get(access_key)
    if account is None:
        return Denial(f"No acl config for {access_key}", access_key)
    if account.whitelist:
        allowed_here = account.whitelist.matches(peer_ip)
        if allowed_here and not state.strict:
            return None
        if not allowed_here and state.strict:
            return Denial(
                f"accessKey={access_key} may not be used from {peer_ip} (not in its whiteRemoteAddress)", access_key
            )
    if not signature_ok(account.secret_key):
        return Denial(f"Check signature failed for accessKey={access_key}", access_key)
    if admin_only and not account.admin:
        return Denial(f"Need admin permission for {what}, but accessKey={access_key} is not", access_key, True)
    try:
        needed = resources()
    except ResourceError as exc:
        return Denial(str(exc), access_key)
    if any(r == TRACE_TOPIC and p & perm.PUB for r, p in needed):
        return None
    return check_resources(account, needed)
