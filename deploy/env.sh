# deploy/env.sh — sourced by deploy/test and deploy/demo: a project virtualenv with Runlog
# installed, and Kafka + Redis (from the environment, or started by deploy/local/up).
#
# RUNLOG_ENV_PROFILE says what the caller needs: "test" (the default: Runlog with its test and docs
# extras, and the Debian tools some tests drive) or "demo" (Runlog alone: what `runlog demo` runs).
# A virtualenv prepared for the tests serves the demo as it is. On a first run the services start
# while the virtualenv is prepared, not after it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd "$ROOT"
VENV="${RUNLOG_VENV:-$ROOT/.runlog/venv}"
PY="${RUNLOG_PYTHON:-python3}"
PROFILE="${RUNLOG_ENV_PROFILE:-test}"

say() { printf '[runlog] %s\n' "$*" >&2; }

case "$PROFILE" in
test) extras="[test,docs]" ;; # docs: mkdocs build --strict in deploy/test
demo) extras="" ;;
*) say "RUNLOG_ENV_PROFILE=$PROFILE: expected test or demo"; exit 2 ;;
esac

# Services first, in the background, when none is configured: the first start fetches Kafka's
# jars, which takes as long as the virtualenv does.
services_log=""
services_pid=""
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "${REDIS_URL:-}" ]; then
    say "starting local Kafka and Redis (deploy/local/up)"
    services_log="$(mktemp)"
    "$ROOT/deploy/local/up" >"$services_log.out" 2>"$services_log" &
    services_pid=$!
fi

# Toxiproxy for the network fault tests (tests/faults/test_network.py): built from its Go module into
# .runlog/bin/ on the first run (about a minute, beside the virtualenv), found there afterwards.
toxiproxy_log=""
toxiproxy_pid=""
if [ "$PROFILE" = test ]; then
    toxiproxy_log="$(mktemp)"
    "$ROOT/deploy/local/toxiproxy" build >/dev/null 2>"$toxiproxy_log" &
    toxiproxy_pid=$!
fi

# The stamp names the pyproject.toml it was installed from and the extras; a test virtualenv
# (extras [test,docs]) is a superset of the demo's.
digest="$(sha256sum pyproject.toml | cut -d' ' -f1)"
installed="$(cat "$VENV/.installed" 2>/dev/null || true)"
ready=0
if [ -x "$VENV/bin/python" ]; then
    case "$installed" in
    "$digest $extras" | "$digest [test,docs]") ready=1 ;;
    esac
fi
if [ "$ready" = 0 ]; then
    # pip's own output (and the build backend's warnings) go to a log shown only when it fails; for
    # the demo the interpreter's bundled pip installs the project as it is (no upgrade to fetch
    # first), and modules are compiled when first imported, not all of them at install time
    pip_log="$ROOT/.runlog/pip.log"
    mkdir -p "$ROOT/.runlog"
    say "preparing the virtualenv in ${VENV#"$ROOT"/} for the $PROFILE (first run only; pip's log: ${pip_log#"$ROOT"/})"
    "$PY" -m venv "$VENV"
    : >"$pip_log"
    if [ "$PROFILE" = test ]; then # the test tooling's many wheels: a current pip resolves them
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >>"$pip_log" 2>&1 || true
    fi
    if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile -e ".$extras" \
        >>"$pip_log" 2>&1; then
        tail -n 30 "$pip_log" >&2
        say "pip could not install Runlog (full log: $pip_log)"
        exit 1
    fi
    echo "$digest $extras" >"$VENV/.installed"
fi
export PATH="$VENV/bin:$PATH"

# Compiled modules: written once, on first import, to one cache under .runlog (not beside the
# sources: the checkout stays as it was) and read by every later process. The tests and the demo
# start hundreds of Python processes; where PYTHONDONTWRITEBYTECODE is set, each compiled every
# module it imported again (about 0.9 s of CPU a process on 2 cores: half the CPU of the CLI tests).
# A PYTHONPYCACHEPREFIX of your own is kept.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$ROOT/.runlog/pycache}"
unset PYTHONDONTWRITEBYTECODE

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
[ "$PROFILE" != test ] || apt_tools chromium:chromium node:nodejs npm:npm openssl:openssl

if [ -n "$toxiproxy_pid" ]; then
    # a failed build stops nothing else: the network fault tests fail under CI=true with its reason
    wait "$toxiproxy_pid" || say "deploy/local/toxiproxy build failed: the network fault tests will fail"
    cat "$toxiproxy_log" >&2
    rm -f "$toxiproxy_log"
fi

# HashiCorp Vault for the transit key provider's tests (tests/integration/resume/test_transit_vault.py):
# built from its Go module into .runlog/bin/ (the first time in a Go build cache: tens of minutes on 2
# cores; afterwards about a minute of linking). Not waited for: it builds niced beside the whole run,
# and the tests that need it wait for it (deploy/local/vault's lock). Started once the toxiproxy build
# and the Debian tools are done: on a machine without Go the toxiproxy build installs it, and two
# apt-get runs at once would fail on dpkg's lock.
if [ "$PROFILE" = test ]; then
    mkdir -p "$ROOT/.runlog"
    "$ROOT/deploy/local/vault" build >/dev/null 2>"$ROOT/.runlog/vault-build.err" </dev/null &
fi

if [ -n "$services_pid" ]; then
    # the export lines are captured first: a failing deploy/local/up (a port taken, say) stops here
    # with its own message, instead of going on with the variables unset
    if ! wait "$services_pid"; then
        cat "$services_log" >&2
        say "deploy/local/up failed (see above): stopping"
        exit 1
    fi
    cat "$services_log" >&2
    rm -f "$services_log" "$services_log.out"
    # once more, now that the virtualenv is on PATH: its readiness check asks the broker for its
    # metadata (confluent-kafka), where the first start, before the virtualenv, could only see the port
    exports="$("$ROOT/deploy/local/up")" || { say "deploy/local/up failed (see above): stopping"; exit 1; }
    eval "$exports"
    if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "${REDIS_URL:-}" ]; then
        say "deploy/local/up printed no KAFKA_BOOTSTRAP_SERVERS / REDIS_URL: stopping"
        exit 1
    fi
fi
export KAFKA_BOOTSTRAP_SERVERS REDIS_URL
say "Kafka at $KAFKA_BOOTSTRAP_SERVERS, Redis at ${REDIS_URL##*@}"
