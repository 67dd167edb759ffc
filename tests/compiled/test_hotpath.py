"""Which build runs: the compiled hot path by default, its ``.py`` sources with ``TXMQ_PURE_PYTHON=1`` or when a
source changed after the build, checked by where each module was loaded from."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from hotpath_child import SRC, require_compiled

from txmq import _hotpath

REPORT = """
import importlib, json, sys
from txmq import _hotpath
files = {m: importlib.import_module(m).__file__ for m in _hotpath.STATE.modules}
from txmq.protocol.frame import RemotingCommand, encode_frame
from txmq.protocol.record import MessageRecord, encode_record
json.dump({"compiled": _hotpath.STATE.compiled, "reason": _hotpath.STATE.reason, "files": files,
           "frame": encode_frame(RemotingCommand(code=10, opaque=3)).hex(),
           "record": encode_record(MessageRecord("T", b"x")).hex()}, sys.stdout)
"""


def _child(path: Path, pure: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "TXMQ_PURE_PYTHON"}
    env["PYTHONPATH"] = str(path)
    if pure is not None:
        env["TXMQ_PURE_PYTHON"] = pure
    out = subprocess.run([sys.executable, "-c", REPORT], env=env, capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _is_extension(path: object) -> bool:
    return str(path).endswith(tuple(EXTENSION_SUFFIXES))


def test_this_process_runs_the_build_it_was_asked_for() -> None:
    if os.environ.get("TXMQ_REQUIRE_COMPILED") == "1":
        assert _hotpath.STATE.modules, "the install compiled nothing"
    if os.environ.get("TXMQ_PURE_PYTHON", "") not in ("", "0"):
        assert not _hotpath.STATE.compiled
        assert "TXMQ_PURE_PYTHON" in _hotpath.STATE.reason or not _hotpath.STATE.modules
        for name in _hotpath.STATE.modules:
            module = importlib.import_module(name)
            assert module.__file__ == _hotpath.source_path(name) and not _hotpath.is_compiled(module), name
        return
    require_compiled()
    for name in _hotpath.STATE.modules:
        assert _hotpath.is_compiled(importlib.import_module(name)), name


def test_txmq_pure_python_loads_every_hot_module_from_its_source() -> None:
    require_compiled()
    compiled, pure, zero = _child(SRC, None), _child(SRC, "1"), _child(SRC, "0")
    assert compiled["compiled"] and zero["compiled"] and not pure["compiled"]
    assert pure["reason"] == "TXMQ_PURE_PYTHON is set"
    modules = set(_hotpath.STATE.modules)
    assert set(compiled["files"]) == set(pure["files"]) == modules  # type: ignore[arg-type]
    assert all(_is_extension(f) for f in compiled["files"].values())  # type: ignore[attr-defined]
    assert pure["files"] == {m: _hotpath.source_path(m) for m in modules}
    assert compiled["frame"] == pure["frame"] and compiled["record"] == pure["record"]


def test_a_source_edited_after_the_build_runs_interpreted(tmp_path: Path) -> None:
    require_compiled()
    shutil.copytree(SRC / "txmq", tmp_path / "txmq", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in SRC.glob("txmq__mypyc*"):
        shutil.copy2(shared, tmp_path)
    assert _child(tmp_path, None)["compiled"]  # the copy as built

    edited = tmp_path / "txmq" / "protocol" / "frame.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    report = _child(tmp_path, None)
    assert not report["compiled"]
    assert "frame.py changed since it was compiled" in str(report["reason"])
    files = report["files"]
    assert files and not any(_is_extension(f) for f in files.values())  # type: ignore[attr-defined]
    assert report["frame"] == _child(SRC, None)["frame"]
