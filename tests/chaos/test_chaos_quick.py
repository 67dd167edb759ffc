"""CI's run of the fault campaign: ``txmq chaos --quick`` (at least 25 kill -9 trials, 2 disk-full cycles, 20 000
fuzzed frames, 2 000 fuzzed gRPC requests, the whole ACL matrix, damaged commit-log files) as a separate process,
judged from the JSON it writes. Its own pass/fail is not trusted: every count that must be zero is read back here, and
so are the sizes that make the run mean something.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_quick_campaign_finds_nothing(tmp_path: Path) -> None:
    parts = ["crash", "fuzz", "grpc-fuzz", "acl", "corrupt"]
    if os.geteuid() == 0:
        parts.append("disk")  # mounting the small tmpfs needs root (CI runs as root)
    out = tmp_path / "chaos.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txmq",
            "chaos",
            "--quick",
            "--parts",
            ",".join(parts),
            "--json",
            str(out),
            "--work-dir",
            str(tmp_path / "work"),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert out.exists(), f"no JSON written (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(out.read_text())
    got = report["parts"]
    assert set(got) == set(parts)
    for name in parts:
        part = got[name]
        assert part["error"] is None, f"{name}: {part['error']}"
        bad = {k: v for k, v in part["must_be_zero"].items() if v}
        assert not bad, f"{name}: {bad}; examples: {json.dumps(part['examples'], indent=1)[:3000]}"
    crash = got["crash"]
    assert set(crash["must_be_zero"]) >= {
        "lost",
        "not_delivered",
        "duplicated",
        "reordered",
        "unexpected",
        "in_doubt_left",
    }
    assert crash["info"]["kills"] >= 25
    assert crash["info"]["acknowledged_sends"] > 1000 and crash["info"]["transactions_committed"] > 50
    assert crash["info"]["checks_answered_total"] > 0  # in-doubt transactions were settled by checks
    fuzz = got["fuzz"]
    assert fuzz["info"]["frames"] >= 20_000
    assert fuzz["info"]["good_client_round_trips"] > 0
    assert fuzz["info"]["captured_codes"] + fuzz["info"]["built_codes"] >= 60
    # Seeds captured from txmq's client, whether the hot path runs compiled (CI) or interpreted.
    assert fuzz["info"]["captured_codes"] >= 20
    grpc_fuzz = got["grpc-fuzz"]
    assert grpc_fuzz["info"]["requests"] >= 1_900 and grpc_fuzz["info"]["raw_connections"] >= 10
    assert grpc_fuzz["info"]["good_client_round_trips"] > 0
    assert grpc_fuzz["info"]["captured_methods"] >= 11  # every RPC the door serves, Telemetry included
    assert grpc_fuzz["info"]["built_methods"] == 6
    assert grpc_fuzz["info"]["answered"] > 0
    acl = got["acl"]
    assert acl["info"]["cells"] == 5 * 3 * 5 * acl["info"]["families"]
    assert acl["info"]["accepted"] > 0 and acl["info"]["refused"] > 0
    corrupt = got["corrupt"]
    assert set(corrupt["must_be_zero"]) >= {"not_reported_at_start", "served_damaged", "good_records_lost"}
    assert sorted(corrupt["info"]) == ["flip after a clean stop", "smash after a kill -9"]
    if "disk" in got:
        assert got["disk"]["info"]["cycles"] >= 2 and got["disk"]["info"]["disk_full_refusals"] >= 2
    assert report["ok"] and proc.returncode == 0, proc.stdout[-2000:]
