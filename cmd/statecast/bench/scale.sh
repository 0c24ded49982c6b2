#!/usr/bin/env bash
# scale.sh: CONNS subscribed WebSocket connections (default 100,000) on
# NODES statecast nodes (6) on one redis-server, held by PROCS load-tool
# processes (6, `statecast bench scale`), each from its own SOURCES
# loopback source addresses (2: 127.0.P.1, 127.0.P.2 for process P-1).
#
#   scale.sh BIN [rooms|one]
#       rooms: ROOMS rooms (1,000) of CONNS/ROOMS, a room's clients on one
#       node (PLACEMENT=room); one: one room of CONNS, the clients over the
#       nodes in turn (PLACEMENT=rr).
#
# Each client holds a key bound to its session. In order: the time until
# all are subscribed; the RSS per connection of each node and of the load
# tool; the idle CPU of the nodes and of Redis over IDLE (30s) with nothing
# written; one marked write to each room (its value carries its send time)
# and its delivery to every client: p50, p99 and the last; then a storm:
# the last node SIGKILLed, its clients resuming on the others with their
# session and position (the node is restarted once the others are full or
# everyone is back), then a rolling SIGTERM restart of every node, each
# back before the next goes. Per storm: time until all resumed, how they
# resumed, snapshot reads (statecast_room_loads_total of the nodes), peak
# RSS, the session-bound keys left in the store. One table at the end.
#
# Redis runs at nice -10 (root): on a shared machine the others would
# starve it. A process may hold FD_LIMIT files (the hard RLIMIT_NOFILE): each node
# takes --max-connections to fit it, as statecast serve does by default.
# Small: CONNS=3000 ROOMS=30 IDLE=3s scale.sh BIN. Env: CONNS, ROOMS, NODES,
# PROCS, SOURCES, PLACEMENT, IDLE, TIMEOUT (each wait, 600s), MAX_CONNECTING (each node's
# --max-connecting; default: the node's own), LEASE_GRACE
# (120s: clients refused by full nodes wait for a restart; the default 5s
# would end their sessions), NODE_TIMEOUT (10s), MAX_CONNECTIONS (the nodes'), DIAL_CONC
# (connections each client process opens at a time: 50), JSON_LOG (a file: every merged report is
# appended to it), KEEP_LOGS (1: keep the nodes' and the clients' logs).
#
# SERVER=centrifugo CENTRIFUGO_BIN=PATH: the nodes are Centrifugo v6 (a
# binary of your own; none is part of this repository) on the same
# redis-server, each with its config file in the run's directory: Redis
# engine, history (20000, 1h) with recovery and positioning forced, client
# insecure (no tokens), client.connection_limit MAX_CONNECTIONS; the
# clients speak its JSON protocol and resume by recovery from their offset.
# No sessions: no session-bound keys; instead of the snapshot reads, the
# nodes' centrifugo_client_recover counts. MAX_CONNECTING, LEASE_GRACE and
# NODE_TIMEOUT do not apply.
set -euo pipefail
. "$(dirname "$0")/redis-writes.sh"
trap 'exit 143' TERM INT

BIN=${1:?usage: scale.sh BIN [rooms|one]}
SHAPE=${2:-rooms}
CONNS=${CONNS:-100000} NODES=${NODES:-6} PROCS=${PROCS:-6} SOURCES=${SOURCES:-2}
IDLE=${IDLE:-30s} TIMEOUT=${TIMEOUT:-600s} LEASE_GRACE=${LEASE_GRACE:-120s} NODE_TIMEOUT=${NODE_TIMEOUT:-10s}
case $SHAPE in
rooms) ROOMS=${ROOMS:-1000} PLACEMENT=${PLACEMENT:-room} ;;
one) ROOMS=1 PLACEMENT=${PLACEMENT:-rr} ;;
*) sed -n '2,43p' "$0"; exit 2 ;;
esac
ROOM=scale$RANDOM
SERVER=${SERVER:-statecast}
SERVER_FLAG=()
case $SERVER in
statecast) ;;
centrifugo)
	CENTRIFUGO_BIN=${CENTRIFUGO_BIN:?SERVER=centrifugo needs CENTRIFUGO_BIN, the centrifugo binary}
	SERVER_FLAG=(--server centrifugo)
	;;
