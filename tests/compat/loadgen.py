"""Pytest-side helper for bench/loadgen (txmq-loadgen), the compiled load generator of bench/bench_rocketmq.py:
build it (Go's standard library only) and run one window of it to completion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

LOADGEN_DIR = Path(__file__).resolve().parents[2] / "bench" / "loadgen"
BINARY = LOADGEN_DIR / "bin" / "txmq-loadgen"


def ensure_binary() -> Path:
    proc = subprocess.run(["bash", str(LOADGEN_DIR / "build.sh")], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not BINARY.exists():
        pytest.fail(f"bench/loadgen/build.sh exited with {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return BINARY


def window(namesrv: str, mode: str, topic: str, group: str, inflight: int, warmup: int) -> dict[str, Any]:
    """One window of ``mode`` (publish or tx) for a second; its result line."""
    cmd = [str(ensure_binary()), "--mode", mode, "--namesrv", namesrv, "--topic", topic, "--group", group]
    cmd += ["--inflight", str(inflight), "--seconds", "1", "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"txmq-loadgen exited with {proc.returncode}: {proc.stderr}"
    (line,) = proc.stdout.splitlines()
    return json.loads(line)
