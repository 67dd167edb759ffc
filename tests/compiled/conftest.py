"""The compiled hot path against its interpreted source: the session's interpreted child (``hotpath_child``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hotpath_child import Interpreted, require_compiled

from txmq import _hotpath


@pytest.fixture(scope="session")
def interpreted() -> Iterator[Interpreted]:
    require_compiled()
    child = Interpreted()
    build = child.build()
    assert build["state"] == (False, "TXMQ_PURE_PYTHON is set"), build
    assert build["files"] and all(f == _hotpath.source_path(m) for m, f in build["files"].items()), build
    yield child
    child.close()
