"""ACL files on disk: loading, polling for changes, and admin edits, with all-or-nothing reloads per file.

:class:`AclManager` keeps, for every file, the last version that parsed and validated. A file that fails is
rejected as a whole and its last good version stays in force; a deleted file takes its accounts with it. The
compiled :class:`~txmq.acl.decision.AclState` is rebuilt from the good versions and swapped in one assignment.
Methods are synchronous and serialised by a lock; callers run them in a thread when disk latency matters.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txmq.acl.config import AccountChange, AclConfigError, AclFile, dump_document, parse_acl_text
from txmq.acl.decision import AclState, compile_acl
from txmq.acl.whitelist import split_top_level
from txmq.util import atomic_write_bytes

log = logging.getLogger("txmq.acl")

FULL_CHECK_EVERY = 10  # polls between digest checks of files whose size, mtime and inode look unchanged


class AclAdminError(Exception):
    """An admin change that was refused; the message says why."""


@dataclass(slots=True)
class FileState:
    signature: tuple[int, int, int]  # (mtime_ns, size, inode)
    md5: str
    good: AclFile | None  # the last version that validated, in force
    error: str | None  # why the current content was rejected, if it was


class AclManager:
    """The ACL files of one broker: ``plain_file`` first, then ``acl_dir``'s ``*.yml``/``*.yaml`` by name."""

    def __init__(self, plain_file: str | Path, acl_dir: str | Path | None = None, *, strict: bool = False) -> None:
        self.plain_file = Path(plain_file)
        self.acl_dir = Path(acl_dir) if acl_dir else None
        self.strict = strict
        self.state = AclState(strict=strict)
        self.files: dict[str, FileState] = {}
        self.version_counter = 0
        self.version_timestamp = int(time.time() * 1000)
        self._lock = threading.RLock()
        self._polls = 0
        self.on_change: Callable[[AclState], None] | None = None

    # -- discovery and reload ------------------------------------------------------------------------------------

    def paths(self) -> list[Path]:
        found: list[Path] = []
        if self.plain_file.is_file():
            found.append(self.plain_file)
        if self.acl_dir is not None and self.acl_dir.is_dir():
            extra = sorted(p for p in self.acl_dir.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())
            # Dot files are editors' and atomic writers' temporaries, never configuration.
            found.extend(p for p in extra if not p.name.startswith(".") and p != self.plain_file)
        return found

    def reload(self, *, force: bool = False) -> bool:
        """Look at every file once; re-parse what changed. Returns True when the state in force changed."""
        with self._lock:
            self._polls += 1
            full = force or self._polls % FULL_CHECK_EVERY == 0
            changed = False
            current = {str(p): p for p in self.paths()}
            for gone in [k for k in self.files if k not in current]:
                state = self.files.pop(gone)
                count = len(state.good.accounts) if state.good else 0
                log.warning("ACL file %s was removed: its %d account(s) no longer apply", gone, count)
                changed = changed or state.good is not None
            for key, path in current.items():
                changed = self._check_file(key, path, full) or changed
            if changed:
                self._rebuild()
            return changed

    def _check_file(self, key: str, path: Path, full: bool) -> bool:
        previous = self.files.get(key)
        try:
            st = path.stat()
            signature = (st.st_mtime_ns, st.st_size, st.st_ino)
            if previous is not None and previous.signature == signature and not full:
                return False
            data = path.read_bytes()
        except OSError as exc:
            if previous is not None and previous.error is None:
                log.error("ACL file %s cannot be read (%s); its last good version stays in force", key, exc.strerror)
            if previous is not None:
                previous.error = f"cannot read: {exc.strerror}"
            return False
        md5 = hashlib.md5(data).hexdigest()
        if previous is not None and previous.md5 == md5:
            previous.signature = signature
            return False
        good_before = previous.good if previous is not None else None
        try:
            parsed = parse_acl_text(data, key)
        except AclConfigError as exc:
            self.files[key] = FileState(signature, md5, good_before, "; ".join(exc.problems))
            kept = "its last good version stays in force" if good_before else "it was never loaded, so it adds nothing"
            log.error("ACL file %s rejected as a whole; %s. Problems:\n  %s", key, kept, "\n  ".join(exc.problems))
            return False
        self.files[key] = FileState(signature, md5, parsed, None)
        log.info(
            "ACL file %s %s: %d account(s), %d global whitelist entr%s",
            key,
            "reloaded" if previous is not None else "loaded",
            len(parsed.accounts),
            len(parsed.global_white_remote_addresses),
            "y" if len(parsed.global_white_remote_addresses) == 1 else "ies",
        )
        return True

    def _ordered_good(self) -> list[AclFile]:
        order = [str(p) for p in self.paths()]
        ranked = sorted(self.files, key=lambda k: order.index(k) if k in order else len(order))
        return [g for k in ranked if (g := self.files[k].good) is not None]

    def _rebuild(self) -> None:
        state, warnings = compile_acl(self._ordered_good(), strict=self.strict)
        for warning in warnings:
            log.warning("ACL: %s", warning)
        self.state = state  # one assignment: requests see the old state or the new one, never a mix
        self.version_counter += 1
        self.version_timestamp = int(time.time() * 1000)
        log.info(
            "ACL configuration in force: %d account(s) from %d file(s), %d global whitelist pattern(s)%s",
            len(state.accounts),
            len(state.files),
            len(state.global_whitelist.patterns),
            ", strict mode" if self.strict else "",
        )
        if self.on_change is not None:
            self.on_change(state)

    # -- admin edits ---------------------------------------------------------------------------------------------

    def _editable(self, path: Path) -> AclFile:
        """The file's current content on disk, parsed; a broken file is not edited on top of."""
        if not path.exists():
            return AclFile(str(path))
        try:
            return parse_acl_text(path.read_bytes(), str(path))
        except AclConfigError as exc:
            raise AclAdminError(
                f"ACL file {path} is invalid on disk, fix it first: {'; '.join(exc.problems)}"
            ) from None
        except OSError as exc:
            raise AclAdminError(f"ACL file {path} cannot be read: {exc.strerror}") from None

    def _write(self, path: Path, doc: dict[str, Any]) -> None:
        counter = 0
        if isinstance(doc.get("dataVersion"), list) and doc["dataVersion"]:
            counter = int(doc["dataVersion"][0].get("counter", 0))
        doc["dataVersion"] = [{"timestamp": int(time.time() * 1000), "counter": counter + 1}]
        data = dump_document(doc)
        try:
            parse_acl_text(data, str(path))  # the same validation a hand edit gets, before anything is written
        except AclConfigError as exc:
            raise AclAdminError("; ".join(p.split(": ", 1)[-1] for p in exc.problems)) from None
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            raise AclAdminError(f"cannot write ACL file {path}: {exc.strerror}") from None
        self.reload(force=True)

    def update_account(self, change: AccountChange) -> str:
        """Create or update an account in the file that defines it (else the main file); returns that file."""
        with self._lock:
            compiled = self.state.accounts.get(change.access_key)
            path = Path(compiled.source) if compiled is not None else self.plain_file
            current = self._editable(path)
            existing = current.account(change.access_key)
            if existing is None and change.secret_key is None:
                raise AclAdminError(f"accessKey {change.access_key} is new, so it needs a secretKey")
            doc = current.to_document()
            merged = change.apply(existing)
            accounts = doc["accounts"]
            for i, entry in enumerate(accounts):
                if entry["accessKey"] == change.access_key:
                    accounts[i] = merged
                    break
            else:
                accounts.append(merged)
            self._write(path, doc)
            log.info("ACL account %s %s in %s", change.access_key, "updated" if existing else "created", path)
            return str(path)

    def delete_account(self, access_key: str) -> str:
        with self._lock:
            compiled = self.state.accounts.get(access_key)
            if compiled is None:
                raise AclAdminError(f"accessKey {access_key} does not exist")
            path = Path(compiled.source)
            current = self._editable(path)
            if current.account(access_key) is None:
                raise AclAdminError(f"accessKey {access_key} is no longer in {path}")
            doc = current.to_document()
            doc["accounts"] = [a for a in doc["accounts"] if a["accessKey"] != access_key]
            self._write(path, doc)
            log.info("ACL account %s deleted from %s", access_key, path)
            return str(path)

    def update_global_whitelist(self, addresses: str, file: str | None = None) -> str:
        """Replace ``globalWhiteRemoteAddresses`` of ``file`` (one of the loaded files; default the main one)."""
        with self._lock:
            path = self.plain_file
            if file:
                known = {str(p) for p in self.paths()} | {str(self.plain_file)}
                if file not in known:
                    raise AclAdminError(f"{file} is not one of this broker's ACL files ({', '.join(sorted(known))})")
                path = Path(file)
            current = self._editable(path)
            doc = current.to_document()
            doc["globalWhiteRemoteAddresses"] = [a.strip() for a in split_top_level(addresses) if a.strip()]
            self._write(path, doc)
            log.info("ACL global whitelist of %s set to %s", path, doc["globalWhiteRemoteAddresses"])
            return str(path)

    # -- reporting -----------------------------------------------------------------------------------------------

    def data_version(self) -> dict[str, int]:
        return {"timestamp": self.version_timestamp, "counter": self.version_counter}

    def file_report(self) -> dict[str, dict[str, Any]]:
        """Per file: digest of the content on disk, whether that content is in force, and why not."""
        with self._lock:
            out: dict[str, dict[str, Any]] = {}
            for key, fs in self.files.items():
                out[key] = {
                    "md5": fs.md5,
                    "inForce": fs.good is not None and fs.error is None,
                    "inForceMd5": fs.good.md5 if fs.good is not None else None,
                    "accounts": len(fs.good.accounts) if fs.good is not None else 0,
                    "error": fs.error,
                }
            return out


def default_paths(store_root: str | Path) -> tuple[Path, Path]:
    """``<store root>/../conf/plain_acl.yml`` and ``<store root>/../conf/acl``, RocketMQ's layout beside the store."""
    conf = Path(os.path.abspath(store_root)).parent / "conf"
    return conf / "plain_acl.yml", conf / "acl"
