"""bench/bench_grpc.py still runs (a tiny window per in-process client; the Java and official Python load generators
run in the compat tests' own scenarios). Figures are printed, never checked: this is not a timing test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_grpc_runs_and_summarizes(tmp_path: Path) -> None:
    out = tmp_path / "windows.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    args = ["--seconds", "0.5", "--rounds", "1", "--inflight", "1,4", "--clients", "txmq,raw", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_grpc.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| 5.x door, raw grpc.aio stub | 4 |" in run.stdout, run.stdout
    windows = out.read_text().splitlines()
    assert len(windows) == 4
    summarize = ["--clients", "txmq,raw", "--inflight", "1,4", "--summarize", str(out)]
    summary = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_grpc.py"), *summarize],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert "| 4.x door, txmq's client | 1 |" in summary.stdout, summary.stdout
