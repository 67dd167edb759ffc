#!/usr/bin/env bash
# Prepare a separate virtual environment holding the official RocketMQ 5.x Python client (PyPI
# `rocketmq-python-client`, gRPC). It gets its own venv because its top-level module `rocketmq` clashes with the
# C++ wheel `rocketmq`, and because it registers the RocketMQ protos in protobuf's default pool, as txmq's gRPC door
# does.
#
# Usage: .ci/setup-py5-client.sh [VENV_DIR]      (default: <repo>/.venv-py5, git-ignored)
# Environment: PYTHON (interpreter for the venv, default python3).
# Exit codes: 0 ready; 75 the package could not be downloaded (no network); anything else is a real failure.
# Idempotent and fast (one interpreter start) when the venv is already usable.
set -euo pipefail

CLIENT_VERSION=5.1.2
EX_TEMPFAIL=75

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo_root/.venv-py5}"
python="${PYTHON:-python3}"

log() { echo "setup-py5-client: $*" >&2; }

check_venv() {
    [ -x "$venv/bin/python" ] || return 1
    "$venv/bin/python" - "$CLIENT_VERSION" <<'PY' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("rocketmq-python-client") == sys.argv[1], version("rocketmq-python-client")
from rocketmq import ClientConfiguration, Producer, SimpleConsumer  # noqa: F401
PY
}

if check_venv; then
    exit 0
fi

"$python" -m venv --clear "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$venv/bin/pip" install -q "rocketmq-python-client==$CLIENT_VERSION"; then
    if ! "$venv/bin/pip" download -q --no-deps -d "$(mktemp -d)" "rocketmq-python-client==$CLIENT_VERSION" \
        >/dev/null 2>&1; then
        log "rocketmq-python-client==$CLIENT_VERSION could not be downloaded (no network?)"
        exit $EX_TEMPFAIL
    fi
    exit 1
fi
if ! check_venv; then
    log "rocketmq-python-client==$CLIENT_VERSION installed but does not import"
    exit 1
fi
log "ready: $venv"
