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
    "$VENV/bin/python" -m pip install -q -e ".[test]" >&2
    echo "$stamp" >"$VENV/.installed"
fi
export PATH="$VENV/bin:$PATH"

# Headless Chromium renders the audit's HTML report in the tests (Debian's package; once).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing chromium for the HTML report check (first run only)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
        || say "chromium could not be installed: the HTML check will be skipped"
fi

if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "${REDIS_URL:-}" ]; then
    say "starting local Kafka and Redis (deploy/local/up)"
    eval "$("$ROOT/deploy/local/up")"
fi
export KAFKA_BOOTSTRAP_SERVERS REDIS_URL
say "Kafka at $KAFKA_BOOTSTRAP_SERVERS, Redis at ${REDIS_URL##*@}"
