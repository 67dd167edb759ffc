"""Builds txmq's hot path with mypyc from the same typed Python the package ships (issue 16).

The modules in ``HOT_MODULES`` are compiled to C extension modules that sit beside their ``.py`` files; everything
else stays plain Python. The build never fails because of them: without mypyc or a C compiler, or with
``TXMQ_PURE_PYTHON=1`` set, it logs why and installs txmq interpreted. ``txmq/_compiled.txt`` records what was
compiled from which source (a hash per module); at run time ``txmq._hotpath`` loads the compiled modules only when
that record matches the sources, so an edited ``.py`` is never shadowed by an older build.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"

# Chosen by profile (bench/bench_tx_cpu.py): where the broker spends its CPU per message. Only modules that mypyc
# compiles with unchanged behaviour belong here (see docs/compiled.md).
HOT_MODULES = [
    "txmq/protocol/frame.py",
    "txmq/protocol/headers.py",
    "txmq/protocol/record/layout.py",
    "txmq/protocol/record/properties.py",
    "txmq/protocol/record/codec.py",
    "txmq/protocol/record/view.py",
    "txmq/protocol/record/walk.py",
    "txmq/protocol/record/txcolumns.py",
    "txmq/store/entry.py",
    "txmq/store/dispatch.py",
    "txmq/store/key_entries.py",
    "txmq/store/cq_plan.py",
    "txmq/store/writer.py",
    "txmq/broker/stored.py",
    "txmq/broker/refusal.py",
    "txmq/broker/send.py",
    "txmq/broker/rpc_latency.py",
    "txmq/protocol/topics.py",
    "txmq/broker/topics.py",
    "txmq/net/pending.py",
    "txmq/net/connection.py",
    "txmq/net/dispatcher.py",
    "txmq/protocol/op_marker.py",
    "txmq/txn/effects.py",
    "txmq/txn/records.py",
    "txmq/broker/end_transaction.py",
    "txmq/broker/txn/writer.py",
    "txmq/txn/model.py",
    "txmq/txn/machine.py",
    "txmq/txn/counters.py",
    "txmq/txn/history.py",
    "txmq/txn/table.py",
    "txmq/broker/txn/ops.py",
    "txmq/broker/txn/decide.py",
    # A SYNC_MASTER send's wait for its slave (issue 21: the master's CPU per replicated send).
    "txmq/ha/waits.py",
    "txmq/broker/ha/roles.py",
    # The client's per-message requests and answers (issue 16: the client is half of the peer harness's work).
    "txmq/client/wire.py",
]

MANIFEST = "txmq/_compiled.txt"


def _log(message: str) -> None:
    print(f"txmq build: {message}", file=sys.stderr, flush=True)


def _source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _module_name(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def _wanted() -> bool:
    return os.environ.get("TXMQ_PURE_PYTHON", "") in ("", "0")


def _remove_inplace_builds() -> None:
    """Deletes what an earlier in-place (editable) build left beside the sources, so that a module taken off the
    list, or a build that now compiles nothing, never leaves an old extension module shadowing its ``.py``."""
    (SRC / MANIFEST).unlink(missing_ok=True)
    for suffix in EXTENSION_SUFFIXES:
        for path in [*SRC.joinpath("txmq").rglob("*" + suffix), *SRC.glob("txmq__mypyc*" + suffix)]:
            path.unlink()


def _extensions() -> list:
    if {"editable_wheel", "develop", "--inplace", "-i"} & set(sys.argv):  # pip install -e ., setup.py build_ext -i
        _remove_inplace_builds()
    if not _wanted():
        _log("TXMQ_PURE_PYTHON is set: installing txmq interpreted, nothing compiled")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:
        _log(f"mypyc is not available ({exc}): installing txmq interpreted")
        return []
    cwd = os.getcwd()
    os.chdir(SRC)  # mypyc names modules after their paths
    try:
        return mypycify(
            [
                "--follow-imports=silent",  # type errors outside the compiled modules are not the build's business
                "--ignore-missing-imports",
                f"--cache-dir={HERE / 'build' / 'mypy_cache'}",
                *HOT_MODULES,
            ],
            group_name="txmq",
            target_dir=str(HERE / "build" / "mypyc"),
        )
    except BaseException as exc:  # mypyc exits through SystemExit on a type error
        _log(f"mypyc could not compile the hot path ({exc!r}): installing txmq interpreted")
        return []
    finally:
        os.chdir(cwd)


class BuildHotPath(build_ext):
    """build_ext that falls back to the interpreted package when the C compiler fails, and writes the manifest."""

    def run(self) -> None:
        if not self.extensions:
            return
        try:
            super().run()
        except BaseException as exc:  # CompileError, a missing gcc, missing Python headers
            _log(f"compiling the hot path failed ({exc!r}): installing txmq interpreted")
            self._remove_outputs()
            return
        self._write_manifest()
        _log(f"compiled {len(HOT_MODULES)} modules with mypyc: " + ", ".join(_module_name(m) for m in HOT_MODULES))

    def _out_dir(self) -> Path:
        return SRC if self.inplace else Path(self.build_lib)

    def _remove_outputs(self) -> None:
        _remove_inplace_builds()
        for ext in self.extensions:
            Path(self.build_lib, self.get_ext_filename(ext.name)).unlink(missing_ok=True)

    def _write_manifest(self) -> None:
        lines = [f"python {sys.implementation.cache_tag}"]
        lines += [f"{_module_name(m)} {_source_hash(SRC / m)}" for m in HOT_MODULES]
        text = "\n".join(lines) + "\n"
        out = self._out_dir() / MANIFEST
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)

    def get_outputs(self) -> list[str]:
        outputs = super().get_outputs()
        if self.extensions:
            outputs.append(str(Path(self.build_lib) / MANIFEST))
        return outputs


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildHotPath})
