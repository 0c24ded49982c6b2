#!/usr/bin/env bash
# redis-writes.sh: the write figures of README "Several nodes on one Redis",
# each a fresh redis-server (no persistence) and statecast serve on loopback,
# driven by `statecast bench writes`.
#
#   redis-writes.sh ab A_BIN B_BIN [ROUNDS]
#       one node on one redis-server: 1, 8 and 64 writers to one room, for A
#       and B in turn (A B A B …, ROUNDS times, default 3); B's load tool
#       drives both. With MEMORY=1 each round also runs B on the memory store
#       (no Redis): what the node and the load tool reach on this machine.
#   redis-writes.sh shards BIN [MASTERS…]
#       a Redis Cluster of 1, 2 and 4 masters (or MASTERS), one node per
#       master, writes over 200 rooms through all the nodes.
#
# Build the binaries first, e.g. (from a clone):
#   git worktree add /tmp/main-wt main && (cd /tmp/main-wt && go build -o /tmp/statecast-main ./cmd/statecast)
#   go build -o /tmp/statecast ./cmd/statecast
#   cmd/statecast/bench/redis-writes.sh ab /tmp/statecast-main /tmp/statecast
# Each run prints one line: binary, writers, writes/s, write latency p50 and
# p99 (ms), Redis and node CPU per write (µs), the load tool's and other
# processes' CPU (% of one core: figures are disturbed when "other" is
# high); shards also the busiest master's CPU and the writes/s at which it
# would use a whole core (the Redis-bound ceiling). Env: WRITERS (default
# "1 8 64"), EVENTS (per writer count, default "3000 20000 60000"), ROOMS
# (shards, default 200), SHARD_WRITERS (default 64), SHARD_EVENTS (default
# 60000), WAIT_IDLE (e.g. 30s: before each run, wait up to that long for the
# other processes of the machine to go quiet; default 0).
set -euo pipefail

DIR=$(mktemp -d /tmp/redis-writes.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$DIR"
}
trap cleanup EXIT

