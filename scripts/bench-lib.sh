# Shared by the bench scripts: a work directory, private Redis and Postgres
# on free loopback ports (as the tests start them), an agent, and cleanup of
# everything on exit. Source it after `cd` to the repository; set PG_BIN
# first if Postgres is elsewhere.
#
#   WORK, PIDS (add background pids), REDIS_PORT, PG_PORT, DATABASE_URL
#   free_port, wait_http URL [tries], start_agent BATON → AGENT_PORT

PG_BIN=${PG_BIN:-${BATON_PG_BIN:-/usr/lib/postgresql/15/bin}}
WORK=$(mktemp -d)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    redis-cli -p "${REDIS_PORT:-0}" shutdown nosave >/dev/null 2>&1 || true
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pg" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # url [tries of 0.1 s]
    for _ in $(seq 1 "${2:-300}"); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done
    echo "timeout: $1" >&2
    return 1
}

REDIS_PORT=$(free_port)
mkdir -p "$WORK/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/redis" \
    --daemonize yes --pidfile "$WORK/redis/pid" >/dev/null
PG_PORT=$(free_port)
mkdir -p "$WORK/pg" && chown postgres "$WORK" "$WORK/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust --no-sync >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pg" -w -l "$WORK/pg/log" \
    -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"

start_agent() { # baton binary: the reference agent at echo speed
    AGENT_PORT=$(free_port)
    "$1" agent --listen "127.0.0.1:$AGENT_PORT" --no-notes >"$WORK/agent.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$AGENT_PORT/healthz"
}
