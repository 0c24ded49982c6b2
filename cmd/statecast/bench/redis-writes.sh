#!/usr/bin/env bash
# redis-writes.sh: the write figures of README "Several nodes on one Redis",
# each a fresh redis-server (no persistence) and statecast serve on loopback,
# driven by `statecast bench writes`.
#
#   redis-writes.sh ab A_BIN B_BIN [ROUNDS]
#       one node on one redis-server: 1, 8 and 64 writers to one room, for A
#       and B in turn (A B A B …, ROUNDS times, default 3); B's load tool
#       drives both (OWN_TOOL=1: each binary's own, for a build older than
#       protocol v2 or than the load tool's fixes). With MEMORY=1 each round
#       also runs B on the memory store (no Redis): what the node and the
#       load tool reach on this machine.
#   redis-writes.sh shards BIN [MASTERS…]
#       a Redis Cluster of 1, 2 and 4 masters (or MASTERS), one node per
#       master, writes over 200 rooms through all the nodes. With
#       MASTER_CPU=P (root, cgroup v1 cpu controller) each master may use
#       P % of one core (P ≥ 5; CFS quota, 20 ms period): Redis is then the bound,
#       as where each master has a machine of its own, and writes/s measure
#       how the Redis-bound part grows with masters on a machine of 2 cores.
#   redis-writes.sh durability BIN [ROUNDS]
#       one node, 1, 8 and 64 writers to one room, on each deployment in turn
#       (ROUNDS times, default 3), each on fresh redis-servers: no
#       persistence; AOF appendfsync everysec; AOF appendfsync always; a
#       master with one replica, the node not waiting for it; the same with
#       --redis-min-replicas 1 (each write waits for the replica's WAIT).
#   redis-writes.sh http BIN [CENTRIFUGO_BIN] [ROUNDS]
#       writes over HTTP by HTTP_CONNS (default 256) concurrent publishers
#       (wrk, Debian's package) for HTTP_SECONDS (default 10), each round on
#       a fresh redis-server: statecast (PUT /v1/rooms/bench/kv/k0…k9, 100-byte
#       values) through one node, then, given its binary, Centrifugo with its
#       Redis engine and history (POST /api/publish to one channel, the same
#       values). Prints publishes/s, wrk's latency p50/p99, the CPU per
#       publish of the server and of Redis, and the CPU of wrk and of the
#       machine's other processes (% of one core: figures are disturbed
#       when "other" is high). No Centrifugo code or build is
#       part of this repository: bring a binary of your own.
#
# Build the binaries first, e.g. (from a clone):
#   git worktree add /tmp/main-wt main && (cd /tmp/main-wt && go build -o /tmp/statecast-main ./cmd/statecast)
#   go build -o /tmp/statecast ./cmd/statecast
#   cmd/statecast/bench/redis-writes.sh ab /tmp/statecast-main /tmp/statecast
# ab, durability and shards print, per run, one line: binary (durability: the deployment), writers, writes/s, write latency p50 and
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
CGROUPS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	# Bounded: a process that does not stop within 30 s is killed.
	local deadline=$((SECONDS + 30))
	for p in "${PIDS[@]}"; do
		while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
		kill -KILL "$p" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	for g in "${CGROUPS[@]}"; do rmdir "$g" 2>/dev/null || true; done
	if [ -n "${KEEP_LOGS:-}" ]; then echo "the logs are kept in $DIR" >&2; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

port() { # a free loopback port (and its cluster bus port, +10000), both below
	# Linux's ephemeral range (32768 up), which the load tool's connections use
	while :; do
		local p=$((10000 + RANDOM % 12000))
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
	"$bin" serve --store "$st" --addr "$addr" --write-rate 1000000 --history 20000 --log-level warn "$@" >>"$DIR/node-$addr.log" 2>&1 & # >>: a restart on the same address keeps the log
	NPID=$!
	PIDS+=("$NPID")
	await "http://$addr/readyz" "statecast serve on $addr" "$DIR/node-$addr.log"
}

