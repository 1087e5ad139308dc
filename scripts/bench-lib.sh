# Shared by the bench scripts: a work directory, private Redis and Postgres
# on free loopback ports (as the tests start them), an agent, and cleanup of
# everything on exit. Source it after `cd` to the repository; set PG_BIN
# first if Postgres is elsewhere.
#
#   WORK, PIDS (add background pids), REDIS_PORT, PG_PORT, DATABASE_URL,
#   BENCH_DURABILITY (shipped or off: BATON_BENCH_DURABILITY)
#   free_port, wait_http URL [tries], start_agent BATON → AGENT_PORT
#   start_redis_cluster MASTERS → CLUSTER_PORTS, CLUSTER_URL (no replicas)
#   redis_pids → the pids of every Redis server started here

PG_BIN=${PG_BIN:-${BATON_PG_BIN:-/usr/lib/postgresql/15/bin}}

# Durability of the stores: `shipped` (the default) as Baton's managed
# stores run, Redis with AOF (`appendfsync everysec`) and Postgres with
# fsync on; `off` (BATON_BENCH_DURABILITY=off) as the tests run them, no
# AOF and fsync=off, which measures Baton's work without the disk's.
BENCH_DURABILITY=${BATON_BENCH_DURABILITY:-shipped}
case "$BENCH_DURABILITY" in
    shipped) REDIS_PERSISTENCE=(--appendonly yes --appendfsync everysec) PG_FSYNC=on ;;
    off) REDIS_PERSISTENCE=(--appendonly no) PG_FSYNC=off ;;
    *) echo "BATON_BENCH_DURABILITY must be shipped or off, not $BENCH_DURABILITY" >&2; exit 2 ;;
esac
echo "stores: durability $BENCH_DURABILITY (Redis ${REDIS_PERSISTENCE[*]}; Postgres fsync=$PG_FSYNC)" >&2
WORK=$(mktemp -d)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    for port in ${REDIS_PORT:-} ${CLUSTER_PORTS:-}; do redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
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
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' "${REDIS_PERSISTENCE[@]}" --dir "$WORK/redis" \
    --daemonize yes --pidfile "$WORK/redis/pid" >/dev/null
PG_PORT=$(free_port)
mkdir -p "$WORK/pg" && chown postgres "$WORK" "$WORK/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust --no-sync >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$WORK/pg" -w -l "$WORK/pg/log" \
    -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c fsync=$PG_FSYNC" start >/dev/null
DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"

start_agent() { # baton binary: the reference agent at echo speed
    AGENT_PORT=$(free_port)
    "$1" agent --listen "127.0.0.1:$AGENT_PORT" --no-notes >"$WORK/agent.log" 2>&1 &
    PIDS+=($!)
    wait_http "http://127.0.0.1:$AGENT_PORT/healthz"
}

# A Redis Cluster of MASTERS masters and no replicas on loopback, assembled
# by hand (`redis-cli --cluster create` refuses fewer than three masters):
# slots split evenly, every node met. Settings as the tests have them.
CLUSTER_PORTS=""
start_redis_cluster() { # masters
    local masters=$1 i port bus first per start end
    CLUSTER_PORTS=""
    for i in $(seq 1 "$masters"); do
        port=$(free_port) bus=$(free_port)
        mkdir -p "$WORK/cluster-$port"
        redis-server --port "$port" --bind 127.0.0.1 --save '' "${REDIS_PERSISTENCE[@]}" --dir "$WORK/cluster-$port" \
            --cluster-enabled yes --cluster-port "$bus" --cluster-config-file nodes.conf \
            --cluster-require-full-coverage no --cluster-node-timeout 1000 --cluster-announce-ip 127.0.0.1 \
            --daemonize yes --pidfile "$WORK/cluster-$port/pid" >/dev/null
        CLUSTER_PORTS="$CLUSTER_PORTS $port"
        [ -z "${first:-}" ] && first=$port && first_bus=$bus
    done
    for _ in $(seq 1 50); do redis-cli -p "$first" ping >/dev/null 2>&1 && break; sleep 0.1; done
    per=$((16384 / masters)) i=0
    for port in $CLUSTER_PORTS; do
        for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
        [ "$port" != "$first" ] && redis-cli -p "$port" cluster meet 127.0.0.1 "$first" "$first_bus" >/dev/null
        start=$((i * per)) end=$(((i + 1) * per - 1))
        [ $((i + 1)) -eq "$masters" ] && end=16383
        redis-cli -p "$port" cluster addslotsrange "$start" "$end" >/dev/null
        i=$((i + 1))
    done
    for port in $CLUSTER_PORTS; do
        for _ in $(seq 1 300); do
            redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' &&
                [ "$(redis-cli -p "$port" cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')" = "$masters" ] && break
            sleep 0.1
        done
    done
    CLUSTER_URL="redis+cluster://$(echo $CLUSTER_PORTS | sed 's/\([0-9]*\)/127.0.0.1:\1/g; s/ /,/g')/"
}

redis_pids() {
    local port
    [ -n "${REDIS_PORT:-}" ] && cat "$WORK/redis/pid"
    for port in ${CLUSTER_PORTS:-}; do cat "$WORK/cluster-$port/pid"; done
}
