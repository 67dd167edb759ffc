"""The Python workers' daemon of the local sessions that :func:`txmq.spark.get_spark` starts
(``spark.python.daemon.module``): pyspark's own daemon, imported from the installed pyspark instead of
``$SPARK_HOME/python/lib/pyspark.zip``.

Spark puts ``pyspark.zip`` and ``py4j-*-src.zip`` first on its workers' ``PYTHONPATH``. Python keeps no compiled
bytecode for modules imported from a zip, so each daemon compiles pyspark's and py4j's sources again before its first
task: about a second of CPU on this project's machines, on the path of every session's first Python task (and of its
data-source lookups). With pip's pyspark, ``$SPARK_HOME`` is the installed package itself, so the zips hold the same
code as the installed modules, whose bytecode is cached. This module moves each zip behind the installed packages when
the versions are the same (the zip's ``pyspark/version.py`` or py4j's file name against the installed distribution),
then runs pyspark's daemon unchanged; otherwise the path stays as Spark set it.

Nothing else is imported before pyspark's daemon forks its workers (it must not start a thread).
"""

from __future__ import annotations

import os
import re
import sys
import zipfile

_VERSION = re.compile(r"""__version__[^=]*=\s*["']([^"']+)["']""")


def zip_version(entry: str) -> tuple[str, str] | None:
    """(distribution, version) of a ``sys.path`` entry that is Spark's pyspark or py4j zip, else None."""
    name = os.path.basename(entry)
    if name.startswith("py4j-") and name.endswith("-src.zip"):
        return "py4j", name[len("py4j-") : -len("-src.zip")]
    if name != "pyspark.zip":
        return None
    try:
        with zipfile.ZipFile(entry) as z:
            found = _VERSION.search(z.read("pyspark/version.py").decode("utf-8", "replace"))
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    return ("pyspark", found.group(1)) if found else None


def installed_first(path: list[str]) -> list[str]:
    """``path`` with each of Spark's zips whose distribution is installed at the same version moved to the end."""
    from importlib import metadata

    late = []
    for entry in path:
        found = zip_version(entry)
        if found is None:
            continue
        dist, version = found
        try:
            if metadata.version(dist) == version:
                late.append(entry)
        except metadata.PackageNotFoundError:
            continue
    return [p for p in path if p not in late] + late


if __name__ == "__main__":
    sys.path[:] = installed_first(sys.path)
    from pyspark.daemon import manager

    manager()
