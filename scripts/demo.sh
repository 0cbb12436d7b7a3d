#!/usr/bin/env bash
# The sluice demo: a UDP service in one network namespace, flooded from another
# over a veth pair, first without sluice, then with `sluice run` at a static
# limit, then with `sluice run` picking the rate itself (rate=auto). Everything it creates (namespaces, veth, processes) is removed on exit,
# on error and on Ctrl-C. Traffic stays inside the two namespaces.
#
#   scripts/demo.sh [SLUICE_BINARY]
# Environment: DEMO_SECS (per phase, default 5), WORK_NS (service cost per
# datagram, default 4000), LIMIT (the gate's static limit, default 110k: a little
# under what this service delivers on one core of the reference VM).
set -euo pipefail

BIN=${1:-target/release/sluice}
SECS=${DEMO_SECS:-5}
WORK_NS=${WORK_NS:-4000}
LIMIT=${LIMIT:-110k}
PORT=7000
A=sluice-demo-$$-a
B=sluice-demo-$$-b
TMP=$(mktemp -d)
PIDS=()

cleanup() {
    for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$A" 2>/dev/null || true
    ip netns del "$B" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || { echo "demo: run as root (it creates network namespaces and attaches XDP)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "demo: $BIN not found; run 'make build' first" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "demo: needs 2 CPUs (one generates load, one is the victim)" >&2; exit 1; }

echo "== testbed: namespaces $A (sender, CPU 0) and $B (service, CPU 1), veth va <-> vb"
ip netns add "$A"
ip netns add "$B"
ip -n "$A" link add va type veth peer name vb netns "$B"
ip -n "$A" addr add 10.77.0.1/24 dev va
ip -n "$B" addr add 10.77.0.2/24 dev vb
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set va up
ip -n "$B" link set vb up
# The "NIC model": the victim's IP/UDP stack runs on CPU 1 (RPS), beside the
# service, while the driver-level receive work stays on the sender's CPU.
ip netns exec "$B" sh -c 'echo 2 > /sys/class/net/vb/queues/rx-0/rps_cpus'

run_phase() { # $1 = label, $2 = command to run halfway through the flood, $3 = command to run once the service listens (both optional)
    ip netns exec "$B" taskset -c 1 "$BIN" serve udp-echo --port $PORT --work-ns "$WORK_NS" --no-echo \
        --duration "$((SECS + 3))" --json > "$TMP/serve.json" &
    local serve=$!
    PIDS+=("$serve")
    sleep 0.5
    if [ -n "${3:-}" ]; then eval "$3"; fi
    ip netns exec "$A" taskset -c 0 "$BIN" send --dst 10.77.0.2:$PORT --rate 0 --duration "$SECS" --flows 16 --json > "$TMP/send.json" &
    local send=$!
    PIDS+=("$send")
    if [ -n "${2:-}" ]; then sleep "$((SECS / 2)).5"; eval "$2"; fi
    wait "$send"
    wait "$serve" || true
    python3 - "$1" "$TMP/send.json" "$TMP/serve.json" <<'PY'
import json, sys
label, send, serve = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
offered = send["sent"] / send["secs"]
rate = serve["received"] / send["secs"]
print(f"{label:<34} offered {offered/1e3:8.1f}k pkt/s   service delivered {rate/1e3:8.1f}k pkt/s")
open(sys.argv[3] + ".rate", "w").write(str(rate))
PY
}

echo "== the service spends ${WORK_NS} ns per datagram on CPU 1; the flood is as fast as one socket sender goes"
run_phase "without sluice"
cp "$TMP/serve.json.rate" "$TMP/off.rate"

# Start `sluice run` with one class ($1, a --class spec) on statistics socket $2; GATE is its pid.
start_gate() {
    ip netns exec "$B" "$BIN" run --iface vb --class "$1" --socket "$2" --metrics off > "$2.out" 2> "$2.err" &
    GATE=$!
    PIDS+=("$GATE")
    for _ in $(seq 100); do [ -S "$2" ] && break; sleep 0.1; done
    [ -S "$2" ] || { cat "$2.err" >&2; exit 1; }
}

# One flood with the daemon: $1 label, $2 class spec, $3 output rate file, $4 "after" to start
# the daemon once the service listens (rate=auto finds the service by its socket).
gated_phase() {
    local sock="$TMP/$(basename "$3" .rate).sock"
    local status="echo '== sluice status, during the flood'; ip netns exec $B $BIN status --socket $sock"
    echo "== sluice run --iface vb --class '$2'"
    if [ "${4:-}" = after ]; then
        run_phase "with sluice ($1)" "$status" "start_gate '$2' '$sock'" > "$TMP/phase.out"
    else
        start_gate "$2" "$sock"
        run_phase "with sluice ($1)" "$status" > "$TMP/phase.out"
    fi
    grep -v "^with sluice" "$TMP/phase.out"
    grep "^with sluice" "$TMP/phase.out"
    cp "$TMP/serve.json.rate" "$3"
    kill -TERM "$GATE"
    wait "$GATE" || true
}

gated_phase "static $LIMIT" "svc:rate=$LIMIT,match=udp:$PORT" "$TMP/on.rate"
gated_phase "rate=auto" "svc:rate=auto,match=udp:$PORT" "$TMP/auto.rate" after

python3 - "$TMP/off.rate" "$TMP/on.rate" "$TMP/auto.rate" <<'PY'
import sys
off, on, auto = (float(open(p).read()) for p in sys.argv[1:4])
print(f"\n== delivered: {off/1e3:.1f}k pkt/s without sluice, {on/1e3:.1f}k pkt/s with sluice static "
      f"({on/max(off,1):.2f}x), {auto/1e3:.1f}k pkt/s with rate=auto ({auto/max(off,1):.2f}x)")
PY
