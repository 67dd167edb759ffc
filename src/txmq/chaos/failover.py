"""The failover campaign (issue 21): two replicas of one brokerName in controller mode (a private etcd, SYNC_MASTER)
under load from txmq's client (and the official C++ client when its venv is there); the master is killed with
SIGKILL at random moments, N times. After each kill the campaign waits for the first acknowledged send on the new
master, then restarts the killed replica (it rejoins as a slave, cutting any tail the new master never had) and
waits until both are in the in-sync set again.

Counted:

* lost: an acknowledged send (SEND_OK) missing from the store at the end (must be 0);
* no_new_master: a kill after which no send was acknowledged within ``master_timeout`` (must be 0);
* seconds from each kill to the first acknowledged send that *started* after it (p50, max; target under 10 s);
* bytes cut from the old masters' logs when they rejoined (their unacknowledged tails).

Every ``freeze_every``-th round freezes the master with SIGSTOP instead, for longer than its lease, and resumes it
once the other replica acknowledges sends: ``split_brain_acks`` (must be 0) counts sends the frozen master
acknowledged after the new master's first one; it must rejoin as a slave on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txmq.chaos.common import DriverProcess
from txmq.chaos.report import PartResult
from txmq.protocol.record.codec import decode_offset_msg_id
from txmq.testing import EtcdServer, ExtraBroker, NameServerProcess, etcd_binary

BROKER = "broker-failover"
TOPIC = "ChaosFailover"
_DROPPED = re.compile(r"dropped (\d+) bytes of commit log")


@dataclass
class FailoverSettings:
    failovers: int = 50
    seed: int = 0
    cpp: bool = True
    senders: int = 4
    load_min: float = 0.5  # seconds of load before each kill
    load_max: float = 3.0
    master_timeout: float = 60.0
    freeze_every: int = 3  # every third round is SIGSTOP (then SIGCONT) instead of SIGKILL; 0: never
    lease_seconds: float = 3.0
    consumer_pause: float = 1.0  # the C++ push consumer is frozen this long before each kill (a backlog to read)
    drain_patience: float = 60.0  # the C++ push consumer's drain ends after this long without progress


@dataclass
class _Ack:
    started: float
    acked: float
    body: str
    broker: str = ""  # host:port of the broker that stored it (from the offsetMsgId)


@dataclass
class _Load:
    """Sender threads (txmq's sync Producer); each body is sent once, no retries by the client."""

    namesrv: str
    senders: int
    acks: list[_Ack] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.senders):
            t = threading.Thread(target=self._run, args=(n,), daemon=True, name=f"failover-sender-{n}")
            t.start()
            self.threads.append(t)

    def _run(self, n: int) -> None:
        from txmq.client import Message
        from txmq.client.sync import Producer

        with Producer("ChaosFailoverProducers", self.namesrv, instance_name=f"failover-{n}") as producer:
            i = 0
            while not self.stop.is_set():
                body = f"fo-{n}-{i}"
                i += 1
                started = time.monotonic()
                try:
                    result = producer.send(Message(TOPIC, body.encode()))
                except Exception:
                    self.failures += 1
                    time.sleep(0.05)
                    continue
                if result.status.name == "SEND_OK":
                    (ip, port), _ = decode_offset_msg_id(result.offset_msg_id)
                    self.acks.append(_Ack(started, time.monotonic(), body, f"{ip}:{port}"))
                else:
                    self.failures += 1

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


class _CppLoad:
    """The official C++ client sending sync messages in a child process (``cpp_driver.py produce --keep-going``);
    acknowledged bodies and their times come from its ``sent`` lines."""

    def __init__(self, python: Path, driver: Path, namesrv: str) -> None:
        self.acks: list[_Ack] = []
        self.failures = 0
        self._last = time.monotonic()
        args = ["produce", "--namesrv", namesrv, "--topic", TOPIC, "--count", "100000000", "--mode", "sync"]
        args += ["--group", "ChaosFailoverCpp", "--body-prefix", "cpp-", "--retry-times", "0"]
        self.driver = DriverProcess(python, driver, [*args, "--send-timeout-ms", "2000", "--keep-going"], self._event)

    def _event(self, now: float, event: dict[str, Any]) -> None:
        if event.get("event") == "sent" and event.get("status") == "OK":
            self.acks.append(_Ack(self._last, now, f"cpp-{event['i']}"))
        elif event.get("event") == "send_failed":
            self.failures += 1
        self._last = now

    def stop(self) -> None:
        self.driver.stop()