*) echo "scale.sh: SERVER is statecast or centrifugo, not $SERVER" >&2; exit 2 ;;
esac

ulimit -n "$(ulimit -Hn)"
FD_LIMIT=$(ulimit -n)
# statecast serve's own fit: 256 files for the store and the log, 1 % of
# the connections more for health checks.
MAXC=${MAX_CONNECTIONS:-$(((FD_LIMIT - 256) * 100 / 101))}
# Each node's connects in progress: its own default (128 a CPU, at least
# 256) unless MAX_CONNECTING says.
MAX_CONNECTING=${MAX_CONNECTING:-}
CONNECTING_FLAG=()
if [ -n "$MAX_CONNECTING" ]; then CONNECTING_FLAG=(--max-connecting "$MAX_CONNECTING"); fi

ROWS=()
row() { # row FIGURE VALUE: a line of the final table, echoed as it comes
	ROWS+=("$1	$2")
	echo "scale.sh $(date -u +%T): $1: $2" >&2
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
rss_kb() { awk -v f="${2:-VmRSS}:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
metric() { # metric NAME: its sum over the live nodes, each as "pid value"
	local i
	for i in "${!URLS[@]}"; do
		kill -0 "${NPIDS[$i]}" 2>/dev/null || continue
		echo "${NPIDS[$i]} $({ curl -sf "${URLS[$i]}/metrics" || true; } | awk -v n="$1" '$1 ~ "^"n { s += $NF } END { printf "%d", s }')"
	done
}
cf_metric() { # cf_metric NAME LABEL: the sum of Centrifugo's counter NAME{…LABEL…} over the live nodes, each as "pid value"
	local i
	for i in "${!URLS[@]}"; do
		kill -0 "${NPIDS[$i]}" 2>/dev/null || continue
		echo "${NPIDS[$i]} $({ curl -sf "${URLS[$i]}/metrics" || true; } | awk -v n="$1{" -v l="$2" 'index($1, n) == 1 && (index($1, "{" l) || index($1, "," l)) { s += $NF } END { printf "%d", s }')"
	done
}
recovers() { # the nodes' recoveries so far, by outcome: "pid yes no" each
	join <(cf_metric centrifugo_client_recover 'recovered="yes"' | sort) <(cf_metric centrifugo_client_recover 'recovered="no"' | sort)
}
recover_delta() { # recover_delta BEFORE AFTER: the recoveries the nodes counted meanwhile
	echo "recovered $(delta "$(cut -d' ' -f1,2 <<<"$1")" "$(cut -d' ' -f1,2 <<<"$2")"), not recovered $(delta "$(cut -d' ' -f1,3 <<<"$1")" "$(cut -d' ' -f1,3 <<<"$2")")"
}
delta() { # delta BEFORE AFTER: what the nodes' counters gained (a restarted node from 0)
	awk 'NR == FNR { b[$1] = $2; next } { s += $2 - b[$1] } END { print s + 0 }' <(echo "$1") <(echo "$2")
}

cf_node() { # cf_node I: Centrifugo node I on its address, its config in $DIR/centrifugo-I.json, its pid in NPID
	local addr=${ADDRS[$1]} conf=$DIR/centrifugo-$1.json
	cat >"$conf" <<JSON
{"http_server": {"address": "${addr%:*}", "port": ${addr##*:}},
 "http_api": {"key": "bench"},
 "log": {"level": "warn"}, "health": {"enabled": true}, "prometheus": {"enabled": true},
 "usage_stats": {"disabled": true},
 "client": {"insecure": true, "connection_limit": $MAXC},
 "engine": {"type": "redis", "redis": {"address": ["redis://127.0.0.1:$RPORT"]}},
 "channel": {"without_namespace": {"history_size": 20000, "history_ttl": "3600s",
  "force_recovery": true, "force_positioning": true}}}
JSON
	# Without CENTRIFUGO_BIN in its environment: Centrifugo takes CENTRIFUGO_* for its own.
	env -u CENTRIFUGO_BIN "$CENTRIFUGO_BIN" --config "$conf" >>"$DIR/node-$addr.log" 2>&1 &
	NPID=$!
	PIDS+=("$NPID")
	await "http://$addr/health" "centrifugo on $addr" "$DIR/node-$addr.log"
}

start_node() { # start_node I: node I on its address (a restart keeps it)
	if [ "$SERVER" = centrifugo ]; then
		cf_node "$1"
		NPIDS[$1]=$NPID
		return
	fi
	node "$BIN" "${ADDRS[$1]}" "redis://127.0.0.1:$RPORT/0" --max-connections "$MAXC" \
		--lease-grace "$LEASE_GRACE" --node-timeout "$NODE_TIMEOUT" "${CONNECTING_FLAG[@]}"
	NPIDS[$1]=$NPID
}

FDS=() CPIDS=()
start_clients() {
	local p args u fd
	for p in $(seq 0 $((PROCS - 1))); do
		mkfifo "$DIR/in.$p"
		args=(--part "$p/$PROCS" --conns "$CONNS" --rooms "$ROOMS" --room "$ROOM" --placement "$PLACEMENT")
		if [ "$SERVER" = centrifugo ]; then args+=("${SERVER_FLAG[@]}"); else args+=(--lease); fi
		args+=(--source "127.0.$((p + 1)).1-127.0.$((p + 1)).$SOURCES" --timeout "$TIMEOUT" --dial-concurrency "${DIAL_CONC:-50}")
		for u in "${URLS[@]}"; do args+=(--sub-url "$u"); done
		: >"$DIR/out.$p"
		exec {fd}<"$DIR/out.$p"
		OUTS+=("$fd")
		"$BIN" bench scale "${args[@]}" <"$DIR/in.$p" >>"$DIR/out.$p" 2>"$DIR/err.$p" &
		CPIDS+=($!)
		PIDS+=($!)
	done
	# Each opens its input once this shell opens the other end: only now,
	# so that no client inherits another's (its input would never end).
	for p in "${!CPIDS[@]}"; do
		exec {fd}>"$DIR/in.$p"
		FDS+=("$fd")
	done
}

# The waits below poll while the storms keep both cores busy: each poll
# is fork-free (a fork and exec of sleep, wc or a subshell ten times a
# second took a tenth of a core from the nodes being measured). NAP is a
# pipe nobody writes: a read of it with a timeout is a sleep.
exec {NAP}<> <(:)
nap() { read -r -t "$1" -u "$NAP" || true; }
OUTS=() PARTS=()
answer() { # answer P: the next whole line of client process P's output in LINE, or false
	local part
	if IFS= read -r -u "${OUTS[$1]}" part; then
		LINE=${PARTS[$1]-}$part PARTS[$1]=
		return 0
	fi
	PARTS[$1]+=$part # a line still being written
	return 1
}

ask() { # ask CMD [SECONDS]: CMD to every client process; their answers merged in $DIR/m.json
	local cmd=$1 limit=${2:-120} p
	for p in "${!FDS[@]}"; do echo "$cmd" >&"${FDS[$p]}"; done
	local deadline=$((SECONDS + limit))
	: >"$DIR/answers"
	for p in "${!FDS[@]}"; do
		# Each answers each command with one line: the next one read.
		until answer "$p"; do
			if [ $SECONDS -ge $deadline ] || ! kill -0 "${CPIDS[$p]}" 2>/dev/null; then
				echo "scale.sh: client process $p did not answer $cmd: $(tail -n 3 "$DIR/err.$p")" >&2
				exit 1
			fi
			nap 0.1
		done
		printf '%s\n' "$LINE" >>"$DIR/answers"
	done
	"$BIN" bench scale-merge <"$DIR/answers" >"$DIR/m.json"
	if [ "$(jq -r .parts "$DIR/m.json")" != "${#FDS[@]}" ]; then
		echo "scale.sh: $cmd: $(jq -r .parts "$DIR/m.json") of ${#FDS[@]} answers merged" >&2
		exit 1
	fi
	[ -z "${JSON_LOG:-}" ] || { printf '{"shape":"%s","command":"%s","merged":' "$SHAPE" "$cmd"; tr -d '\n' <"$DIR/m.json"; echo '}'; } >>"$JSON_LOG"
}
m() { jq -r "$1" "$DIR/m.json"; }
secs() { echo "${1%s}"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

wait_stable() { # until the subscribed clients stop growing for 3 s (or TIMEOUT)
	local last=-1 still=0 deadline=$((SECONDS + $(secs "$TIMEOUT")))
	while [ $SECONDS -lt $deadline ] && [ $still -lt 3 ]; do
		ask report
		if [ "$(m .ready)" = "$last" ]; then still=$((still + 1)); else still=0; fi
		last=$(m .ready)
		[ "$last" = "$(m .conns)" ] && return
		sleep 1
	done
}

wait_all() { # wait_all LABEL: until every client is subscribed (or TIMEOUT)
	ask "wait $TIMEOUT" $(($(secs "$TIMEOUT") + 30))
	if [ "$(m .ready)" != "$(m .conns)" ]; then
		row "$1" "only $(m .ready) of $(m .conns) subscribed after $TIMEOUT; errors $(m .errors): $(m .first_error)"
		return 1
	fi
}

peak_rss() { # the nodes' peak RSS (VmHWM) in MB, and Redis's
	local p out=()
	for p in "${NPIDS[@]}"; do out+=("$(($(rss_kb "$p" VmHWM) / 1024))"); done
	echo "nodes $(IFS=/; echo "${out[*]}") MB, Redis $(($(rss_kb "$RPID" VmHWM) / 1024)) MB"
}

NEW_SESSIONS=0
resumed_row() { # resumed_row LABEL: how the clients of the last storm came back
	if [ "$SERVER" = centrifugo ]; then
		row "$1" "$(m '"\(.resumes) of \(.losses) resumed in \(.resume_all_s * 100 | round / 100) s (p50 \(.resume_p50_ms | round) ms, p99 \(.resume_p99_ms | round) ms); recovered with publications \(.by_replay), recovered with none missed \(.by_synced), not recovered \(.by_snapshot); refused or failed dials \(.dial_failures) (busy: \(.busy // 0), full: \(.full // 0))\(.first_dial_error // "" | if . == "" then "" else " (the first: " + . + ")" end); gaps \(.gaps); errors \(.errors)\(.first_error // "" | if . == "" then "" else " (the first: " + . + ")" end)"')"
		return
	fi
	NEW_SESSIONS=$((NEW_SESSIONS + $(m .session_new)))
	row "$1" "$(m '"\(.resumes) of \(.losses) resumed in \(.resume_all_s * 100 | round / 100) s (p50 \(.resume_p50_ms | round) ms, p99 \(.resume_p99_ms | round) ms); by replay \(.by_replay), synced \(.by_synced), snapshot \(.by_snapshot); session kept \(.session_resumed), new \(.session_new); refused or failed dials \(.dial_failures) (busy: \(.busy // 0), full: \(.full // 0))\(.first_dial_error // "" | if . == "" then "" else " (the first: " + . + ")" end); gaps \(.gaps); errors \(.errors)\(.first_error // "" | if . == "" then "" else " (the first: " + . + ")" end)"')"
}

mark() { # mark SEQ: one marked write to every room, until all delivered (or 30 s)
	ask reset
	"$BIN" bench scale-mark "${SERVER_FLAG[@]}" --url "${URLS[0]}" $(printf -- "--sub-url %s " "${URLS[@]}") --rooms "$ROOMS" --room "$ROOM" --seq "$1" >/dev/null
	local deadline=$((SECONDS + 30))
	while ask report && [ "$(m .marks)" -lt "$CONNS" ] && [ $SECONDS -lt $deadline ]; do nap 0.2; done
	ask reset
	row "marked write $1 to each of $ROOMS rooms: delivered" "$(m '"\(.marks) of '"$CONNS"'; p50 \(.mark_p50_ms * 10 | round / 10) ms, p99 \(.mark_p99_ms * 10 | round / 10) ms, the last \(.mark_max_ms * 10 | round / 10) ms; connections by marks received \(.marks_per_conn | tojson)"')"
}

leases() { # leases LABEL: the session-bound keys in the store (none with Centrifugo)
	[ "$SERVER" = statecast ] || return 0
	ask leases
	row "$1" "$(m '"\(.lease_keys) of '"$CONNS"'\(.missing_keys // [] | if length > 0 then "; missing: " + join(", ") else "" end)"')"
}

# The nodes, then the clients.
redis
# Redis first: in a deployment it has a core of its own; here its one
# thread shares two with the nodes and the load tool, which, busy with a
# connect burst, starved it (commands of 10 µs took 500 µs) until the
# nodes' store calls timed out and their retries fed the burst.
renice -n -10 -p "$RPID" >/dev/null 2>&1 || echo "scale.sh: cannot raise Redis's priority (renice -10): a connect burst may starve it" >&2
URLS=() ADDRS=() NPIDS=()
for i in $(seq 0 $((NODES - 1))); do
	ADDRS[i]=127.0.0.1:$(port)
	URLS[i]=http://${ADDRS[i]}
	start_node "$i"
done
if [ "$SERVER" = centrifugo ]; then
	NODE_DESC="Centrifugo $("$CENTRIFUGO_BIN" version | awk '{ print $2 }') nodes (client.connection_limit $MAXC, file limit $FD_LIMIT)"
else
	NODE_DESC="nodes (--max-connections $MAXC, --max-connecting ${MAX_CONNECTING:-default}, file limit $FD_LIMIT)"
fi
row "run" "$(date -u +%FT%TZ), $SHAPE: $CONNS connections, $ROOMS rooms, $NODES $NODE_DESC, $PROCS client processes × $SOURCES source addresses, placement $PLACEMENT"
RSS0=()
for i in "${!NPIDS[@]}"; do RSS0[i]=$(rss_kb "${NPIDS[$i]}"); done
REDIS_RSS0=$(rss_kb "$RPID")
start_clients
wait_all "subscribed" || exit 1
row "all subscribed" "$(m '"in \(.subscribed_s * 100 | round / 100) s; refused or failed dials \(.dial_failures) (busy: \(.busy // 0), full: \(.full // 0))\(.first_dial_error // "" | if . == "" then "" else " (the first: " + . + ")" end); errors \(.errors)\(.first_error // "" | if . == "" then "" else " (the first: " + . + ")" end)"')"
ON=($(m '.conns_on_node[]'))
per=()
for i in "${!NPIDS[@]}"; do
	per+=("$(awk -v a="${RSS0[$i]}" -v b="$(rss_kb "${NPIDS[$i]}")" -v n="${ON[$i]:-0}" 'BEGIN { printf "%.1f", n ? (b - a) / n : 0 }')")
done
row "connections on each node" "$(IFS=/; echo "${ON[*]}")"
row "node RSS per connection (KiB)" "$(IFS=/; echo "${per[*]}")"
row "Redis RSS" "$((REDIS_RSS0 / 1024)) → $(($(rss_kb "$RPID") / 1024)) MB"
row "load tool RSS per connection" "$(m '.client_kb_per_conn * 10 | round / 10') KiB"
leases "session-bound keys, before the storms"

# Idle: nothing written.
c0=() c1=()
for p in "${NPIDS[@]}" "$RPID"; do c0+=("$(cpu_ticks "$p")"); done
t0=$(date +%s.%N)
sleep "$IDLE"
for p in "${NPIDS[@]}" "$RPID"; do c1+=("$(cpu_ticks "$p")"); done
t1=$(date +%s.%N)
idle=()
for i in "${!c0[@]}"; do idle+=("$(awk -v a="${c0[$i]}" -v b="${c1[$i]}" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.2f", (b - a) / (t1 - t0) }')"); done
row "idle CPU over $IDLE, % of a core: nodes / Redis" "$(IFS=/; echo "${idle[*]:0:$NODES}") / ${idle[$NODES]}"

mark 1

# Storm 1: the last node SIGKILLed; its clients resume on the others. The
# others may not hold them all (file limit): the rest wait for its restart.
k=$((NODES - 1))
ask reset
if [ "$SERVER" = centrifugo ]; then loads0=$(recovers); else loads0=$(metric statecast_room_loads_total); fi
kill -KILL "${NPIDS[$k]}"
sleep 1
if [ "$CONNS" -le $(((NODES - 1) * MAXC)) ]; then
	wait_all "SIGKILL node $((k + 1))" || true
else
	wait_stable # the others are full: everyone who fits is in
fi
row "SIGKILL node $((k + 1)): back before its restart" "$(m .ready) of $(m .conns) subscribed"
start_node "$k"
wait_all "SIGKILL node $((k + 1))" || true
resumed_row "SIGKILL node $((k + 1)): resumed"
if [ "$SERVER" = centrifugo ]; then
	row "… recoveries the nodes counted (centrifugo_client_recover)" "$(recover_delta "$loads0" "$(recovers)")"
	row "… peak RSS" "$(peak_rss)"
else
	row "… snapshot reads (room loads) of the nodes" "$(delta "$loads0" "$(metric statecast_room_loads_total)")"
	row "… peak RSS" "$(peak_rss)"
	sleep "$(($(secs "$NODE_TIMEOUT") * 2))" # the dead node's sessions are claimed by the others
	leases "… session-bound keys, $((2 * $(secs "$NODE_TIMEOUT"))) s later"
fi
mark 2

# Storm 2: a rolling SIGTERM restart, each node back before the next goes.
for i in "${!NPIDS[@]}"; do
	ask reset
	if [ "$SERVER" = centrifugo ]; then loads0=$(recovers); else loads0=$(metric statecast_room_loads_total); fi
	t0=$(date +%s.%N)
	stop "${NPIDS[$i]}"
	start_node "$i"
	wait_all "SIGTERM node $((i + 1))" || true
	resumed_row "SIGTERM node $((i + 1)) (stopped, restarted, all back: $(since "$t0") s)"
	if [ "$SERVER" = centrifugo ]; then
		row "… recoveries the nodes counted (centrifugo_client_recover)" "$(recover_delta "$loads0" "$(recovers)")"
	else
		row "… snapshot reads (room loads)" "$(delta "$loads0" "$(metric statecast_room_loads_total)")"
	fi
done
row "rolling restart: peak RSS" "$(peak_rss)"
leases "session-bound keys, after the storms"
if [ "$NEW_SESSIONS" -gt 0 ]; then
	# A resume answered with a new session leaves the old one to end after
	# its grace, and its key with it: count again once that has passed.
	sleep "$(($(secs "$LEASE_GRACE") + 2 * $(secs "$NODE_TIMEOUT")))"
	leases "… $NEW_SESSIONS resumes got a new session: the keys once their old sessions' grace passed"
fi
mark 3
# quit, not the end of input: the nodes restarted since hold the inputs open too.
for fd in "${FDS[@]}"; do echo quit >&"$fd"; done
for p in "${CPIDS[@]}"; do timeout 30 tail --pid="$p" -f /dev/null || true; done

# What the nodes warned about, restarts included.
if [ "$SERVER" = centrifugo ]; then
	# Centrifugo logs JSON lines when not on a terminal.
	while read -r n msg; do row "node log: $msg" "$n times"; done < <(cat "$DIR"/node-*.log 2>/dev/null |
		jq -rR 'fromjson? | select(.level == "warn" or .level == "error") | "\(.level): \(.message)"' | sort | uniq -c | sort -rn | head -n 8)
else
	while read -r n msg; do row "node log: $msg" "$n times"; done < <(cat "$DIR"/node-*.log 2>/dev/null |
		sed -n 's/.*level=\(WARN\|ERROR\) msg=\("[^"]*"\|[^ ]*\).*/\2/p' | sort | uniq -c | sort -rn | head -n 8)
fi

echo
printf '%s\n' "${ROWS[@]}" | column -t -s $'\t'