await() { # await URL WHAT LOG: until URL answers 2xx (10 s), else WHAT's log and failure
	for _ in $(seq 100); do curl -sf "$1" >/dev/null && return; sleep 0.1; done
	echo "redis-writes.sh: $2 did not become ready:" >&2
	tail -5 "$3" >&2
	return 1
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
			local tool=$b
			[ "${OWN_TOOL:-}" != 1 ] || tool=$bin
			for i in "${!writers[@]}"; do
				"$tool" bench writes --url "http://127.0.0.1:$np" --server-pid "$NPID" --redis-pid "$RPID" \
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

durability() {
	local bin=$1 rounds=${2:-3}
	local writers=(${WRITERS:-1 8 64}) events=(${EVENTS:-3000 20000 60000})
	echo -e "deployment\twriters\twrites/s\tp50 ms\tp99 ms\tredis µs/w\tnode µs/w\ttool %\tother %"
	for _ in $(seq "$rounds"); do
		for d in none aof-everysec aof-always replica replica-ack; do
			local np flags=() rpids
			case $d in
			none) redis ;;
			aof-everysec) redis --appendonly yes --appendfsync everysec ;;
			aof-always) redis --appendonly yes --appendfsync always ;;
			replica*)
				redis --repl-diskless-sync-delay 0
				local mport=$RPORT mpid=$RPID
				redis --replicaof 127.0.0.1 "$mport"
				until redis-cli -p "$mport" info replication | grep -q "state=online"; do sleep 0.05; done
				rpids="$RPID"
				RPORT=$mport RPID=$mpid
				[ "$d" = replica ] || flags=(--redis-min-replicas 1)
				;;
			esac
			np=$(port)
			node "$bin" "127.0.0.1:$np" "redis://127.0.0.1:$RPORT/0" "${flags[@]}"
			for i in "${!writers[@]}"; do
				"$bin" bench writes --url "http://127.0.0.1:$np" --server-pid "$NPID" --redis-pid "$RPID" \
					--writers "${writers[$i]}" --window "${writers[$i]}" --events "${events[$i]}" --wait-idle "${WAIT_IDLE:-0}" --json 2>/dev/null |
					line "$d"
			done
			stop "$NPID" "$RPID" ${rpids:-}
			rpids=
		done
	done
}

limit() { # limit PID PERCENT: at most PERCENT % of one core for the process (a cgroup of its own)
	local g=/sys/fs/cgroup/cpu/statecast-bench-$1
	[[ $2 =~ ^[0-9]+$ ]] && (($2 >= 5)) || { echo "redis-writes.sh: MASTER_CPU is a whole percentage of at least 5" >&2; exit 1; }
	[ -w /sys/fs/cgroup/cpu/cpu.cfs_quota_us ] && mkdir "$g" ||
		{ echo "redis-writes.sh: MASTER_CPU needs root and the cgroup v1 cpu controller" >&2; exit 1; }
	CGROUPS+=("$g")
	echo 20000 >"$g/cpu.cfs_period_us"
	echo $((200 * $2)) >"$g/cpu.cfs_quota_us"
	echo "$1" >"$g/cgroup.procs"
}