class _CppPush:
    """An official C++ push consumer (``cpp_driver.py consume``) on the campaign's topic for the whole run; every
    delivery (body, when this process read it) comes from its ``received`` lines. While a master is down its route
    lists the slave only, and RocketMQ's clients pull from it (``findBrokerAddressInSubscribe``)."""

    GROUP = "ChaosFailoverCppPush"

    def __init__(self, python: Path, driver: Path, namesrv: str) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[tuple[float, str]] = []
        args = ["consume", "--namesrv", namesrv, "--topic", TOPIC, "--group", self.GROUP, "--timeout", "1000000"]
        self.driver = DriverProcess(python, driver, args, self._event)
        self.proc = self.driver.proc

    def _event(self, now: float, event: dict[str, Any]) -> None:
        if event.get("event") == "received":
            with self.lock:
                self.deliveries.append((now, str(event.get("body"))))

    def bodies(self) -> set[str]:
        with self.lock:
            return {b for _, b in self.deliveries}

    def between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t, _ in self.deliveries if start <= t <= end)

    def stop(self) -> None:
        self.driver.stop()


def _probe_until_consumed(namesrv: str, push: _CppPush, timeout: float) -> None:
    """Send probes until the C++ push consumer gets one: it has then taken the topic's queues (a new group starts
    at their end), so every later message must reach it."""
    from txmq.client import Message
    from txmq.client.sync import Producer

    deadline = time.monotonic() + timeout
    with Producer("ChaosFailoverProbe", namesrv, instance_name="failover-probe") as producer:
        n = 0
        while not any(b.startswith("probe-") for b in push.bodies()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the C++ push consumer received nothing in {timeout:.0f} s")
            producer.send(Message(TOPIC, f"probe-{n}".encode()))
            n += 1
            time.sleep(0.5)


def _admin_call(namesrv: str, fn: Any) -> Any:
    from txmq.client.sync import Admin

    with Admin(namesrv, instance_name=f"failover-admin-{time.monotonic_ns()}") as admin:
        return fn(admin)


def _route(namesrv: str) -> dict[int, str]:
    return dict(_admin_call(namesrv, lambda a: a.cluster_info().broker_addrs.get(BROKER, {})))


def _both_in_sync(namesrv: str) -> bool:
    try:
        route = _route(namesrv)
        if len(route) != 2 or 0 not in route:
            return False
        info = _admin_call(namesrv, lambda a: a.broker_runtime_info(route[0]))
        return len([m for m in info.get("haSyncStateSet", "").split(",") if m]) == 2
    except Exception:
        return False


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (waited {timeout:.0f} s)")
        time.sleep(0.1)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_failovers(settings: FailoverSettings, work: Path, say: Any) -> PartResult:
    """The blocking campaign (threads and processes); :func:`run_failover_campaign` runs it off the event loop."""
    from txmq.chaos.common import read_topic
    from txmq.chaos.crash import find_cpp_driver

    result = PartResult("failover")
    result.zero("lost", "no_new_master", "split_brain_acks")
    started = time.monotonic()
    if etcd_binary() is None:
        result.error = "etcd is not installed (Debian: apt-get install etcd-server)"
        return result
    rng = random.Random(settings.seed)
    work.mkdir(parents=True, exist_ok=True)
    etcd = EtcdServer(work / "etcd").start()
    namesrv = NameServerProcess(work / "namesrv.out").start()
    port = namesrv.port
    namesrv_addr = namesrv.addr
    common = {
        "brokerName": BROKER,
        "brokerIP1": "127.0.0.1",
        "grpcListenPort": "0",
        "metricsPort": "0",
        "mappedFileSizeCommitLog": str(64 << 20),
        "brokerRole": "SYNC_MASTER",
        "enableControllerMode": "true",
        "controllerAddr": etcd.endpoint,
    }
    replicas = [ExtraBroker(work / f"replica{i}", {**common, "brokerId": str(i)}, namesrv_port=port) for i in (1, 2)]
    load = _Load(namesrv_addr, settings.senders)
    cpp_load: _CppLoad | None = None
    cpp_push: _CppPush | None = None
    while_down: list[int] = []  # per kill: deliveries to the C++ push consumer before the new master's first ack
    cpp = find_cpp_driver() if settings.cpp else None
    result.info["cpp_client"] = "yes" if cpp else "no (venv or driver not found)"
    if cpp is not None:
        result.zero("cpp_push_lost")
    times: list[float] = []
    cpp_times: list[float] = []
    freezes = 0
    try:
        starters = [threading.Thread(target=r.start, kwargs={"timeout": 60}) for r in replicas]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        _wait(lambda: _both_in_sync(namesrv_addr), 60, "the replicas never got in sync")
        _admin_call(
            namesrv_addr,
            lambda a: a.create_topic(TOPIC, cluster="DefaultCluster", read_queue_nums=8, write_queue_nums=8),
        )
        if cpp is not None:
            cpp_push = _CppPush(*cpp, namesrv_addr)
            _probe_until_consumed(namesrv_addr, cpp_push, 60)
        load.start()
        if cpp is not None:
            cpp_load = _CppLoad(*cpp, namesrv_addr)
        for n in range(settings.failovers):
            time.sleep(rng.uniform(settings.load_min, settings.load_max))
            if cpp_push is not None:
                # Hold the C++ push consumer back for a moment so that it has messages left to read when the master
                # dies: it must then get them from the slave.
                os.killpg(cpp_push.proc.pid, signal.SIGSTOP)
                time.sleep(settings.consumer_pause)
            master_addr = _route(namesrv_addr)[0]
            victim = next(r for r in replicas if r.broker_addr == master_addr)
            freeze = settings.freeze_every > 0 and n % settings.freeze_every == settings.freeze_every - 1
            killed_at = time.monotonic()
            if freeze:
                assert victim.proc is not None
                os.killpg(victim.proc.pid, signal.SIGSTOP)
            else:
                victim.kill()
            if cpp_push is not None:
                os.killpg(cpp_push.proc.pid, signal.SIGCONT)
            deadline = killed_at + settings.master_timeout
            first: float | None = None
            while time.monotonic() < deadline:
                after = [
                    a.acked for a in list(load.acks[-200:]) if a.started > killed_at and a.broker != victim.broker_addr
                ]
                if after:
                    first = min(after) - killed_at
                    break
                time.sleep(0.02)
            if first is None:
                result.fail(
                    "no_new_master",
                    f"failover {n}: no acknowledged send {settings.master_timeout:.0f} s after the kill",
                )
            else:
                times.append(first)
                if cpp_push is not None:
                    while_down.append(cpp_push.between(killed_at, killed_at + first))
            if freeze:
                assert victim.proc is not None
                time.sleep(max(0.0, killed_at + settings.lease_seconds + 1.0 - time.monotonic()))
                os.killpg(victim.proc.pid, signal.SIGCONT)
                freezes += 1
            else:
                victim.start(timeout=60)
            _wait(lambda: _both_in_sync(namesrv_addr), 90, f"failover {n}: the old master never got back in sync")
            if freeze and first is not None:
                new_first = killed_at + first
                late = [a for a in list(load.acks) if a.broker == victim.broker_addr and a.acked > new_first]
                for a in late:
                    result.fail(
                        "split_brain_acks",
                        f"failover {n}: {a.body} acknowledged by the frozen {victim.broker_addr} "
                        f"{a.acked - new_first:.2f} s after the new master's first acknowledgement",
                    )
            if cpp_load is not None:
                cpp_after = [a.acked for a in list(cpp_load.acks[-500:]) if a.started > killed_at]
                if cpp_after:
                    cpp_times.append(min(cpp_after) - killed_at)
            shown = f"{first:.2f} s" if first is not None else "never"
            say(f"failover {n + 1}/{settings.failovers}: first acknowledged send after {shown}")
        load.finish()
        if cpp_load is not None:
            time.sleep(1.0)
            cpp_load.stop()
        stored = asyncio.run(read_topic(namesrv_addr, TOPIC))
        bodies = [m.body.decode(errors="replace") for m in stored]
        present = set(bodies)
        acked = [a.body for a in load.acks] + ([a.body for a in cpp_load.acks] if cpp_load is not None else [])
        for body in acked:
            if body not in present:
                result.fail("lost", body)
        if cpp_push is not None:
            _drain_cpp_push(result, cpp_push, acked, while_down, settings.drain_patience)
        result.info["acknowledged"] = len(acked)
        result.info["acknowledged_by_cpp_client"] = len(cpp_load.acks) if cpp_load is not None else 0
        result.info["stored"] = len(bodies)
        result.info["stored_twice"] = len(bodies) - len(present)
        result.info["send_failures"] = load.failures + (cpp_load.failures if cpp_load is not None else 0)
        result.info["failovers"] = len(times)
        result.info["of_which_sigstop"] = freezes
        if times:
            result.info["to_first_ack_p50_s"] = round(statistics.median(times), 2)
            result.info["to_first_ack_max_s"] = round(max(times), 2)
            result.info["failovers_over_10s"] = sum(t >= 10 for t in times)
        result.info["cpp_failovers_timed"] = len(cpp_times)  # kills after which the C++ client got an ack
        if cpp_times:
            result.info["cpp_to_first_ack_p50_s"] = round(statistics.median(cpp_times), 2)
            result.info["cpp_to_first_ack_max_s"] = round(max(cpp_times), 2)
        dropped = [int(m) for r in replicas for m in _DROPPED.findall(r.log_text())]
        result.info["rejoins_that_cut_a_tail"] = len(dropped)
        result.info["bytes_cut"] = sum(dropped)
        result.info["to_first_ack_s"] = [round(t, 2) for t in times]
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        load.stop.set()
        if cpp_load is not None:
            cpp_load.stop()
        if cpp_push is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cpp_push.proc.pid, signal.SIGCONT)
            cpp_push.stop()
        for r in replicas:
            r.kill()
        namesrv.stop()
        etcd.stop()
        result.seconds = time.monotonic() - started
    return result


