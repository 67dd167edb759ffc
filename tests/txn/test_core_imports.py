"""The transaction core knows no door and does no IO: txmq.txn imports only txmq.protocol, txmq.errors and the
standard library (and none of its IO modules). One more is allowed: ``txmq._hotpath``, for the ``__reduce__`` that
mypyc-compiled dataclasses need; ``import txmq`` runs that module before any other, so importing it adds nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import txmq.txn

CORE = Path(txmq.txn.__file__).parent
ALLOWED_TXMQ = ("txmq.txn", "txmq.protocol", "txmq.errors", "txmq._hotpath")
FORBIDDEN_STDLIB = {"asyncio", "socket", "os", "pathlib", "io", "threading", "subprocess", "selectors"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_core_imports_only_protocol_and_errors() -> None:
    modules = sorted(CORE.glob("*.py"))
    assert len(modules) >= 4
    for module in modules:
        for name in imports_of(module):
            if name.split(".")[0] == "txmq":
                assert name.startswith(ALLOWED_TXMQ), f"{module.name} imports {name}"
            else:
                assert name.split(".")[0] not in FORBIDDEN_STDLIB, f"{module.name} imports {name} (IO)"
