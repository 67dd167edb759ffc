"""txmq against txmq: two or more broker variants under the same load, their windows alternating.

A variant is ``NAME`` or ``NAME:KEY=VALUE,KEY=VALUE``. An upper-case key is an environment variable of that broker's
process (``PYTHONPATH=/tmp/old/src`` runs another checkout, with its own compiled modules); any other key is a
``broker.conf`` key (``groupCommitWaitMicros=0``). Each variant is a ``txmq dev`` of its own, started once and paused
(SIGSTOP) while another one is measured; rounds alternate the order (A B, B A, ...), so that the machine's drift
falls on every variant. The load is bench/loadgen (Go), as in bench/bench_rocketmq.py: publish at any number in
flight, or transactions (half message + commit). Prints each window and, per variant, the median rate and broker
CPU per message (utime + stime of the whole ``txmq dev`` process). Not a test: it prints figures and asserts nothing.

    .venv/bin/python bench/bench_variants.py --mode tx --inflight 16 --rounds 6 --seconds 5 \\
        off:groupCommitWaitMicros=0 on
    .venv/bin/python bench/bench_variants.py --mode publish --inflight 1 old:PYTHONPATH=/tmp/old/src new
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_rocketmq
from txmq.testing import DevCluster


def parse_variant(spec: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """``NAME[:K=V,...]`` -> (name, environment, broker.conf)."""
    name, _, rest = spec.partition(":")
    env: dict[str, str] = {}
    conf: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"variant {spec!r}: {item!r} is not KEY=VALUE")
        (env if key.isupper() else conf)[key] = value
    return name, env, conf


def start(base: Path, name: str, env: dict[str, str], conf: dict[str, str]) -> bench_rocketmq.Broker:
    saved = dict(os.environ)
    os.environ.update(env)  # DevCluster hands its environment to the child
    try:
        cluster = DevCluster(base / name, conf)
        cluster.start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert cluster.proc is not None
    broker = bench_rocketmq.Broker(name, cluster, cluster.proc.pid, [cluster.proc.pid])
    broker.pause()
    return broker


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="+", help="NAME or NAME:KEY=VALUE,... (upper case: environment)")
    parser.add_argument("--mode", choices=("publish", "tx"), default="tx")
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    variants = [parse_variant(spec) for spec in args.variants]
    if len({name for name, _, _ in variants}) != len(variants):
        raise SystemExit("variant names must differ")
    base = Path(tempfile.mkdtemp(prefix="txmq-variants-"))
    brokers: list[bench_rocketmq.Broker] = []
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    try:
        for name, env, conf in variants:
            brokers.append(start(base, name, env, conf))
        load = ("--mode", args.mode, "--inflight", str(args.inflight), "--seconds", str(args.seconds))
        for r in range(args.rounds):
            for b in brokers if r % 2 == 0 else brokers[::-1]:
                topic = f"Variants_{r}"
                out = b.window(*load, "--topic", topic, "--group", topic, topic=topic)
                results[b.name].append(out)
                print(f"round {r} {b.name}: {out['rate']:,.0f}/s, {out['cpuMicrosPerMessage']:.1f} us CPU", flush=True)
    finally:
        for b in brokers:
            try:
                b.resume()
            finally:
                b.cluster.stop()
    print(f"\n{args.mode} x{args.inflight}, {args.rounds} rounds of {args.seconds} s")
    print("| variant | rate (median, min-max) | broker CPU per message (median, us) |")
    print("|---|---|---|")
    for name, rows in results.items():
        rates = [row["rate"] for row in rows]
        cpu = statistics.median(row["cpuMicrosPerMessage"] for row in rows)
        print(f"| {name} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) | {cpu:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