def _drain_cpp_push(
    result: PartResult, push: _CppPush, acked: list[str], while_down: list[int], patience: float
) -> None:
    """Let the C++ push consumer finish (until it has every acknowledged body, or makes no progress for
    ``patience`` s), then count what it never got (``cpp_push_lost``, must be 0) and what it got twice."""
    wanted = set(acked)
    seen = -1
    idle_since = time.monotonic()
    while True:
        got = push.bodies()
        if wanted <= got:
            break
        if len(got) != seen:
            seen, idle_since = len(got), time.monotonic()
        elif time.monotonic() - idle_since > patience:
            break
        time.sleep(0.2)
    got = push.bodies()
    for body in sorted(wanted - got):
        result.fail("cpp_push_lost", body)
    with push.lock:
        counts: dict[str, int] = {}
        for _, body in push.deliveries:
            counts[body] = counts.get(body, 0) + 1
    result.info["cpp_push_delivered"] = len(got & wanted)
    result.info["cpp_push_redelivered"] = sum(1 for b, n in counts.items() if n > 1 and b in wanted)
    result.info["cpp_push_deliveries_while_master_down"] = while_down


async def run_failover_campaign(settings: FailoverSettings, work: Path, say: Any) -> PartResult:
    return await asyncio.to_thread(run_failovers, settings, work, say)