cluster() { # cluster N: start N masters as one cluster: CPIDS, CADDRS (host:port,…)
	local n=$1 pids=() addrs=() ports=()
	for _ in $(seq "$n"); do
		redis --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
		[ -z "${MASTER_CPU:-}" ] || limit "$RPID" "$MASTER_CPU"
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

cpu() { # cpu PID: the process's user+system CPU in clock ticks
	awk '{print $14 + $15}' "/proc/$1/stat"
}

machine() { # the machine's busy CPU in clock ticks: user, nice, system, irq and
	# softirq (a process's system time includes the softirqs it ran: loopback TCP)
	awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat
}

wrkline() { # wrkline LABEL SERVER_PID REDIS_PID URL SCRIPT: a wrk run, one line
	local label=$1 spid=$2 rpid=$3 url=$4 script=$5 s0 r0 m0 t0 s1 r1 m1 t1 out
	s0=$(cpu "$spid"); r0=$(cpu "$rpid"); m0=$(machine); t0=$(date +%s%N)
	# wrk's own CPU: `times` in the subshell prints its children's, wrk's,
	# as the last line ("XmY.YYYs XmZ.ZZZs").
	out=$(wrk -t 2 -c "${HTTP_CONNS:-256}" -d "${HTTP_SECONDS:-10}s" --latency -s "$script" "$url"; times)
	s1=$(cpu "$spid"); r1=$(cpu "$rpid"); m1=$(machine); t1=$(date +%s%N)
	local n rps p50 p99 hz wrk ms
	hz=$(getconf CLK_TCK)
	n=$(awk '/requests in/ {print $1}' <<<"$out")
	rps=$(awk '/Requests\/sec/ {printf "%d", $2}' <<<"$out")
	p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
	p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
	wrk=$(tail -1 <<<"$out" | awk '{split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", (u[1] * 60 + u[2] + s[1] * 60 + s[2]) * 1000}')
	ms=$(( (t1 - t0) / 1000000 ))
	if grep -q "Non-2xx" <<<"$out"; then echo "redis-writes.sh: $label: $(grep Non-2xx <<<"$out")" >&2; fi
	# wrk % and other % (the machine's other processes) are of one core.
	echo -e "$label\t$rps\t$p50\t$p99\t$(( (s1 - s0) * 1000000 / hz / n ))\t$(( (r1 - r0) * 1000000 / hz / n ))\t$(( wrk * 100 / ms ))\t$(( ((m1 - m0 - s1 + s0 - r1 + r0) * 1000 / hz - wrk) * 100 / ms ))"
}

http() {
	local bin=$1 cf=${2:-} rounds=${3:-3}
	command -v wrk >/dev/null || { echo "redis-writes.sh: needs wrk (apt-get install wrk)" >&2; exit 1; }
	local value
	value=$(printf 'x%.0s' $(seq 98))
	cat >"$DIR/statecast.lua" <<LUA
local n = 0
request = function()
  n = n + 1
  return wrk.format("PUT", "/v1/rooms/bench/kv/k" .. (n % 10), {["Content-Type"] = "application/json"}, '"$value"')
end
LUA
	cat >"$DIR/centrifugo.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-API-Key"] = "bench"
wrk.body = '{"channel":"bench","data":"$value"}'
LUA
	echo -e "server\tpublishes/s\tp50\tp99\tserver µs/publish\tredis µs/publish\twrk %\tother %"
	for _ in $(seq "$rounds"); do
		local np
		redis
		np=$(port)
		node "$bin" "127.0.0.1:$np" "redis://127.0.0.1:$RPORT/0"
		wrkline statecast "$NPID" "$RPID" "http://127.0.0.1:$np" "$DIR/statecast.lua"
		stop "$NPID" "$RPID"
		[ -n "$cf" ] || continue
		redis
		np=$(port)
		cat >"$DIR/centrifugo.json" <<JSON
{"http_server": {"address": "127.0.0.1", "port": $np},
 "http_api": {"key": "bench"},
 "log": {"level": "error"}, "health": {"enabled": true},
 "engine": {"type": "redis", "redis": {"address": ["redis://127.0.0.1:$RPORT"]}},
 "channel": {"without_namespace": {"history_size": 20000, "history_ttl": "300s", "force_positioning": true}}}
JSON
		"$cf" --config "$DIR/centrifugo.json" >"$DIR/centrifugo.log" 2>&1 &
		local cpid=$!
		PIDS+=("$cpid")
		for _ in $(seq 100); do curl -sf "http://127.0.0.1:$np/health" >/dev/null && break; sleep 0.1; done
		wrkline centrifugo "$cpid" "$RPID" "http://127.0.0.1:$np/api/publish" "$DIR/centrifugo.lua"
		stop "$cpid" "$RPID"
	done
}

# Sourced (sizing.sh uses its helpers), it defines them and runs nothing.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case ${1:-} in
ab) shift; ab "$@" ;;
shards) shift; shards "$@" ;;
durability) shift; durability "$@" ;;
http) shift; http "$@" ;;
*) sed -n '2,50p' "$0"; exit 2 ;;
esac
