#!/usr/bin/env bash
# Prepare a separate virtual environment holding the PyPI package `rocketmq` (a ctypes wrapper around the official
# rocketmq-client-cpp, bundled as librocketmq.so). It gets its own venv because its top-level module `rocketmq`
# clashes with `rocketmq-python-client`.
#
# Usage: .ci/setup-cpp-client.sh [VENV_DIR]      (default: <repo>/.venv-cpp, git-ignored)
# Environment: PYTHON (interpreter for the venv, default python3).
# Exit codes: 0 ready; 75 the package could not be downloaded (no network); anything else is a real failure.
# Idempotent and fast (one interpreter start) when the venv is already usable. Concurrent runs are serialised.
set -euo pipefail

ROCKETMQ_VERSION=0.4.4
EX_TEMPFAIL=75

repo_root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo_root/.venv-cpp}"
python="${PYTHON:-python3}"

log() { echo "setup-cpp-client: $*" >&2; }

# Imports the library with HOME in a throwaway directory: librocketmq writes logs under $HOME/logs once a client
# starts (importing alone writes nothing, but keep the check side-effect free anyway).
check_venv() {
    [ -x "$venv/bin/python" ] || return 1
    local home
    home="$(mktemp -d)"
    HOME="$home" "$venv/bin/python" - "$ROCKETMQ_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("rocketmq") == sys.argv[1], version("rocketmq")
import rocketmq.client  # loads librocketmq.so through ctypes
EOF
    local rc=$?
    rm -rf "$home"
    return $rc
}

if check_venv; then
    exit 0
fi

case "$(uname -s)/$(uname -m)" in
    Linux/x86_64) ;;
    *)
        log "rocketmq==$ROCKETMQ_VERSION ships librocketmq.so only for Linux x86_64 (manylinux1) and macOS;" \
            "this is $(uname -s)/$(uname -m)"
        exit 1
        ;;
esac

mkdir -p "$(dirname "$venv")"
# The lock lives outside the repository so that it never shows up in `git status`.
exec 9>"${TMPDIR:-/tmp}/txmq-setup-cpp-client-$(printf %s "$venv" | md5sum | cut -c1-12).lock"
flock 9
# Another run may have finished the job while we waited for the lock.
if check_venv; then
    exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
    log "creating $venv with $python"
    "$python" -m venv --clear "$venv"
fi

pip_log="$(mktemp)"
trap 'rm -f "$pip_log"' EXIT
log "installing rocketmq==$ROCKETMQ_VERSION"
# Only the manylinux wheel is usable: the sdist would need the C++ library built from source.
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=rocketmq \
        "rocketmq==$ROCKETMQ_VERSION" >"$pip_log" 2>&1; then
    cat "$pip_log" >&2
    if grep -qiE 'NewConnectionError|Temporary failure in name resolution|Name or service not known|Network is unreachable|Connection refused|ConnectTimeout|ReadTimeout|Max retries exceeded|No matching distribution found for rocketmq' "$pip_log"; then
        log "could not download rocketmq==$ROCKETMQ_VERSION (no network?)"
        exit "$EX_TEMPFAIL"
    fi
    log "pip install failed"
    exit 1
fi

lib="$("$venv/bin/python" -c 'import importlib.util, os; s = importlib.util.find_spec("rocketmq"); print(os.path.join(os.path.dirname(s.origin), "librocketmq.so"))')"
[ -f "$lib" ] || { log "librocketmq.so not found at $lib"; exit 1; }

# On Debian 12 every dependency is present already (libstdc++6, libgcc-s1, libc6; libz is bundled in
# rocketmq/.libs; no libssl). Install only what ldd reports missing.
missing="$(ldd "$lib" | awk '/not found/ {print $1}' | sort -u)"
if [ -n "$missing" ]; then
    log "librocketmq.so is missing: $(echo "$missing" | tr '\n' ' ')"
    packages=""
    for so in $missing; do
        case "$so" in
            libstdc++.so.*) packages="$packages libstdc++6" ;;
            libgcc_s.so.*) packages="$packages libgcc-s1" ;;
            libz.so.*) packages="$packages zlib1g" ;;
            libssl.so.1.1 | libcrypto.so.1.1) packages="$packages libssl1.1" ;;
            libssl.so.3 | libcrypto.so.3) packages="$packages libssl3" ;;
            libdl.so.* | libpthread.so.* | librt.so.* | libm.so.* | libc.so.*) packages="$packages libc6" ;;
            *) log "no known Debian package provides $so"; exit 1 ;;
        esac
    done
    if ! command -v apt-get >/dev/null; then
        log "apt-get not available; install the packages providing the libraries above"
        exit 1
    fi
    sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { log "need root (or sudo) to install:$packages"; exit 1; }
        sudo="sudo"
    fi
    log "installing Debian packages:$packages"
    $sudo apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $packages
fi

if ! check_venv; then
    log "rocketmq is installed in $venv but 'import rocketmq.client' still fails:"
    HOME="$(mktemp -d)" "$venv/bin/python" -c 'import rocketmq.client' || true
    exit 1
fi
log "ready: $venv ($lib)"
