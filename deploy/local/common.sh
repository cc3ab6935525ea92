# Shared by deploy/local/{up,down,kafka-restart}; sourced, not run.
# Expects ROOT (the repo root) to be set.
# shellcheck shell=bash disable=SC2034,SC2016 # vars are used by the sourcing scripts

RUNLOG_DIR="${RUNLOG_LOCAL_DIR:-$ROOT/.runlog}"
mkdir -p "$RUNLOG_DIR"
RUNLOG_DIR="$(cd "$RUNLOG_DIR" && pwd -P)"

KAFKA_PORT="${RUNLOG_LOCAL_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="$((KAFKA_PORT + 1))"
REDIS_PORT="${RUNLOG_LOCAL_REDIS_PORT:-16379}"
KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
REDIS_LOCAL_URL="redis://127.0.0.1:$REDIS_PORT/0"

PID_DIR="$RUNLOG_DIR/local"
KAFKA_PID="$PID_DIR/kafka.pid"
REDIS_PID="$PID_DIR/redis.pid"

KAFKA_DIR="$RUNLOG_DIR/kafka"
KAFKA_LIBS="$KAFKA_DIR/libs"
KAFKA_DATA="$KAFKA_DIR/data"
KAFKA_LOGS="$KAFKA_DIR/logs"
KAFKA_CONF="$KAFKA_DIR/server.properties"
LOG4J_CONF="$ROOT/deploy/kafka/log4j2.properties"

REDIS_DIR="$RUNLOG_DIR/redis"
REDIS_CONF="$REDIS_DIR/redis.conf"

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Serialise up/down/kafka-restart (parallel test sessions may call up at once).
# fd 9 holds the lock; children must be started with 9>&-.
take_lock() {
    mkdir -p "$PID_DIR"
    exec 9>"$PID_DIR/.lock"
    if command -v flock >/dev/null; then
        flock -w "${RUNLOG_LOCAL_TIMEOUT:-120}" 9 || die "timed out waiting for $PID_DIR/.lock"
    fi
}

apt_install() {
    local aptlog="$PID_DIR/apt.log"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq --no-install-recommends "$@" >"$aptlog" 2>&1; then
        apt-get update -qq >>"$aptlog" 2>&1 || true
        apt-get install -y -qq --no-install-recommends "$@" >>"$aptlog" 2>&1 || {
            tail -n 20 "$aptlog" | sed 's/^/  apt: /' >&2
            die "apt-get install $* failed (log: $aptlog)"
        }
    fi
}

port_open() { # port on 127.0.0.1 accepts a TCP connection
    timeout 2 bash -c 'exec 5<>"/dev/tcp/127.0.0.1/$0"' "$1" 2>/dev/null
}

pid_of() { [ -s "$1" ] && tr -dc '0-9' <"$1"; }

pid_alive() { # running, not a zombie
    kill -0 "$1" 2>/dev/null && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null
}

pid_matches() { # $1 = pidfile, $2 = substring expected in /proc/PID/cmdline
    local pid
    pid="$(pid_of "$1")" || return 1
    [ -n "$pid" ] && pid_alive "$pid" &&
        tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$2"
}

kafka_running() { pid_matches "$KAFKA_PID" "$KAFKA_CONF"; }
redis_running() { pid_matches "$REDIS_PID" "redis-server" && port_open "$REDIS_PORT"; }
redis_pid_alive() { pid_matches "$REDIS_PID" "redis-server"; }

redis_ping() {
    timeout 2 bash -c '
        exec 5<>"/dev/tcp/127.0.0.1/$0" || exit 1
        printf "PING\r\n" >&5
        IFS= read -r -t 2 line <&5 && [[ $line == +PONG* ]]' "$REDIS_PORT" 2>/dev/null
}

