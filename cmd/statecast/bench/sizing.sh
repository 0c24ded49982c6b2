#!/usr/bin/env bash
# sizing.sh: the figures of docs/SCALING.md, on loopback, with fresh
# redis-servers and statecast serve nodes driven by `statecast bench`.
#
#   sizing.sh units BIN
#       the unit costs: deliveries and writes on the memory store (one
#       room of 1,000 subscribers at 1,000, 200 and 20 writes/s; 1,000 rooms of 1 and
#       of 10 subscribers at RATE writes/s), idle connections, then the
#       same rooms through one node on one redis-server, the pub/sub push
#       (3 nodes on one redis-server, each room's subscribers on one node
#       or on all three; then at 500, 1,500 and 3,000 writes/s) and writes
#       at saturation (64 writers, 200 rooms).
#   sizing.sh check BIN
#       the run docs/SCALING.md predicts: a Redis Cluster of 2 masters,
#       3 nodes, CHECK_ROOMS rooms of CHECK_SUBS subscribers spread over
#       the nodes, CHECK_RATE writes/s spread over the nodes.
#
# Each run prints one line of figures (CPU in % of one core over the
# measured window): writes/s, deliveries/s, lost subscribers, latency p50
# and p99 (ms), each node's CPU and RSS (MB), each Redis server's CPU, Redis
# CPU per write (µs), the load tool's and other processes' CPU, and from
# the first node's /metrics over the whole run: messages per WebSocket
# frame and bytes per message. Env: RATE (units, default 2000), CHECK_ROOMS
# (200), CHECK_SUBS (10), CHECK_RATE (1000), DURATION (10s), PARTS (units:
# "memory redis"), JSON_LOG (a file: each run's whole bench --json line is
# appended to it), WAIT_IDLE (e.g. 30s: wait up to that long for the
# machine to go quiet before each run), PROTOCOL (the subscribers'
# protocol version: v1, as docs/SCALING.md's figures were measured, or v2).
set -euo pipefail
. "$(dirname "$0")/redis-writes.sh"

node_up() { # node_up VAR STORE [flags…]: a node on a free port, its host:port in VAR (not named up), its pid in NPID
	local var=$1 up
	shift
	for _ in 1 2 3 4 5; do # a port found free may be taken by a client socket before the node binds it
		up=127.0.0.1:$(port)
		if node "$BIN" "$up" "$@" 2>/dev/null; then
			printf -v "$var" '%s' "$up"
			return
		fi
		stop "$NPID"
	done
	echo "sizing.sh: cannot start statecast serve" >&2
	exit 1
}

metrics() { # metrics URL: messages, frames and bytes written to WebSockets so far
	{ curl -sf "$1/metrics" || true; } | awk '
		/^statecast_messages_out_total/ { m += $NF }
		/^statecast_frames_out_total/ { f += $NF }
		/^statecast_bytes_out_total/ { b += $NF }
		END { printf "%d %d %d\n", m, f, b }'
}

rinfo() { # rinfo PORT: a Redis server's used_memory, total_net_input_bytes and total_net_output_bytes
	redis-cli -p "$1" info | tr -d '\r' | awk -F: '/^used_memory:/ { m = $2 } /^total_net_input_bytes:/ { i = $2 }
		/^total_net_output_bytes:/ { o = $2 } END { print m, i, o }'
}

rdelta() { # rdelta LABEL BEFORE AFTER WRITES: what a Redis server gained over a run, also per write
	read -r m0 i0 o0 <<<"$2"
	read -r m1 i1 o1 <<<"$3"
	awk -v l="$1" -v w="$4" -v m=$((m1 - m0)) -v i=$((i1 - i0)) -v o=$((o1 - o0)) 'BEGIN {
		printf "%s\tused_memory +%d B (%.0f B a write)\tnet in %d B (%.0f a write)\tnet out %d B (%.0f a write)\n", l, m, m / w, i, i / w, o, o / w }'
}

