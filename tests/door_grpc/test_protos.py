"""The committed stubs are what grpcio-tools makes of the vendored .proto files, and those are rocketmq-apis'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from txmq.door_grpc import gen_protos

# Lines that name the generating tool's version: they may differ between grpcio-tools releases.
_VERSION_LINES = re.compile(
    r"^(# Protobuf Python Version:.*|GRPC_GENERATED_VERSION = .*|\s*\d+,\s*$|\s*'',\s*$)", re.MULTILINE
)


def _normal(text: str) -> str:
    return _VERSION_LINES.sub("", text)


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    written = gen_protos.generate(tmp_path)
    committed = gen_protos.HERE / "pb"
    assert sorted(p.name for p in written) == sorted(p.name for p in committed.glob("*_pb2*.py"))
    for path in written:
        assert _normal(path.read_text()) == _normal((committed / path.name).read_text()), (
            f"{path.name} is stale: run python -m txmq.door_grpc.gen_protos"
        )


def test_protos_keep_their_license_header() -> None:
    for name in gen_protos.PROTO_FILES:
        text = (gen_protos.PROTO_ROOT / "apache" / "rocketmq" / "v2" / f"{name}.proto").read_text()
        assert "Licensed to the Apache Software Foundation (ASF)" in text.splitlines()[0]
        assert "package apache.rocketmq.v2;" in text


def test_the_broker_core_does_not_import_grpc() -> None:
    src = Path(gen_protos.__file__).resolve().parents[1]
    core = [src / "broker", src / "store", src / "txn", src / "acl", src / "protocol"]
    offenders = [
        str(p.relative_to(src))
        for folder in core
        for p in folder.rglob("*.py")
        if re.search(r"^\s*(import grpc|from grpc|from txmq\.door_grpc|import google\.protobuf)", p.read_text(), re.M)
    ]
    # app.py is the composition root: it builds the door (imported inside the function that does).
    assert offenders == ["broker/app.py"], offenders
