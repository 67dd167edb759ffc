"""``txmq chaos``: the fault campaign (kill -9 under load, fuzzed frames, the ACL matrix, full disks, corrupt
files) against real brokers it starts itself; prints a table, writes JSON, exits 1 when a must-be-zero count is not.
See docs/reliability.md."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PARTS = ("crash", "fuzz", "grpc-fuzz", "acl", "disk", "corrupt", "failover")
# --quick: what CI runs (the counts the issue asks of CI); the long defaults: a dedicated run.
QUICK = {"trials": 25, "frames": 20_000, "grpc_requests": 2_000, "disk_cycles": 2, "failovers": 5}
LONG = {"trials": 1000, "frames": 1_000_000, "grpc_requests": 200_000, "disk_cycles": 20, "failovers": 50}


def _progress(quiet: bool) -> Any:
    started = time.monotonic()

    def say(line: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    return say


async def _campaign(args: argparse.Namespace, work: Path, parts: list[str]) -> Any:
    from txmq.chaos.report import CampaignReport

    report = CampaignReport("quick" if args.quick else "long", args.seed)
    say = _progress(args.quiet)
    for part in parts:
        say(f"{part}: starting")
        if part == "crash":
            from txmq.chaos.crash import CrashSettings, run_crash_campaign

            settings = CrashSettings(trials=args.trials, seed=args.seed, cpp=not args.no_cpp)
            if args.quick:
                settings.load_min, settings.load_max = 0.1, 0.8
            report.parts.append(await run_crash_campaign(settings, work / "crash", say))
        elif part == "fuzz":
            from txmq.chaos.fuzz import FuzzSettings, run_fuzz_campaign

            report.parts.append(
                await run_fuzz_campaign(FuzzSettings(frames=args.frames, seed=args.seed), work / "fuzz", say)
            )
        elif part == "grpc-fuzz":
            from txmq.chaos.fuzz_grpc import GrpcFuzzSettings, run_grpc_fuzz_campaign

            report.parts.append(
                await run_grpc_fuzz_campaign(
                    GrpcFuzzSettings(requests=args.grpc_requests, seed=args.seed), work / "grpc-fuzz", say
                )
            )
        elif part == "acl":
            from txmq.chaos.acl_matrix import run_acl_matrix

            report.parts.append(await run_acl_matrix(work / "acl", say))
        elif part == "disk":
            from txmq.chaos.disk import DiskSettings, run_disk_campaign

            report.parts.append(
                await run_disk_campaign(DiskSettings(cycles=args.disk_cycles, seed=args.seed), work / "disk", say)
            )
        elif part == "corrupt":
            from txmq.chaos.corrupt import run_corrupt_campaign

            report.parts.append(await run_corrupt_campaign(work / "corrupt", say, quick=args.quick))
        elif part == "failover":
            from txmq.chaos.failover import FailoverSettings, run_failover_campaign

            fo = FailoverSettings(failovers=args.failovers, seed=args.seed, cpp=not args.no_cpp)
            if args.quick:
                fo.load_min, fo.load_max = 0.3, 1.0
            report.parts.append(await run_failover_campaign(fo, work / "failover", say))
        say(f"{part}: {'ok' if report.parts[-1].ok else 'FAILED'}")
    return report


def cmd_chaos(args: argparse.Namespace) -> int:
    from txmq.cli import _run

    defaults = QUICK if args.quick else LONG
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    chosen = args.parts or ",".join(PARTS)
    parts = [p.strip() for p in chosen.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"txmq chaos: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    # The clients' reconnect warnings are the expected noise of a campaign that kills their broker.
    logging.getLogger("txmq").setLevel(logging.ERROR)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="txmq-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    report: Any = None

    async def main() -> None:
        nonlocal report
        report = await _campaign(args, work, parts)

    status = _run(main)
    if report is None:
        return status or 2
    print(report.table(), flush=True)
    json_path = Path(args.json) if args.json else work / "chaos.json"
    report.write_json(json_path)
    print(f"JSON: {json_path}", flush=True)
    if not args.work_dir and not args.keep and report.ok:
        shutil.rmtree(work, ignore_errors=True)
    elif not report.ok:
        print(f"kept the work directory (logs, stores): {work}", flush=True)
    return 0 if report.ok else 1


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "chaos",
        help="the fault campaign: kill -9 under load, fuzzed frames, the ACL matrix, full disks, corrupt files",
    )
    p.add_argument("--quick", action="store_true", help=f"CI's sizes {QUICK} (default: the long run's {LONG})")
    p.add_argument(
        "--parts",
        default=None,
        help=f"comma-separated, from {','.join(PARTS)} (default all)",
    )
    p.add_argument("--trials", type=int, default=None, help="kill -9 trials of the crash campaign")
    p.add_argument("--frames", type=int, default=None, help="fuzzed frames sent to the 4.x door")
    p.add_argument("--grpc-requests", type=int, default=None, help="fuzzed requests sent to the 5.x gRPC door")
    p.add_argument("--disk-cycles", type=int, default=None, help="fill-the-disk cycles")
    p.add_argument("--failovers", type=int, default=None, help="master kills of the failover part (etcd needed)")
    p.add_argument("--seed", type=int, default=20261125, help="the campaign's random seed (reruns are the same plan)")
    p.add_argument("--json", default=None, help="where to write the JSON report (default WORK_DIR/chaos.json)")
    p.add_argument("--work-dir", default=None, help="brokers' data and logs (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the temporary work directory even when all passed")
    p.add_argument("--no-cpp", action="store_true", help="leave the official C++ client out of the crash load")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_chaos)
