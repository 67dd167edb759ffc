"""The C++ client driver works without a broker: the venv, the library, and bounded failures.

Nothing here needs txmq: the name server is a closed port or a socket that never answers.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from .cpp_client import (
    EXIT_CLIENT_ERROR,
    EXIT_DEADLINE,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EXIT_USAGE,
    VENV,
    CppClientError,
    cpp_processes,
    run_cpp,
)


@pytest.fixture
def cpp():
    with cpp_processes() as start:
        yield start


@pytest.fixture
def closed_port() -> str:
    """A loopback address nothing listens on (the kernel answers connects with RST)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
def silent_namesrv() -> Iterator[str]:
    """A name server that accepts connections and never answers: librocketmq waits on it for a long time."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:  # timeout, or closed below
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        server.close()
        for conn in accepted:
            conn.close()


def by_name(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("event") == name]


def test_library_loads_from_its_own_venv() -> None:
    (info,) = run_cpp(["info"], timeout=60)

    assert info["event"] == "info"
    assert info["rocketmq_version"] == "0.4.4"
    assert info["library"].endswith("/rocketmq/librocketmq.so")
    assert info["library_loaded"] is True
    assert info["executable"].startswith(str(VENV))


@pytest.mark.parametrize("mode", ["sync", "async", "oneway", "orderly", "batch"])
def test_produce_to_closed_port_fails_with_json_error(closed_port: str, mode: str) -> None:
    events = run_cpp(
        ["produce", "--namesrv", closed_port, "--topic", "TopicTest", "--count", "2", "--mode", mode],
        timeout=30,
        expect_returncode=EXIT_CLIENT_ERROR,
    )

    assert events[0]["event"] == "started"
    failures = by_name(events, "send_failed")
    assert failures, events
    assert not by_name(events, "sent")
    # oneway and batch failures come with an empty message from librocketmq; the others name the cause.
    if mode in ("sync", "async", "orderly"):
        assert "No route info" in failures[0]["message"]
    (summary,) = by_name(events, "summary")
    assert summary["sent"] == 0 and summary["failed"] == len(failures)
    assert events[-1]["event"] == "error" and events[-1]["error"] == "SendFailed"


def test_unresponsive_name_server_is_cut_off_by_the_watchdog(silent_namesrv: str) -> None:
    # Without the watchdog, librocketmq retries the route query (5 s each) for up to a minute.
    events = run_cpp(
        ["produce", "--namesrv", silent_namesrv, "--topic", "TopicTest", "--deadline", "2"],
        timeout=30,
        expect_returncode=EXIT_DEADLINE,
    )

    error = events[-1]
    assert error["event"] == "error" and error["error"] == "DeadlineExceeded"
    assert error["phase"] == "send"
    assert error["sent"] == 0


def test_run_cpp_raises_with_the_driver_output_on_unexpected_exit(closed_port: str) -> None:
    with pytest.raises(CppClientError) as caught:
        run_cpp(["produce", "--namesrv", closed_port, "--topic", "TopicTest"], timeout=30)

    assert caught.value.returncode == EXIT_CLIENT_ERROR
    assert caught.value.events[-1]["error"] == "SendFailed"
    assert "No route info" in str(caught.value)


def test_usage_errors_are_json(closed_port: str) -> None:
    (error,) = run_cpp(["produce", "--topic", "T"], timeout=30, expect_returncode=EXIT_USAGE)

    assert error["event"] == "error" and error["error"] == "UsageError"
    assert "--namesrv" in error["message"]


@pytest.mark.parametrize("extra", [[], ["--orderly", "--mode", "broadcasting"]])
def test_consumer_without_broker_times_out_with_a_summary(closed_port: str, extra: list[str]) -> None:
    args = ["consume", "--namesrv", closed_port, "--topic", "TopicTest", "--group", "cg_smoke", *extra]

    with_expect = run_cpp([*args, "--expect", "1", "--timeout", "1"], timeout=30, expect_returncode=EXIT_INCOMPLETE)
    without_expect = run_cpp([*args, "--timeout", "1"], timeout=30)

    (summary,) = by_name(with_expect, "summary")
    assert summary["received"] == 0 and summary["complete"] is False and summary["stopped"] == "timeout"
    assert with_expect[-1]["error"] == "Incomplete"
    assert without_expect[-1]["event"] == "summary" and without_expect[-1]["complete"] is True


def test_pull_consumer_without_broker_sees_no_queues(closed_port: str) -> None:
    events = run_cpp(
        ["pull", "--namesrv", closed_port, "--topic", "TopicTest", "--group", "cg_pull_smoke", "--timeout", "1"],
        timeout=30,
    )

    assert by_name(events, "queues")[0]["queues"] == []
    assert events[-1]["event"] == "summary" and events[-1]["received"] == 0


def test_background_consumer_stops_on_request(cpp, closed_port: str) -> None:
    consumer = cpp(
        ["consume", "--namesrv", closed_port, "--topic", "TopicTest", "--group", "cg_bg", "--timeout", "120"]
    )
    (started,) = consumer.wait_for("started", timeout=30)
    assert started["role"] == "push_consumer"

    events = consumer.stop(timeout=20)

    assert consumer.returncode == EXIT_OK
    assert events[-1]["event"] == "summary" and events[-1]["stopped"] == "signal"


def test_background_driver_that_exits_early_fails_wait_for(cpp) -> None:
    consumer = cpp(["consume", "--topic", "TopicTest", "--group", "cg_bad"])  # no --namesrv

    with pytest.raises(CppClientError, match="the driver exited"):
        consumer.wait_for("started", timeout=30)
    assert consumer.wait(10) == EXIT_USAGE