# stop_pidfile PIDFILE MATCH NAME [SIG] [PORT...]: SIGTERM (or SIG), wait up to
# RUNLOG_LOCAL_STOP_TIMEOUT (30 s), then SIGKILL; then wait until the PORTs are
# closed (a killed JVM's main thread turns zombie while other threads still
# hold its sockets). Only a process whose cmdline contains MATCH is touched.
stop_pidfile() {
    local pidfile="$1" match="$2" name="$3" sig="${4:-TERM}" pid waited=0 port
    shift 4 || shift $#
    local limit="${RUNLOG_LOCAL_STOP_TIMEOUT:-30}"
    if ! pid_matches "$pidfile" "$match"; then
        [ -e "$pidfile" ] && log "$name: stale pidfile removed"
        rm -f "$pidfile"
        return 0
    fi
    pid="$(pid_of "$pidfile")"
    log "$name: sending SIG$sig to pid $pid"
    kill -"$sig" "$pid" 2>/dev/null || true
    while pid_alive "$pid"; do
        if [ "$waited" -ge $((limit * 10)) ]; then
            log "$name: still running after ${limit}s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    for port in "$@"; do
        waited=0
        while port_open "$port" && [ "$waited" -lt 100 ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
    done
    rm -f "$pidfile"
    log "$name: stopped"
}

# ------------------------------------------- Java and the Kafka jar cache --
# Shared by up and cluster: JAVA is set by ensure_java; fetch_libs fills KAFKA_LIBS.

ensure_java() {
    local cand v
    for cand in "${RUNLOG_JAVA:-}" "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
        if [ -z "$cand" ] || [ ! -x "$cand" ]; then continue; fi
        v="$("$cand" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)"
        if [ -n "$v" ] && [ "$v" -ge 17 ]; then
            JAVA="$cand"
            return 0
        fi
    done
    log "no Java >= 17 found; installing default-jre-headless"
    apt_install default-jre-headless
    JAVA="$(command -v java)"
}

# A jar cache is tied to its pom and to RUNLOG_LOCAL_KAFKA_VERSION (if set).
pom_hash() { echo "$(sha256sum "$1/pom.xml" | cut -d' ' -f1) ${RUNLOG_LOCAL_KAFKA_VERSION:-}"; }

# maven_fetch POMDIR DEST JARGLOB LOG WHAT: fill DEST with POMDIR/pom.xml's runtime classpath unless it
# is already complete (a jar matching JARGLOB) and was fetched for that pom.
maven_fetch() {
    local pomdir="$1" dest="$2" glob="$3" mvnlog="$4" what="$5"
    if [ -f "$dest/.fetched" ] && [ "$(cat "$dest/.fetched")" = "$(pom_hash "$pomdir")" ] &&
        compgen -G "$dest/$glob" >/dev/null; then
        return 0
    fi
    command -v mvn >/dev/null || {
        log "mvn not found; installing maven"
        apt_install maven
    }
    local tmp="$dest.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$KAFKA_DIR"
    log "fetching $what with Maven into $dest (first use only)"
    local -a vers=()
    [ -z "${RUNLOG_LOCAL_KAFKA_VERSION:-}" ] || vers=(-Dkafka.version="$RUNLOG_LOCAL_KAFKA_VERSION")
    if ! (cd "$pomdir" && mvn -B -q -f pom.xml dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" "${vers[@]}") >"$mvnlog" 2>&1; then
        tail -n 40 "$mvnlog" | sed 's/^/  mvn: /'
        rm -rf "$tmp"
        die "Maven fetch of $what failed (full log: $mvnlog)"
    fi
    pom_hash "$pomdir" >"$tmp/.fetched"
    rm -rf "$dest"
    mv "$tmp" "$dest"
}

fetch_libs() { maven_fetch "$ROOT/deploy/kafka" "$KAFKA_LIBS" 'kafka_2.13-*.jar' "$KAFKA_DIR/mvn.log" "the Kafka jars"; }

# The broker's command-line tools, in their own cache (deploy/local/kafka-tool).
KAFKA_TOOLS_LIBS="$KAFKA_DIR/tools-libs"

fetch_tools() {
    fetch_libs
    maven_fetch "$ROOT/deploy/kafka/tools" "$KAFKA_TOOLS_LIBS" 'kafka-tools-*.jar' "$KAFKA_DIR/mvn-tools.log" \
        "the Kafka tools jars"
}

# kafka_format CONF DATA LOGS CLUSTER_ID: format a node's storage once (kept on later starts).
kafka_format() {
    local conf="$1" data="$2" logs="$3" cid="$4"
    [ -f "$data/meta.properties" ] && return 0
    log "formatting Kafka storage in $data (cluster id $cid)"
    "$JAVA" -Dlog4j2.configurationFile="$LOG4J_CONF" -Dkafka.logs.dir="$logs" \
        -cp "$KAFKA_LIBS/*" kafka.tools.StorageTool format -t "$cid" -c "$conf" \
        >>"$logs/storage-tool.log" 2>&1 || {
        tail -n 20 "$logs/storage-tool.log" | sed 's/^/  storage-tool: /'
        die "kafka storage format failed ($conf)"
    }
}

# kafka_launch PIDFILE CONF LOGS JVM_OPTION...: start kafka.Kafka detached. New session (no
# terminal signals), stdin/stdout/stderr detached, the lock and the export fd closed, so the
# calling script returns while the broker runs on. LOGS/kafka.out keeps only this start's JVM
# output (crash messages); the broker log proper is LOGS/server.log.
kafka_launch() {
    local pidfile="$1" conf="$2" logs="$3"
    shift 3
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" \
        "$JAVA" "$@" -Djava.awt.headless=true \
        -Dkafka.logs.dir="$logs" -Dlog4j2.configurationFile="$LOG4J_CONF" \
        -cp "$KAFKA_LIBS/*" kafka.Kafka "$conf" \
        </dev/null >"$logs/kafka.out" 2>&1 3>&- 9>&- &
    for _ in $(seq 50); do
        [ -s "$pidfile" ] && break
        sleep 0.1
    done
}

find_go() { # GO: the go command (PATH, then the usual install dir, then Debian's golang-go)
    local cand
    for cand in "$(command -v go || true)" /usr/local/go/bin/go /usr/lib/go/bin/go; do
        if [ -n "$cand" ] && [ -x "$cand" ]; then
            GO="$cand"
            return 0
        fi
    done
    log "no go command found; installing golang-go"
    apt_install golang-go
    GO="$(command -v go)"
}
