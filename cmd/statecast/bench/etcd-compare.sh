#!/usr/bin/env bash
# etcd-compare.sh: statecast's etcd API against a real etcd on the same
# load, driven by etcd's own benchmark tool (tools/benchmark), in
# interleaved rounds (etcd, statecast, etcd, statecast, …) so that both see
# the same machine; docs/BENCHMARKS.md "Against etcd" holds its figures.
#
#   etcd-compare.sh STATECAST_BIN [ROUNDS]     (default 3 rounds)
#
# Needs `etcd` (Debian: apt-get install etcd-server; 3.4) and the benchmark
# tool, built from the module proxy if BENCHMARK (default
# ~/.cache/statecast/etcd-benchmark) is missing. Both servers are durable:
# etcd fsyncs its WAL per batch, statecast runs its file store (which
# fdatasyncs its write-ahead log per group). statecast serves etcd's one
# keyspace (--etcd-default-room) and lifts its per-client write rate, as an
# etcd has none.
#
# PIN=1 runs each server on CPU 0 and the benchmark tool on CPU 1
# (taskset), so that a row measures a server on a core of its own rather
# than a server and its client sharing both. ROWS="put-64 watch" runs only
# the rows named. STORE=memory runs statecast on its memory store: the
# same path without durability, a bound on what the file store could reach.
#
# Rows (each: etcd's figure, statecast's, the ratio, the p50s, and each
# server's CPU per operation read from /proc around the row):
#   put-1     1 client, 1 connection, 3,000 puts of 256 bytes: puts/s and p50
#   put-64    64 clients on 8 connections, 30,000 puts over 100,000 keys
#   range-l   64 clients, 30,000 linearizable Ranges of one key
#   range-s   the same, serializable
#   watch     100 watchers (10 streams x 10) of one key, 2,000 puts:
#             events received/s
set -euo pipefail

BIN=${1:?usage: etcd-compare.sh STATECAST_BIN [ROUNDS]}
ROUNDS=${2:-3}
BENCHMARK=${BENCHMARK:-$HOME/.cache/statecast/etcd-benchmark}
command -v etcd >/dev/null || { echo "etcd not found (apt-get install etcd-server)" >&2; exit 1; }
SERVER_CPU=() TOOL_CPU=()
if [ "${PIN:-}" = 1 ]; then SERVER_CPU=(taskset -c 0) TOOL_CPU=(taskset -c 1); fi

