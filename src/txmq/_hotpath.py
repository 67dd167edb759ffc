"""Which build of the hot path this process runs: the modules compiled by mypyc at install time, or their ``.py``.

``setup.py`` compiles the modules it lists into extension modules beside their sources and records each source's
hash in ``_compiled.txt``. Python's import system prefers an extension module to a ``.py`` of the same name, so this
module, run from ``txmq/__init__.py`` before any of them is imported, decides once per process:

- compiled, when the record is there, every extension module is, and every source still has the hash it was
  compiled from;
- interpreted otherwise, or when ``TXMQ_PURE_PYTHON`` is set (to anything but ``0``): a finder placed first on
  ``sys.meta_path`` then loads each of those modules from its ``.py``, all of them together, since compiled modules
  call each other directly and must not be mixed with interpreted copies.

This module is never compiled itself, and imports little: every ``import txmq`` runs it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from types import ModuleType

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(PACKAGE_DIR, "_compiled.txt")
ENV = "TXMQ_PURE_PYTHON"


class HotPath:
    """What this process runs: ``compiled``, the modules the build compiled, and why not compiled (``reason``)."""

    __slots__ = ("compiled", "modules", "reason")

    def __init__(self, compiled: bool, modules: tuple[str, ...], reason: str) -> None:
        self.compiled = compiled
        self.modules = modules  # whether or not they run compiled here
        self.reason = reason  # "" when compiled

    def describe(self) -> str:
        if self.compiled:
            return f"compiled with mypyc ({len(self.modules)} modules)"
        return f"interpreted: {self.reason}"

    def __repr__(self) -> str:
        return f"HotPath({self.describe()!r})"


def source_path(module: str) -> str:
    """The ``.py`` file of a txmq module (``txmq.protocol.frame``)."""
    return os.path.join(PACKAGE_DIR, *module.split(".")[1:]) + ".py"


def _has_extension(module: str) -> bool:
    stem = source_path(module)[:-3]
    return any(os.path.exists(stem + suffix) for suffix in EXTENSION_SUFFIXES)


def _digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_manifest(path: str = MANIFEST) -> tuple[str, dict[str, str]]:
    """``(python cache tag, {module: sha256 of its source})`` as the build recorded them; empty when none."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError:  # none, or txmq imported from a zip (Spark's --py-files), which holds no compiled module
        return "", {}
    python = lines[0].removeprefix("python ").strip()
    modules = {}
    for line in lines[1:]:
        if line.strip():
            name, _, digest = line.partition(" ")
            modules[name] = digest.strip()
    return python, modules


class SourceFinder:
    """Finds the listed txmq modules as their ``.py`` files, ahead of the extension modules beside them."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = frozenset(modules)

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None) -> object:
        if fullname not in self.modules:
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def forced() -> bool:
    """Whether ``TXMQ_PURE_PYTHON`` asks for the interpreted sources."""
    return os.environ.get(ENV, "") not in ("", "0")


def _select() -> HotPath:
    python, recorded = read_manifest()
    modules = tuple(sorted(recorded))
    if not modules:
        return HotPath(False, (), "this install compiled nothing (built without mypyc or a C compiler?)")
    if forced():
        reason = f"{ENV} is set"
    elif python != sys.implementation.cache_tag:
        reason = f"compiled for {python}, this is {sys.implementation.cache_tag}"
    elif missing := [m for m in modules if not _has_extension(m)]:
        reason = f"compiled module missing: {missing[0]}"
    elif stale := [m for m in modules if not os.path.exists(source_path(m)) or _digest(source_path(m)) != recorded[m]]:
        reason = f"{source_path(stale[0])} changed since it was compiled (pip install -e . compiles it again)"
    else:
        return HotPath(True, modules, "")
    if not any(isinstance(f, SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(modules))  # type: ignore[arg-type]
    return HotPath(False, modules, reason)


STATE = _select()


def is_compiled(module: ModuleType) -> bool:
    """Whether ``module`` was loaded from an extension module rather than from its ``.py``."""
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(EXTENSION_SUFFIXES))


def reduce_by_fields(obj: object) -> tuple[type, tuple[object, ...]]:
    """``__reduce__`` for a dataclass whose ``__init__`` is written out (``@dataclass(init=False)``): rebuilt by
    calling the class with its fields in order. Compiled by mypyc, such a class's ``__new__`` runs that ``__init__``,
    so the default reduction (``cls.__new__(cls)``, then the state) fails for lack of the required arguments, and
    ``copy.copy``, ``copy.deepcopy`` and ``pickle`` with it."""
    import dataclasses

    return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj))  # type: ignore[arg-type]