port() { # a free loopback port (and its cluster bus port, +10000)
	while :; do
		local p=$((20000 + RANDOM % 30000))
		if ! (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null && ! (echo >/dev/tcp/127.0.0.1/$((p + 10000))) 2>/dev/null; then
			echo $p
			return
		fi
	done
}

redis() { # redis [args…]: start a redis-server on a free port: RPORT, its pid RPID
	for _ in $(seq 10); do
		RPORT=$(port)
		mkdir -p "$DIR/$RPORT"
		redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$DIR/$RPORT" --save "" --appendonly no \
			--logfile redis.log --daemonize no "$@" >/dev/null 2>&1 &
		RPID=$!
		PIDS+=("$RPID")
		for _ in $(seq 100); do
			redis-cli -p "$RPORT" ping >/dev/null 2>&1 && return
			kill -0 "$RPID" 2>/dev/null || break # exited: the port was taken meanwhile
			sleep 0.05
		done
	done
	echo "redis-writes.sh: cannot start redis-server" >&2
	exit 1
}

node() { # node BIN ADDR STORE [flags…]: start statecast serve, its pid in NPID
	local bin=$1 addr=$2 st=$3
	shift 3
	"$bin" serve --store "$st" --addr "$addr" --write-rate 1000000 --history 20000 --log-level warn "$@" >"$DIR/node-$addr.log" 2>&1 &
	NPID=$!
	PIDS+=("$NPID")
	for _ in $(seq 100); do curl -sf "http://$addr/readyz" >/dev/null && break; sleep 0.1; done
}

stop() { # stop PID…
	for p in "$@"; do kill "$p" 2>/dev/null || true; done
	for p in "$@"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
}

line() { # line LABEL: one line from bench --json on stdin
	jq -r --arg l "$1" '[$l, .subs, (.writes_per_s|floor), .ack_p50_ms, .ack_p99_ms, (.redis_cpu_us_per_write // 0 | floor),
		(.server_cpu_us_per_msg // 0 | floor), (.tool_cpu_pct // 0 | floor), (.other_cpu_pct // 0 | floor)] | @tsv'
}

shardline() { # shardline LABEL: line, then the busiest master's CPU and the writes/s at which it would be saturated
	jq -r --arg l "$1" '((.redis_cpu_pct_each // [.redis_cpu_pct]) | max) as $m |
		[$l, .subs, (.writes_per_s|floor), .ack_p50_ms, .ack_p99_ms, (.redis_cpu_us_per_write // 0 | floor),
		($m|floor), (.writes_per_s * 100 / $m | floor), (.server_cpu_us_per_msg // 0 | floor), (.tool_cpu_pct // 0 | floor),
		(.other_cpu_pct // 0 | floor)] | @tsv'
}

ab() {
	local a=$1 b=$2 rounds=${3:-3}
	local writers=(${WRITERS:-1 8 64}) events=(${EVENTS:-3000 20000 60000})
	echo -e "binary\twriters\twrites/s\tp50 ms\tp99 ms\tredis µs/w\tnode µs/w\ttool %\tother %"
	for r in $(seq "$rounds"); do
		for bin in "$a" "$b"; do
			local np
			redis
			np=$(port)
			node "$bin" "127.0.0.1:$np" "redis://127.0.0.1:$RPORT/0"
			for i in "${!writers[@]}"; do
				"$b" bench writes --url "http://127.0.0.1:$np" --server-pid "$NPID" --redis-pid "$RPID" \
					--writers "${writers[$i]}" --window "${writers[$i]}" --events "${events[$i]}" --wait-idle "${WAIT_IDLE:-0}" --json 2>/dev/null |
					line "$(basename "$bin")"
			done
			stop "$NPID" "$RPID"
		done
		if [ "${MEMORY:-}" = 1 ]; then
			local np
			np=$(port)
			node "$b" "127.0.0.1:$np" memory
			for i in "${!writers[@]}"; do
				"$b" bench writes --url "http://127.0.0.1:$np" --server-pid "$NPID" \
					--writers "${writers[$i]}" --window "${writers[$i]}" --events "${events[$i]}" --wait-idle "${WAIT_IDLE:-0}" --json 2>/dev/null |
					line "$(basename "$b")/memory"
			done
			stop "$NPID"
		fi
	done
}

cluster() { # cluster N: start N masters as one cluster: CPIDS, CADDRS (host:port,…)
	local n=$1 pids=() addrs=() ports=()
	for _ in $(seq "$n"); do
		redis --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
		pids+=("$RPID")
		ports+=("$RPORT")
		addrs+=("127.0.0.1:$RPORT")
	done
	# The slots in n equal ranges, then every node meets the first.
	for i in "${!ports[@]}"; do
		redis-cli -p "${ports[$i]}" cluster addslotsrange $((16384 * i / n)) $((16384 * (i + 1) / n - 1)) >/dev/null
		redis-cli -p "${ports[$i]}" cluster meet 127.0.0.1 "${ports[0]}" >/dev/null
	done
	for p in "${ports[@]}"; do
		until redis-cli -p "$p" cluster info | grep -q "cluster_state:ok" &&
			[ "$(redis-cli -p "$p" cluster nodes | grep -c master)" = "$n" ]; do sleep 0.1; done
	done
	local IFS=,
	CPIDS="${pids[*]}"
	CADDRS="${addrs[*]}"
}

shards() {
	local bin=$1
	shift
	local masters=(${@:-1 2 4})
	echo -e "masters\twriters\twrites/s\tp50 ms\tp99 ms\tredis µs/w\tbusiest master %\tits ceiling w/s\tnode A µs/w\ttool %\tother %"
	for n in "${masters[@]}"; do
		local npids=() urls=()
		cluster "$n"
		for _ in $(seq "$n"); do
			local np
			np=$(port)
			node "$bin" "127.0.0.1:$np" "redis://$CADDRS" --redis-cluster
			npids+=("$NPID")
			urls+=(--write-url "http://127.0.0.1:$np")
		done
		local w=${SHARD_WRITERS:-64}
		"$bin" bench writes --url "${urls[1]}" "${urls[@]}" --server-pid "${npids[0]}" --redis-pid "$CPIDS" \
			--rooms "${ROOMS:-200}" --writers "$w" --window "$w" --events "${SHARD_EVENTS:-60000}" --wait-idle "${WAIT_IDLE:-0}" --json 2>/dev/null |
			shardline "$n"
		stop "${npids[@]}" ${CPIDS//,/ }
	done
}

# Sourced (sizing.sh uses its helpers), it defines them and runs nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case ${1:-} in
ab) shift; ab "$@" ;;
shards) shift; shards "$@" ;;
*) sed -n '2,26p' "$0"; exit 2 ;;
esac
