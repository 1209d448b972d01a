#!/usr/bin/env bash
# Live-capture demo (run by `make demo` after the offline one): a veth pair whose far end sits in a
# network namespace this script owns; the bundled sample traffic is replayed into it with tcpreplay
# and captured by `dnsprobe capture` with 2 workers (1 on a one-core machine). The namespace and the
# pair are removed at the end, whatever happens.
#   usage: contrib/live-demo.sh [DNSPROBE] [SAMPLE] [OUT_DIR]
set -euo pipefail
DNSPROBE=${1:-dnsprobe}
SAMPLE=${2:-samples/sample-mix.pcap.xz}
OUT=${3:-demo-out/live}

if [ "$(id -u)" -ne 0 ]; then
  echo "== live capture demo skipped: it needs root (packet sockets, a network namespace); the offline demo above ran"
  exit 0
fi
if ! command -v tcpreplay >/dev/null 2>&1; then
  echo "== installing tcpreplay (Debian package) for the live demo"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq tcpreplay >/dev/null
fi

TAG=$$
NS=dnsprobe-demo$TAG
IF=dpd$TAG
PEER=dpe$TAG
WORK=$(mktemp -d)
PROBE=
cleanup() {
  [ -n "$PROBE" ] && kill "$PROBE" 2>/dev/null && wait "$PROBE" 2>/dev/null
  ip netns del "$NS" 2>/dev/null || true
  ip link del "$IF" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

ip netns add "$NS"
ip link add "$IF" type veth peer name "$PEER" netns "$NS"
ip link set "$IF" up
ip -n "$NS" link set "$PEER" up
xz -dc "$SAMPLE" > "$WORK/sample.pcap"

mkdir -p "$OUT" && rm -f "$OUT"/*
MASK=0x3
[ "$(nproc)" -ge 2 ] || MASK=0x1
echo "== dnsprobe capture -i $IF --coremask $MASK -o $OUT   (veth $IF <-> $PEER in namespace $NS)"
"$DNSPROBE" capture -i "$IF" --coremask "$MASK" -o "$OUT" --no-progress &
PROBE=$!
for _ in $(seq 100); do ls "$OUT"/*.stats.json >/dev/null 2>&1 && break; sleep 0.1; done
echo "== tcpreplay --pps=20000 $(basename "$SAMPLE") into $PEER"
ip netns exec "$NS" tcpreplay -q --pps=20000 --intf1="$PEER" "$WORK/sample.pcap" | grep -E "^Actual|Successful" || true
sleep 1.5
echo "== SIGTERM: the workers write their pending transactions and close their files"
kill -TERM "$PROBE"
wait "$PROBE"
PROBE=
echo "== files written (one or more per worker: .w0, .w1)"
ls -l "$OUT"
echo "== a few records"
"$DNSPROBE" inspect "$OUT"/*.parquet --limit 5
