"""ACL on a broker's front door: the Dispatcher hook, the ACL admin requests (codes 50-53), and the file watcher.

The broker creates one :class:`AclService` when ``aclEnable=true`` and calls :meth:`install`, :meth:`start` and
:meth:`close`. It knows the broker only through a few config attributes (names and address), so this package does
not import the broker.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson

from txmq.acl.config import AccountChange, parse_perm_pairs
from txmq.acl.decision import AclState, Denial, decide
from txmq.acl.manager import AclAdminError, AclManager, default_paths
from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand

log = logging.getLogger("txmq.acl")

RELOAD_INTERVAL_SECONDS = 2.0
DENIAL_LOG_INTERVAL_SECONDS = 10.0  # one log line per (peer, accessKey, reason) in this window; the rest are counted


class AclService:
    def __init__(
        self,
        plain_file: str | Path,
        acl_dir: str | Path | None,
        *,
        strict: bool = False,
        clock: Clock = SYSTEM_CLOCK,
        broker_config: Any = None,
        reload_interval: float = RELOAD_INTERVAL_SECONDS,
    ) -> None:
        self.manager = AclManager(plain_file, acl_dir, strict=strict)
        self.clock = clock
        self.broker_config = broker_config
        self.reload_interval = reload_interval
        self._task: asyncio.Task[None] | None = None
        self._admin_lock = asyncio.Lock()
        self._denials: dict[tuple[str, str, str], list[float]] = {}  # key -> [last logged at, suppressed count]
        if not self.manager.plain_file.exists():
            log.warning(
                "aclEnable=true but %s does not exist: only globally whitelisted addresses get in until it is created",
                self.manager.plain_file,
            )
        self.manager.reload(force=True)
        if not self.manager.files:
            self.manager._rebuild()  # log what is in force even when no file exists

    @classmethod
    def from_broker_config(cls, config: Any, *, clock: Clock = SYSTEM_CLOCK) -> AclService:
        """``aclFile`` / ``aclDir`` / ``aclStrictMode`` from broker.conf; empty paths mean RocketMQ's layout."""
        default_file, default_dir = default_paths(config.store_path_root_dir)
        plain = getattr(config, "acl_file", "") or default_file
        acl_dir = getattr(config, "acl_dir", "") or default_dir
        return cls(
            plain, acl_dir, strict=bool(getattr(config, "acl_strict_mode", False)), clock=clock, broker_config=config
        )

    @property
    def state(self) -> AclState:
        return self.manager.state

    # -- wiring --------------------------------------------------------------------------------------------------

    def install(self, dispatcher: Any) -> None:
        dispatcher.add_hook(self.hook)
        dispatcher.register(RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, self.update_acl_config)
        dispatcher.register(RequestCode.DELETE_ACL_CONFIG, self.delete_acl_config)
        dispatcher.register(RequestCode.GET_BROKER_CLUSTER_ACL_INFO, self.get_acl_info)
        dispatcher.register(RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, self.update_global_white_addrs)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name="acl-file-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.clock.sleep(self.reload_interval)
            try:
                await loop.run_in_executor(None, self.manager.reload)
            except Exception:  # a watcher that dies would freeze the ACL silently
                log.exception("ACL reload failed; the configuration in force is unchanged")

    # -- the hook ------------------------------------------------------------------------------------------------

    def hook(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
        peer_ip = conn.peer[0] if getattr(conn, "peer", None) else ""
        try:
            denial = decide(self.manager.state, peer_ip, cmd)
        except Exception as exc:  # never let a bad request take the hook down; refuse it instead
            log.exception("ACL check failed on request code %d from %s", cmd.code, peer_ip)
            denial = Denial(f"access check failed: {exc}")
        if denial is None:
            return None
        self._log_denial(peer_ip, cmd, denial)
        return cmd.response(ResponseCode.SYSTEM_ERROR, denial.remark)

    def _log_denial(self, peer_ip: str, cmd: RemotingCommand, denial: Denial) -> None:
        key = (peer_ip, denial.access_key or "", denial.reason)
        now = self.clock.monotonic()
        entry = self._denials.get(key)
        if entry is not None and now - entry[0] < DENIAL_LOG_INTERVAL_SECONDS:
            entry[1] += 1
            return
        suppressed = int(entry[1]) if entry is not None else 0
        self._denials[key] = [now, 0]
        if len(self._denials) > 10_000:
            self._denials = {k: v for k, v in self._denials.items() if now - v[0] < DENIAL_LOG_INTERVAL_SECONDS}
        log.warning(
            "ACL denied request code %d%s from %s (accessKey=%s): %s%s",
            cmd.code,
            " (oneway, dropped)" if cmd.is_oneway else "",
            peer_ip or "?",
            denial.access_key or "-",
            denial.reason,
            f" [{suppressed} similar denial(s) not logged]" if suppressed else "",
        )

    # -- admin requests ------------------------------------------------------------------------------------------

    async def _run_admin(self, cmd: RemotingCommand, failure_code: int, fn: Any, *args: Any) -> RemotingCommand:
        async with self._admin_lock:
            try:
                where = await asyncio.get_running_loop().run_in_executor(None, fn, *args)
            except AclAdminError as exc:
                log.warning("ACL admin request code %d refused: %s", cmd.code, exc)
                return cmd.response(failure_code, str(exc))
        return cmd.response(ResponseCode.SUCCESS, f"written to {where}")

    async def update_acl_config(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        access_key = (ext.get("accessKey") or "").strip()
        failed = ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        if not access_key:
            return cmd.response(failed, "accessKey is required")
        admin_text = ext.get("admin")
        change = AccountChange(
            access_key=access_key,
            secret_key=ext.get("secretKey") or None,
            white_remote_address=ext.get("whiteRemoteAddress"),
            admin=None if admin_text is None else admin_text.strip().lower() == "true",
            default_topic_perm=ext.get("defaultTopicPerm") or None,
            default_group_perm=ext.get("defaultGroupPerm") or None,
            topic_perms=parse_perm_pairs(ext.get("topicPerms")),
            group_perms=parse_perm_pairs(ext.get("groupPerms")),
        )
        return await self._run_admin(cmd, failed, self.manager.update_account, change)

    async def delete_acl_config(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        access_key = (cmd.ext_fields.get("accessKey") or "").strip()
        failed = ResponseCode.DELETE_ACL_CONFIG_FAILED
        if not access_key:
            return cmd.response(failed, "accessKey is required")
        return await self._run_admin(cmd, failed, self.manager.delete_account, access_key)

    async def update_global_white_addrs(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        if "globalWhiteAddrs" not in ext:
            return cmd.response(failed, "globalWhiteAddrs is required (comma-separated; empty clears the list)")
        return await self._run_admin(
            cmd, failed, self.manager.update_global_whitelist, ext["globalWhiteAddrs"], ext.get("aclFileFullPath")
        )

    def get_acl_info(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's GetBrokerAclConfigResponseHeader, plus a JSON body with what is in force (secrets masked)."""
        manager = self.manager
        state = manager.state
        files = manager.file_report()
        cfg = self.broker_config
        header = {
            "version": orjson.dumps(manager.data_version()).decode(),
            "allAclFileVersion": orjson.dumps({k: v["md5"] for k, v in files.items()}).decode(),
            "brokerName": str(getattr(cfg, "broker_name", "")),
            "brokerAddr": str(getattr(cfg, "broker_addr", "")),
            "clusterName": str(getattr(cfg, "broker_cluster_name", "")),
        }
        body = {
            "strictMode": state.strict,
            "globalWhiteAddrs": [p.text for p in state.global_whitelist.patterns],
            "plainAccessConfigs": [
                {**a.account.describe(), "file": a.source}
                for a in sorted(state.accounts.values(), key=lambda a: a.access_key)
            ],
            "files": files,
            "version": manager.data_version(),
        }
        return cmd.response(ResponseCode.SUCCESS, None, header, orjson.dumps(body))
