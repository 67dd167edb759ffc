"""Application databases for tests: a private, throwaway PostgreSQL server, and :func:`connect` that opens either
database from one string, so that child processes get theirs from the command line.

The PostgreSQL server has a temporary data folder, trust authentication, a free loopback port and its own socket
folder, and is stopped and deleted at the end with no process left behind. ``initdb`` refuses to run as root, so as
root the server runs as the ``postgres`` system user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from cluster_harness import free_port


def connect(spec: str) -> Any:
    """A new DB-API connection, not in autocommit mode: ``sqlite:PATH`` or ``postgresql:CONNINFO``."""
    kind, _, target = spec.partition(":")
    if kind == "sqlite":
        # IMMEDIATE: a writer takes the write lock at its first write, so two processes never deadlock upgrading.
        return sqlite3.connect(target, timeout=30, isolation_level="IMMEDIATE")
    if kind == "postgresql":
        import psycopg

        return psycopg.connect(target)
    raise ValueError(f"unknown database spec {spec!r}")


def postgres_bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (PATH first, then Debian's versioned folders), or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(folder, "initdb").exists() and Path(folder, "pg_ctl").exists():
            return Path(folder)
    return None


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="txmq-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.port = 0
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *args: str) -> None:
        proc = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")

    def start(self) -> PostgresServer:
        self._run("mkdir", "-p", str(self.socket_dir))
        self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--locale=C", "--no-sync",
        )  # fmt: skip
        self.port = free_port()
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} -c fsync=off -c max_connections=50"
        )
        try:
            self._run(
                str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                "-t", "60", "-o", options, "start",
            )  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def create_database(self) -> str:
        """A new empty database; returns its conninfo."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.conninfo(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def query(spec: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows ``sql`` returns, on a new connection to ``spec``."""
    conn = connect(spec)
    try:
        cur = conn.cursor()
        cur.execute(sql)
        return [tuple(row) for row in cur.fetchall()]
    finally:
        conn.close()


def execute(spec: str, sql: str) -> None:
    """Run ``sql`` on a new connection to ``spec`` and commit."""
    conn = connect(spec)
    try:
        conn.cursor().execute(sql)
        conn.commit()
    finally:
        conn.close()
