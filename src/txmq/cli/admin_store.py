"""``txmq admin store verify``: check a store's commit log offline, listing every damaged range with its offsets."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any


def _commitlog_dir(data: str) -> str | None:
    """``data`` may be the commitlog folder, a store root (storePathRootDir) or a ``txmq dev`` data folder."""
    for candidate in (data, os.path.join(data, "commitlog"), os.path.join(data, "store", "commitlog")):
        if os.path.basename(os.path.normpath(candidate)) == "commitlog" and os.path.isdir(candidate):
            return candidate
    return None


def verify(args: argparse.Namespace) -> int:
    from txmq.store.verify import verify_directory

    directory = _commitlog_dir(args.data)
    if directory is None:
        print(f"txmq: no commitlog folder in {args.data} (give a store root or its commitlog folder)", file=sys.stderr)
        return 2
    report = verify_directory(directory, args.segment_size)
    if args.json:
        print(
            json.dumps(
                {
                    "directory": directory,
                    "segments": report.segments,
                    "records": report.records,
                    "bytes": report.bytes,
                    "end": report.end,
                    "damaged": [d.to_json() for d in report.damage],
                    "notes": report.notes,
                },
                indent=2,
            )
        )
    else:
        print(
            f"{directory}: {report.segments} segments, {report.records} sound records ({report.bytes} bytes), "
            f"data ends at {report.end}"
        )
        for d in report.damage:
            print(f"DAMAGED {d.describe()}")
        for note in report.notes:
            print(f"note: {note}")
        print("no damage found" if report.ok else f"{len(report.damage)} damaged ranges")
    return 0 if report.ok else 1


def add_parser(what: Any, groups: dict[str, Any], run: Callable[..., Any]) -> None:
    store = what.add_parser("store", help="the broker's files").add_subparsers(dest="op", required=True)
    ver = store.add_parser(
        "verify",
        help="check every commit-log record (frame and body CRC) offline; exit 1 when damage is found",
        description="Reads the commit-log files read-only (the broker may run, but a running broker's last segment "
        "can end in records being written). Prints each damaged range with its commit-log offsets and file.",
    )
    ver.add_argument(
        "--data",
        required=True,
        help="the store root (storePathRootDir), its commitlog folder, or a `txmq dev` data folder",
    )
    ver.add_argument(
        "--segment-size", type=int, default=None, help="mappedFileSizeCommitLog (default: the largest file)"
    )
    ver.add_argument("--json", action="store_true", help="print JSON")
    ver.set_defaults(func=verify)
