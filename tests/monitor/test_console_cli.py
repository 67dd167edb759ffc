"""``txmq console`` on its own against a running cluster: it serves the pages from the cluster's name server, and
refuses to act for people with an admin account when nobody has to log in."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from typing import Any

from cluster_harness import free_port
from txmq.testing import eventually


def test_txmq_console_serves_a_cluster(make_cluster: Any) -> None:
    cluster = make_cluster({"metricsPort": "0"})
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "txmq", "console", "-n", cluster.namesrv_addr, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def cluster_page() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    return str(response.read().decode())
            except OSError:
                return None

        page = eventually(cluster_page, "the console's cluster page", timeout=30)
        assert "broker-a" in page and cluster.broker_addr in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/topics?all=1", timeout=5) as response:
            assert "TBW102" in response.read().decode()
        # A change without the page's CSRF token is refused, even with ACL off.
        request = urllib.request.Request(f"http://127.0.0.1:{port}/dlq/resend", data=b"group=G&id=X&confirm=yes")
        try:
            urllib.request.urlopen(request, timeout=5)
            raise AssertionError("a POST without a CSRF token was accepted")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"txmq console on http://127.0.0.1:{port}/" in out
    assert "POST /dlq/resend -> 403" in out  # the audit log line


def test_txmq_console_wants_a_login_before_it_acts_with_an_admin_account() -> None:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "txmq", "console", "-n", "127.0.0.1:1", "--access-key", "adminUser01",
         "--secret-key", "adminSecret01"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "give --acl-file too" in done.stdout, (done.stdout, time.monotonic() - t0)
