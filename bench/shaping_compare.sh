#!/usr/bin/env bash
# The link emulation (token bucket in the transport) against the kernel's
# shaping (`tc tbf` on a veth pair between two network namespaces), on
# Voltage's traffic (issue 15): BERT on 2 devices, the terminal in namespace A
# and a worker daemon in B behind tbf at RATE, against the same two devices on
# loopback with `--link RATE,BURST` and no kernel shaping (BURST: tbf's, 64kb
# unless the environment sets BURST). Alternating rounds, the
# median of each side. Needs root, ip and tc; uses only addresses inside the
# namespaces it makes.
#   bash bench/shaping_compare.sh MODEL_DIR [ROUNDS] [RATES...]   e.g. build/models/bert-demo 3 100mbit 500mbit
set -euo pipefail
cd "$(dirname "$0")/.."
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
bin=$(realpath build/bin/tessera)
model=$(realpath "$1"); rounds=${2:-3}; shift; [ $# -gt 0 ] && shift
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(100mbit 500mbit)
burst=${BURST:-64kb}
[ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null || { echo "needs root, ip and tc" >&2; exit 2; }
a=tsc-a-$$ b=tsc-b-$$ va=tsca$$ vb=tscb$$
work=$(mktemp -d); pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.3; ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a"; ip netns add "$b"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$a"; ip link set "$vb" netns "$b"
ip -n "$a" addr add 10.232.0.1/24 dev "$va"; ip -n "$b" addr add 10.232.0.2/24 dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up; ip -n "$b" link set "$vb" up
# Shaping is what is compared, not TCP's restart of its window after each idle
# gap between layers (docs/comm.md); SLOW_START_AFTER_IDLE=1 keeps Linux's default.
for ns in "$a" "$b"; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle="${SLOW_START_AFTER_IDLE:-0}"; done
ids=$(seq -s, 1000 1127)
printf 'terminal = "tcp://10.232.0.1:7100"\nworkers = ["tcp://10.232.0.2:7070"]\n' >"$work/cluster.toml"
ip netns exec "$b" "$bin" worker --listen tcp://10.232.0.2:7070 --insecure --models "$(dirname "$model")" >"$work/d.log" 2>&1 &
pids+=($!)
sleep 1
median() { python3 -c "import json,sys; print(json.loads(sys.stdin.read())['latency_median_ms'])"; }
echo "rate,round,kernel_tbf_ms,emulated_ms,ratio"
for rate in "${rates[@]}"; do
  for ns_dev in "$a $va" "$b $vb"; do
    set -- $ns_dev
    tc -n "$1" qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  for r in $(seq "$rounds"); do
    k=$(ip netns exec "$a" "$bin" run --model "$model" --ids "$ids" --strategy voltage --cluster "$work/cluster.toml" \
          --insecure --warmup 1 --reps 5 --stats | median)
    e=$("$bin" run --model "$model" --ids "$ids" --strategy voltage --devices 2 --link "$rate,$burst" \
          --insecure --warmup 1 --reps 5 --stats | median)
    python3 -c "print('$rate,$r,%.2f,%.2f,%.3f' % ($k, $e, $e / $k))"
  done
done