if [ ! -x "$BENCHMARK" ]; then
	# etcd's root module has replace directives, so `go install` refuses
	# it: build the tool's package inside a module of its own.
	src=$(mktemp -d)
	mod=$(GOFLAGS=-mod=mod go mod download -json go.etcd.io/etcd/v3@v3.5.21 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	cp -r "$mod/tools/benchmark/." "$src/" && chmod -R u+w "$src"
	grep -rl 'go.etcd.io/etcd/v3/tools/benchmark/cmd' "$src" | xargs sed -i 's#go.etcd.io/etcd/v3/tools/benchmark/cmd#etcdbench/cmd#'
	printf 'module etcdbench\n\ngo 1.23\n\nrequire (\n\tgo.etcd.io/etcd/api/v3 v3.5.21\n\tgo.etcd.io/etcd/client/pkg/v3 v3.5.21\n\tgo.etcd.io/etcd/client/v3 v3.5.21\n\tgo.etcd.io/etcd/pkg/v3 v3.5.21\n\tgo.etcd.io/etcd/server/v3 v3.5.21\n)\n' >"$src/go.mod"
	(cd "$src" && GOFLAGS=-mod=mod go mod tidy >/dev/null 2>&1 && mkdir -p "$(dirname "$BENCHMARK")" && go build -o "$BENCHMARK" .)
	rm -rf "$src"
fi

DIR=$(mktemp -d /tmp/etcd-compare.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$DIR"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() {
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "nothing listens on $1" >&2
	return 1
}

start_etcd() { # fresh data each round
	local c p
	c=$(port) p=$(port)
	rm -rf "$DIR/etcd"
	"${SERVER_CPU[@]}" etcd --data-dir "$DIR/etcd" --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
		--listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
		--initial-cluster "default=http://127.0.0.1:$p" >"$DIR/etcd.log" 2>&1 &
	PIDS+=($!)
	wait_port "$c"
	EP=127.0.0.1:$c
}

start_statecast() {
	local h e
	h=$(port) e=$(port)
	rm -rf "$DIR/sc"
	"${SERVER_CPU[@]}" "$BIN" serve --store "${STORE:-file}" --addr "127.0.0.1:$h" --data "$DIR/sc" --etcd-addr "127.0.0.1:$e" --etcd-default-room bench \
		--write-rate 1000000 --demo-hooks=false --log-level warn >"$DIR/sc.log" 2>&1 &
	PIDS+=($!)
	wait_port "$e"
	EP=127.0.0.1:$e
}

stop() { kill "${PIDS[-1]}" && wait "${PIDS[-1]}" 2>/dev/null || true; unset 'PIDS[-1]'; }

# field FILE LABEL: the first number on the first line with LABEL.
field() { grep -m1 "$2" "$1" | grep -oE '[0-9]+\.[0-9]+' | head -1; }

p50() { awk '/50% in/ {print $3*1000; exit}' "$1"; }

TICK=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/${PIDS[-1]}/stat"; } # the server's user + system ticks

# row NAME OPS VALUE-LABEL ARGS...: runs the benchmark tool with ARGS when
# ROWS (default: every row) names NAME, and prints "NAME value p50_ms
# server_cpu_us_per_op".
row() {
	local name=$1 ops=$2 label=$3 o=$DIR/out c0 c1
	shift 3
	if [ -n "${ROWS:-}" ] && [[ " $ROWS " != *" $name "* ]]; then return; fi
	c0=$(cpu)
	"${TOOL_CPU[@]}" "$BENCHMARK" --endpoints="$EP" "$@" >"$o" 2>&1
	c1=$(cpu)
	local value p
	if [ "$label" = events ]; then
		value=$(sed -n '/Watch events received summary/,$p' "$o" | grep -m1 Requests/sec | grep -oE '[0-9]+\.[0-9]+')
		p=-
	else
		value=$(field "$o" Requests/sec) p=$(p50 "$o")
	fi
	echo "$name $value $p $(awk -v t=$((c1 - c0)) -v hz="$TICK" -v n="$ops" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }')"
}

run_rows() { # prints a row line for each row, for the server at $EP
	row put-1 3000 puts --conns=1 --clients=1 put --key-size=8 --sequential-keys --total=3000 --val-size=256
	row put-64 30000 puts --conns=8 --clients=64 put --key-size=8 --key-space-size=100000 --total=30000 --val-size=256
	row range-l 30000 ranges --conns=8 --clients=64 range 00000001 --consistency=l --total=30000
	row range-s 30000 ranges --conns=8 --clients=64 range 00000001 --consistency=s --total=30000
	row watch 200000 events --conns=1 --clients=1 watch --streams=10 --watch-per-stream=10 --watched-key-total=1 --put-total=2000 --key-size=8
}

printf '%-8s %-6s %12s %12s %7s  %-25s %s\n' row round etcd statecast ratio "p50 ms (etcd / statecast)" "server CPU µs/op (etcd / statecast)"
for r in $(seq "$ROUNDS"); do
	start_etcd
	run_rows >"$DIR/etcd.rows"
	stop
	start_statecast
	run_rows >"$DIR/sc.rows"
	stop
	paste -d' ' "$DIR/etcd.rows" "$DIR/sc.rows" | while read -r row e ep50 ecpu _ s sp50 scpu; do
		ratio=$(awk -v a="$e" -v b="$s" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "-" }')
		printf '%-8s %-6s %12s %12s %7s  %-25s %s\n' "$row" "$r" "$e" "$s" "$ratio" "$ep50 / $sp50" "$ecpu / $scpu"
	done
done
