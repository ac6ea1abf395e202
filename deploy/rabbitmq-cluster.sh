#!/usr/bin/env bash
# A three-node RabbitMQ cluster on this one machine, beside (never touching) the usual
# node on 5672: for the broker-node-loss test (tests/e2e/test_broker_node_loss.py) and
# for trying quorum queues and client failover by hand (docs/operations/scaling.md).
#
#   deploy/rabbitmq-cluster.sh start        start jobops1..3 and join 2 and 3 to 1 (idempotent)
#   deploy/rabbitmq-cluster.sh status       each node: running or not, and its AMQP port
#   deploy/rabbitmq-cluster.sh kill NODE    kill -9 one node (jobops2, or jobops2@localhost)
#   deploy/rabbitmq-cluster.sh leader Q [VHOST]   the node that leads quorum queue Q
#   deploy/rabbitmq-cluster.sh ctl ARGS...  rabbitmqctl against the first live node
#   deploy/rabbitmq-cluster.sh urls [VHOST] the BROKER_URL listing all three nodes
#   deploy/rabbitmq-cluster.sh stop         kill every node and delete its data
#
# Each node has its own name (jobopsN@localhost), AMQP port (JOBOPS_CLUSTER_PORT + N - 1,
# default 5781..5783), Erlang distribution port (25781..), data, logs and config under
# var/rabbitmq-cluster/, no plugins (so no management or Prometheus listener clashes
# with the system node), and the cluster's own Erlang cookie (HOME points at its
# directory, for the server and for rabbitmqctl alike). Needs the Debian
# `rabbitmq-server` package (its scripts under /usr/lib/rabbitmq/bin) and epmd.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${JOBOPS_CLUSTER_PORT:-5781}
BASE=${JOBOPS_CLUSTER_DIR:-$PWD/var/rabbitmq-cluster}
BIN=${RABBITMQ_BIN:-/usr/lib/rabbitmq/bin}
NODES=(jobops1 jobops2 jobops3)
HOST=localhost

port_of() { echo $((BASE_PORT + ${1#jobops} - 1)); }
dist_port_of() { echo $((20000 + $(port_of "$1"))); }
full() { case $1 in *@*) echo "$1" ;; *) echo "$1@$HOST" ;; esac; }
short() { echo "${1%@*}"; }

# Every command runs with the cluster's environment: its HOME (the cookie), no system
# rabbitmq-env.conf (it names the system node), and the distribution on 127.0.0.1.
cluster_env() {
    export HOME=$BASE
    export RABBITMQ_CONF_ENV_FILE=$BASE/rabbitmq-env.conf
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_CRASH_DUMP=$BASE/erl_crash.dump  # not in the checkout
    export ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

ctl() {  # ctl NODE ARGS...
    local node; node=$(full "$1"); shift
    "$BIN/rabbitmqctl" -q -n "$node" "$@"
}

running() {  # (no cluster directory: nothing runs, and the CLI would crash without its cookie)
    [ -f "$BASE/.erlang.cookie" ] && ctl "$1" await_startup --timeout 2 >/dev/null 2>&1
}

prepare() {
    mkdir -p "$BASE"
    if [ ! -f "$BASE/.erlang.cookie" ]; then
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$BASE/.erlang.cookie"
        chmod 400 "$BASE/.erlang.cookie"
    fi
    : >"$BASE/rabbitmq-env.conf"
    echo "[]." >"$BASE/enabled_plugins"
}

start_node() {
    local name=$1 dir=$BASE/$1
    mkdir -p "$dir/log"
    cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = 127.0.0.1:$(port_of "$name")
cluster_name = jobops-cluster
log.file.level = warning
EOF
    RABBITMQ_NODENAME=$(full "$name") \
    RABBITMQ_NODE_PORT=$(port_of "$name") \
    RABBITMQ_DIST_PORT=$(dist_port_of "$name") \
    RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf \
    RABBITMQ_MNESIA_BASE=$dir/mnesia \
    RABBITMQ_LOG_BASE=$dir/log \
    RABBITMQ_PID_FILE=$dir/pid \
    RABBITMQ_ENABLED_PLUGINS_FILE=$BASE/enabled_plugins \
        nohup "$BIN/rabbitmq-server" >"$dir/log/stdout.log" 2>&1 </dev/null &
}

wait_up() {  # wait_up NODE SECONDS
    local node=$1
    for _ in $(seq "$2"); do
        if running "$node"; then return 0; fi
        sleep 1
    done
    echo "rabbitmq-cluster: $node did not start; see $BASE/$node/log/" >&2
    return 1
}

clustered_with_first() {  # whether NODE already runs in the cluster of the first node
    ctl "${NODES[0]}" cluster_status --formatter json 2>/dev/null \
        | grep -q "\"$(full "$1")\"" && running "$1"
}

cmd_start() {
    prepare
    for name in "${NODES[@]}"; do
        running "$name" || start_node "$name"
    done
    for name in "${NODES[@]}"; do wait_up "$name" 90; done
    for name in "${NODES[@]:1}"; do
        if ! clustered_with_first "$name"; then
            {
                ctl "$name" stop_app
                ctl "$name" reset
                ctl "$name" join_cluster "$(full "${NODES[0]}")"
                ctl "$name" start_app
            } >>"$BASE/$name/log/join.log" 2>&1
        fi
    done
    cmd_status
}

cmd_status() {
    for name in "${NODES[@]}"; do
        if running "$name"; then state=running; else state=down; fi
        echo "$(full "$name") port=$(port_of "$name") $state"
    done
}

cmd_kill() {
    local name; name=$(short "${1:?which node? (jobops1, jobops2 or jobops3)}")
    local pidfile=$BASE/$name/pid
    [ -s "$pidfile" ] || { echo "rabbitmq-cluster: no pid for $name" >&2; return 1; }
    kill -9 "$(cat "$pidfile")" 2>/dev/null || true
    echo "killed $(full "$name") (pid $(cat "$pidfile"))"
}

first_live() {
    for name in "${NODES[@]}"; do
        if running "$name"; then echo "$name"; return 0; fi
    done
    echo "rabbitmq-cluster: no node is running" >&2
    return 1
}

cmd_leader() {  # the node that leads quorum queue $1 in vhost $2
    local queue=${1:?which queue?} vhost=${2:-/} node
    node=$(first_live)
    ctl "$node" list_queues -p "$vhost" name leader --no-table-headers \
        | awk -v q="$queue" '$1 == q { print $2 }'
}

cmd_urls() {
    local vhost=${1:-} urls=()
    for name in "${NODES[@]}"; do
        urls+=("amqp://guest:guest@127.0.0.1:$(port_of "$name")/$vhost")
    done
    (IFS=';'; echo "${urls[*]}")
}

cmd_stop() {
    for name in "${NODES[@]}"; do
        [ -s "$BASE/$name/pid" ] && kill -9 "$(cat "$BASE/$name/pid")" 2>/dev/null || true
    done
    # The nodes' epmd registrations go with their processes; their data goes here.
    rm -rf "$BASE"
    echo "stopped and removed $BASE"
}

cluster_env
case ${1:-} in
    start) cmd_start ;;
    status) cmd_status ;;
    kill) cmd_kill "${2:-}" ;;
    leader) cmd_leader "${2:-}" "${3:-/}" ;;
    ctl) shift; ctl "$(first_live)" "$@" ;;
    urls) cmd_urls "${2:-}" ;;
    stop) cmd_stop ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
esac