run() { # run LABEL URL BENCH-ARGS…: one bench run, one line of figures
	local label=$1 url=$2
	shift 2
	local m0 m1
	m0=$(metrics "$url")
	if ! "$BIN" bench "$@" --protocol "${PROTOCOL:-v1}" --duration "${DURATION:-10s}" --wait-idle "${WAIT_IDLE:-0}" --json 2>"$DIR/err" >"$DIR/out.json"; then
		echo -e "$label	failed: $(tail -n 3 "$DIR/err")"
		return 0
	fi
	m1=$(metrics "$url")
	[ -z "${JSON_LOG:-}" ] || cat "$DIR/out.json" >>"$JSON_LOG"
	read -r ma fa ba <<<"$m0"
	read -r mb fb bb <<<"$m1"
	jq -r --arg l "$label" --argjson mpf "$(awk -v m=$((mb - ma)) -v f=$((fb - fa)) 'BEGIN { printf "%.2f", f ? m / f : 0 }')" \
		--argjson bpm "$(awk -v m=$((mb - ma)) -v b=$((bb - ba)) 'BEGIN { printf "%.1f", m ? b / m : 0 }')" '
		def r: . * 10 | round / 10;
		[$l, (.writes_per_s | round), (.delivered_per_s // 0 | round), .lost_subs, (.latency_p50_ms // .ack_p50_ms // 0 | r),
		 (.latency_p99_ms // .ack_p99_ms // 0 | r),
		 ([.server_cpu_pct] + (.node_cpu_pct_each // []) | map(r) | join("/")),
		 ([.server_rss_mb // 0] + (.node_rss_mb_each // []) | map(round) | join("/")),
		 ((.redis_cpu_pct_each // [.redis_cpu_pct // 0]) | map(r) | join("/")), (.redis_cpu_us_per_write // 0 | r),
		 (.tool_cpu_pct | round), (.other_cpu_pct // 0 | round), $mpf, $bpm] | @tsv' "$DIR/out.json"
}

header() {
	echo -e "run\twrites/s\tdeliveries/s\tlost\tp50 ms\tp99 ms\tnode CPU %\tnode RSS MB\tredis CPU %\tredis µs/w\ttool %\tother %\tmsgs/frame\tB/msg"
}

units() {
	header
	case " ${PARTS:-memory redis} " in *" memory "*) units_memory ;; esac
	case " ${PARTS:-memory redis} " in *" redis "*) units_redis ;; esac
}

units_memory() {
	local rate=${RATE:-2000} a
	node_up a memory
	for w in 1000 200 20; do
		run "memory fanout 1000x${w}/s" "http://$a" fanout --url "http://$a" --server-pid "$NPID" --subs 1000 --rate "$w" --room "f$w"
	done
	run "memory rooms 1000x1 ${rate}/s" "http://$a" rooms --url "http://$a" --server-pid "$NPID" --rooms 1000 --subs-per-room 1 --rate "$rate" --room m1
	run "memory rooms 1000x10 ${rate}/s" "http://$a" rooms --url "http://$a" --server-pid "$NPID" --rooms 1000 --subs-per-room 10 --rate "$rate" --room m10
	stop "$NPID"
	node_up a memory
	if "$BIN" bench idle --url "http://$a" --server-pid "$NPID" --conns 10000 --protocol "${PROTOCOL:-v1}" --wait-idle "${WAIT_IDLE:-0}" --json 2>"$DIR/err" >"$DIR/out.json"; then
		jq -r '["memory idle 10000", "RSS/conn KB", (.server_rss_per_conn_kb*10|round/10), "idle CPU %", (.server_cpu_pct*10|round/10),
			"RSS before MB", (.server_rss_before_mb|round), "other %", (.other_cpu_pct // 0 | round)] | @tsv' "$DIR/out.json"
	else
		echo -e "memory idle 10000\tfailed: $(tail -n 3 "$DIR/err")"
	fi
	stop "$NPID"
}

units_redis() {
	local rate=${RATE:-2000} a b c
	redis
	local rpid=$RPID st="redis://127.0.0.1:$RPORT/0" pids=()
	for h in a b c; do
		node_up "$h" "$st"
		pids+=("$NPID")
	done
	local R="--redis-pid $rpid" N="--server-pid ${pids[0]} --node-pid ${pids[1]} --node-pid ${pids[2]}"
	# Following 1,000 rooms that are hardly written: each node checks each
	# room it follows once a second (HMGET), whatever its writes.
	run "redis rooms 1000x3 1/s, subs on 3 nodes" "http://$a" rooms --url "http://$a" --sub-url "http://$a" --sub-url "http://$b" --sub-url "http://$c" \
		$N $R --rooms 1000 --subs-per-room 3 --rate 1 --room r0
	run "redis rooms 1000x1 ${rate}/s" "http://$a" rooms --url "http://$a" $N $R --rooms 1000 --subs-per-room 1 --rate "$rate" --room r1
	run "redis rooms 1000x3 ${rate}/s, subs on 1 node" "http://$a" rooms --url "http://$a" $N $R --rooms 1000 --subs-per-room 3 --rate "$rate" --room r2
	run "redis rooms 1000x3 ${rate}/s, subs on 3 nodes" "http://$a" rooms --url "http://$a" --sub-url "http://$a" --sub-url "http://$b" --sub-url "http://$c" \
		$N $R --rooms 1000 --subs-per-room 3 --rate "$rate" --room r3
	# A push at three rates: every write on node 1, one subscriber a room on
	# node 2 only (node 1 follows the rooms too: it answers a write once its
	# view holds it).
	for w in 500 1500 3000; do
		run "redis rooms 1000x1 ${w}/s, writer on node 1, subs on node 2" "http://$b" rooms --url "http://$a" --sub-url "http://$b" \
			$N $R --rooms 1000 --subs-per-room 1 --rate "$w" --room "p$w"
	done
	local before
	before=$(rinfo "$RPORT")
	run "redis writes 64 writers, 200 rooms" "http://$a" writes --url "http://$a" $N $R --rooms 200 --writers 64 --window 64 --events 60000 --room w
	rdelta "redis-server, these 60000 writes (300 a room, none trimmed)" "$before" "$(rinfo "$RPORT")" 60000
	stop "${pids[@]}" "$rpid"
}

check() {
	local rooms=${CHECK_ROOMS:-200} subs=${CHECK_SUBS:-10} rate=${CHECK_RATE:-1000} urls=() npids=()
	cluster 2
	for _ in 1 2 3; do
		local hp
		node_up hp "redis://$CADDRS" --redis-cluster
		npids+=("$NPID")
		urls+=("http://$hp")
	done
	local before=() i=0
	for addr in ${CADDRS//,/ }; do before+=("$(rinfo "${addr##*:}")"); done
	header
	run "check: 2 masters, 3 nodes, ${rooms}x${subs}, ${rate}/s" "${urls[0]}" rooms --url "${urls[0]}" \
		--sub-url "${urls[0]}" --sub-url "${urls[1]}" --sub-url "${urls[2]}" \
		--write-url "${urls[0]}" --write-url "${urls[1]}" --write-url "${urls[2]}" --writers 3 \
		--server-pid "${npids[0]}" --node-pid "${npids[1]}" --node-pid "${npids[2]}" --redis-pid "$CPIDS" \
		--rooms "$rooms" --subs-per-room "$subs" --rate "$rate"
	for u in "${urls[@]}"; do echo -e "$u\t$(metrics "$u")\t(messages, frames, bytes since start)"; done
	local writes # every write of the run, warm-up included, as the Redis deltas are
	writes=$(for u in "${urls[@]}"; do curl -sf "$u/metrics"; done | awk '/^statecast_writes_total\{outcome="ok"\}/ { n += $NF } END { print n }')
	for addr in ${CADDRS//,/ }; do
		rdelta "master ${addr##*:} (per write: of all $writes)" "${before[$i]}" "$(rinfo "${addr##*:}")" "$writes"
		i=$((i + 1))
	done
	stop "${npids[@]}" ${CPIDS//,/ }
}

BIN=${2:-}
case ${1:-} in
units) units ;;
check) check ;;
*) sed -n '2,28p' "$0"; exit 2 ;;
esac
