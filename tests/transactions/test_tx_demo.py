"""``txmq demo orders`` as a user runs it: a subprocess with its own embedded name server and broker."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_orders_reconciles_with_zero_inconsistencies() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "txmq", "demo", "orders", "--orders", "30"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "reconciliation: 0 inconsistencies (consistent)" in out
    assert "order 9527: committed in the database -> COMMIT" in out
    # Each scripted path happened: declined orders, crashes after and before the DB commit, both check answers.
    assert "declined; database rolled back -> ROLLBACK" in out
    # Check-backs read txmq_transactions: a missing row is UNKNOWN during the grace period, ROLLBACK after it.
    assert re.search(r"check-back for order \d+: found in txmq_transactions -> COMMIT", out)
    assert re.search(r"check-back for order \d+: not in txmq_transactions, within the grace period -> UNKNOWN", out)
    assert re.search(r"check-back for order \d+: not in txmq_transactions after the grace period -> ROLLBACK", out)
    assert re.search(r"rows in txmq_transactions\s+22\n", out)
    delivered = int(re.search(r"messages delivered\s+(\d+)", out).group(1))
    committed = int(re.search(r"committed in the database\s+(\d+)", out).group(1))
    assert delivered == committed == 22
