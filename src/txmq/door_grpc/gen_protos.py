"""Regenerate ``txmq/door_grpc/pb/*`` from the vendored ``.proto`` files (``python -m txmq.door_grpc.gen_protos``).

The generated modules import each other as ``apache.rocketmq.v2``; they are rewritten to import from
``txmq.door_grpc.pb`` so that no top-level ``apache`` package is needed. Needs ``grpcio-tools`` (the dev extra).
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE / "proto"
PROTO_FILES = ("definition", "service", "admin")
PACKAGE = "txmq.door_grpc.pb"
_IMPORT = re.compile(r"^from apache\.rocketmq\.v2 import (\w+) as", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Write the stubs into ``out_dir`` and return their paths."""
    import grpc_tools
    from grpc_tools import protoc

    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(f"apache/rocketmq/v2/{name}.proto" for name in PROTO_FILES),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed on the vendored RocketMQ protos")
        written = []
        for source in sorted((Path(tmp) / "apache" / "rocketmq" / "v2").glob("*.py")):
            text = _IMPORT.sub(lambda m: f"from {PACKAGE} import {m.group(1)} as", source.read_text())
            target = out_dir / source.name
            target.write_text(text)
            written.append(target)
    return written


def main() -> int:
    out = HERE / "pb"
    out.mkdir(exist_ok=True)
    for path in generate(out):
        print(path.relative_to(HERE.parent.parent.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
