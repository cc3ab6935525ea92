# deploy/env.sh — sourced by deploy/test and deploy/demo: a project virtualenv with Runlog
# installed, and Kafka + Redis (from the environment, or started by deploy/local/up).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
VENV="${RUNLOG_VENV:-$ROOT/.runlog/venv}"
PY="${RUNLOG_PYTHON:-python3}"

say() { printf '[runlog] %s\n' "$*" >&2; }

stamp="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$stamp" ]; then
    say "preparing the virtualenv in ${VENV#"$ROOT"/} (first run only)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e ".[test,docs]" >&2  # docs: mkdocs build --strict in deploy/test
    echo "$stamp" >"$VENV/.installed"
fi
export PATH="$VENV/bin:$PATH"

# Tools the tests use that no Python package brings (Debian's packages; once): headless Chromium
# renders the audit's HTML report and drives the console, node and npm run the contract checks of
# other services' libraries, openssl hashes a CA directory. Without one, its tests skip on a
# developer's machine and fail under CI=true (docs/testing.md).
apt_tools() { # command:package ...
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
        say "missing ${missing[*]} (not root or no apt-get: install them yourself)"
        return 0
    fi
    say "installing ${missing[*]} for the tests (first run only)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; } \
        || say "could not install ${missing[*]}: their tests skip, or fail under CI=true"
}
apt_tools chromium:chromium node:nodejs npm:npm openssl:openssl

if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "${REDIS_URL:-}" ]; then
    say "starting local Kafka and Redis (deploy/local/up)"
    # captured first: a failing deploy/local/up (a port taken, say) stops here with its own message,
    # instead of going on with the variables unset
    exports="$("$ROOT/deploy/local/up")" || { say "deploy/local/up failed (see above): stopping"; exit 1; }
    eval "$exports"
    if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "${REDIS_URL:-}" ]; then
        say "deploy/local/up printed no KAFKA_BOOTSTRAP_SERVERS / REDIS_URL: stopping"
        exit 1
    fi
fi
export KAFKA_BOOTSTRAP_SERVERS REDIS_URL
say "Kafka at $KAFKA_BOOTSTRAP_SERVERS, Redis at ${REDIS_URL##*@}"
