"""The dataclasses of the hot path whose ``__init__`` is written out (``@dataclass(init=False)``, so that mypyc
compiles it instead of running the generated one interpreted) take exactly their fields: the same names in the same
order, the same defaults, a fresh value from each ``default_factory``, and every argument lands in its own field.
Required header fields (``wire_*(required=True)``) are required arguments.

The check reads signatures, which only the ``.py`` sources have: a compiled test process runs it in a child with
``TXMQ_PURE_PYTHON=1``."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import txmq
from txmq import _hotpath

SETUP = Path(__file__).resolve().parents[2] / "setup.py"


def hot_modules() -> list[str]:
    """``HOT_MODULES`` of setup.py, as module names."""
    tree = ast.parse(SETUP.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HOT_MODULES" for t in node.targets):
            paths = ast.literal_eval(node.value)
            return [p.removesuffix(".py").replace("/", ".") for p in paths]
    raise AssertionError("setup.py has no HOT_MODULES list")


def written_out() -> list[type]:
    """Every dataclass defined in a hot module that writes its own ``__init__``."""
    found = []
    for name in hot_modules():
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and obj.__module__ == name
                and dataclasses.is_dataclass(obj)
                and not obj.__dataclass_params__.init  # type: ignore[attr-defined]
            ):
                found.append(obj)
    return found


def _required(f: dataclasses.Field[object]) -> bool:
    if f.metadata.get("required"):
        return True
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def check(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields], cls
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params), cls
    for f, p in zip(fields, params, strict=True):
        if _required(f):
            assert p.default is inspect.Parameter.empty, (cls, f.name)
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, (cls, f.name)
        else:
            assert p.default == f.default and type(p.default) is type(f.default), (cls, f.name)
    # Every argument lands in its own field, given by position or by name (no types checked interpreted).
    values = {f.name: object() for f in fields}
    for obj in (cls(*values.values()), cls(**values)):
        assert {f.name: getattr(obj, f.name) for f in fields} == values, cls
    # Left out, each optional field takes its default, and a default_factory's value is new each time.
    required = {f.name: values[f.name] for f in fields if _required(f)}
    first, second = cls(**required), cls(**required)
    for f in fields:
        if f.name in required:
            continue
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(first, f.name) == f.default_factory(), (cls, f.name)
            assert getattr(first, f.name) is not getattr(second, f.name), (cls, f.name)
        else:
            assert getattr(first, f.name) == f.default, (cls, f.name)


CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import test_constructors as t
classes = t.written_out()
for cls in classes:
    t.check(cls)
print(" ".join(sorted(c.__qualname__ for c in classes)))
"""

EXPECTED = {
    "DecisionRequest",
    "DispatchRequest",
    "Light",
    "MessageRecord",
    "PullMessageRequestHeader",
    "Queued",
    "RemotingCommand",
    "SendMessageRequestHeader",
    "StoreDecision",
}


def test_every_written_out_init_takes_exactly_its_fields() -> None:
    if not _hotpath.STATE.compiled:
        classes = written_out()
        for cls in classes:
            check(cls)
        names = {c.__qualname__ for c in classes}
    else:  # the compiled classes have no signatures: check their sources
        src = str(Path(txmq.__file__).resolve().parent.parent)
        env = {**os.environ, "TXMQ_PURE_PYTHON": "1", "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(Path(__file__).parent)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        names = set(out.stdout.split())
    assert names >= EXPECTED


def test_the_check_catches_a_field_out_of_step() -> None:
    @dataclasses.dataclass(init=False)
    class Swapped:
        a: int
        b: int = 0

        def __init__(self, a: int, b: int = 0) -> None:
            self.a = b
            self.b = a

    @dataclasses.dataclass(init=False)
    class OtherDefault:
        a: int = 1

        def __init__(self, a: int = 2) -> None:
            self.a = a

    for cls in (Swapped, OtherDefault):
        try:
            check(cls)
        except AssertionError:
            continue
        raise AssertionError(f"{cls.__name__} passed the check")


def examples() -> list[object]:
    """One instance of each written-out class, every field set away from its default."""
    from txmq.broker.txn.writer import Queued
    from txmq.protocol.frame import RemotingCommand
    from txmq.protocol.headers import PullMessageRequestHeader, SendMessageRequestHeader
    from txmq.protocol.record.codec import MessageRecord
    from txmq.store.dispatch import DispatchRequest
    from txmq.txn.effects import DecisionRequest, StoreDecision
    from txmq.txn.history import Light
    from txmq.txn.model import By, Decision

    record = MessageRecord(
        "T", b"body", 3, 4, 5, 6, 7, 8, ("10.0.0.1", 9), 10, ("10.0.0.2", 11), 12, 13, {"KEYS": "k"}, 14, 15
    )
    decided = StoreDecision(100, 2, "U", Decision.COMMIT, By.CHECK, record, None, "M", "G")
    return [
        RemotingCommand(310, 7, 1, "r", {"a": "1"}, b"x", "CPP", 399, 1),
        SendMessageRequestHeader("G", "T", "TBW102", 8, 1, 4, 99, 2, "KEYS\x01k\x02", 1, True, 16, False),
        PullMessageRequestHeader("G", "T", 1, 40, 32, 6, 39, 15000, "*", 2, "TAG"),
        record,
        DispatchRequest("T", 1, 2, 3, 4, 5, 6, 7, "k", "U"),
        DecisionRequest(100, Decision.ROLLBACK, By.OPERATOR, "G", 2, "M", "tx", None, 3),
        decided,
        Queued(decided, record, None, None, None),
        Light("COMMIT", "producer", 1234, 5678),
    ]


def state(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def test_every_written_out_class_copies_and_pickles() -> None:
    """Compiled, a written-out ``__init__`` runs from ``__new__``: without ``__reduce__`` copy and pickle fail (the
    fuzz campaign deep-copies every RemotingCommand it records)."""
    import copy
    import pickle

    objs = examples()
    assert {type(o) for o in objs} == set(written_out())
    for obj in objs:
        deep = copy.deepcopy(obj)
        for other in (copy.copy(obj), deep, pickle.loads(pickle.dumps(obj))):
            assert type(other) is type(obj)
            assert state(other) == state(obj), type(obj)
        mutable = [v for v in state(obj).values() if isinstance(v, dict)]
        assert all(
            v is not w for v, w in zip(mutable, [v for v in state(deep).values() if isinstance(v, dict)], strict=True)
        )
