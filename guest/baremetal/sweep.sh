#!/usr/bin/env bash
# Sweep the driver knobs inside a real VM: boots driver-guest once per point of the grid
# (kick_threshold x tx_completion x event_idx) on a tap in a fresh network namespace and prints
# one CSV line per run: the in-guest pps and the kicks and interrupts per frame, from the
# guest's counters and the VMM's device metrics.
#
# Usage (as root, from the repository root):
#   guest/baremetal/sweep.sh [--workload tx|echo] [--ring 0|3] [--frames N] [--size BYTES]
#                            [--kick-thresholds "1 8 64"] [--modes "tx-interrupt lazy"]
#                            [--event-idx "0 1"] [--extra "xdp_bulk=16 wait=poll"]
#                            [--transport mmio|pci] > sweep.csv
#
# `--transport pci` puts the device on virtio-pci with MSI-X (`--net tap=…,transport=pci`, and
# `transport=pci` on the guest's command line; default mmio).
# Defaults: tx, ring 3, 200000 frames of 64 bytes, kick thresholds 1 2 4 8 16 32 64, all three
# tx completion modes, EVENT_IDX on and off. The echo workload needs a host peer: a small
# python3 AF_PACKET sender/receiver runs in the namespace (at most 64 frames in flight).
#
# On a host whose KVM runs guest kernel mode natively, `--ring 0` measures the driver as a
# kernel driver would run; on KVM's PVM module (kernel mode emulated at ~2 M instructions/s)
# only `--ring 3` numbers mean anything, and `--ring 0` runs want `--frames 2000`.
set -euo pipefail

ROOT=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
workload=tx ring=3 frames=200000 size=64
kts="1 2 4 8 16 32 64" modes="tx-interrupt clean-from-rx lazy" evs="1 0" extra="" transport=mmio
vmm=$ROOT/target/release/vmm guest=""
while (($#)); do
	case $1 in
	--workload) workload=$2 ;;
	--ring) ring=$2 ;;
	--frames) frames=$2 ;;
	--size) size=$2 ;;
	--kick-thresholds) kts=$2 ;;
	--modes) modes=$2 ;;
	--event-idx) evs=$2 ;;
	--extra) extra=$2 ;;
	--transport) transport=$2 ;;
	--vmm) vmm=$2 ;;
	--guest) guest=$2 ;;
	*)
		sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
		exit 2
		;;
	esac
	shift 2
done
[[ $workload == tx || $workload == echo ]] || { echo "sweep: --workload tx|echo" >&2; exit 2; }
if [[ -z $guest ]]; then
	guest=$(bash "$ROOT/resources/build-guest.sh" --driver-guest-only | sed -n 's/^driver_guest=//p')
fi
[[ -x $vmm ]] || (cd "$ROOT" && cargo build --release --quiet -p vmm --bin vmm)

ns=vmmsweep-$$
tap=sweeptap0
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT

# The echo workload's host side: sends FRAMES frames (at most 64 in flight), counts the echoes.
peer=$(mktemp --suffix=.py)
cat >"$peer" <<'EOF'
import select, socket, struct, sys
tap, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x88b5))
s.bind((tap, 0x88b5))
src = bytes.fromhex(open(f"/sys/class/net/{tap}/address").read().strip().replace(":", ""))
def frame(seq):
    head = bytes.fromhex("02000000000b") + src + struct.pack(">H", 0x88b5) + struct.pack("<IH", seq, size)
    return head + bytes((seq + i) & 0xff for i in range(20, size))
sent = got = 0
while got < n:
    while sent < n and sent - got < 64:
        s.send(frame(sent))
        sent += 1
    if not select.select([s], [], [], 10)[0]:
        break
    _, addr = s.recvfrom(65536)
    if addr[2] != socket.PACKET_OUTGOING:
        got += 1
EOF
trap 'cleanup; rm -f "$peer"' EXIT

echo "ring,workload,size,kick_threshold,tx_completion,event_idx,extra,status,frames,elapsed_ms,pps,kicks_per_frame,kicks_suppressed,irqs_taken_per_frame,irqfd_signals,dev_tx_irqs,dev_rx_irqs"
for ev in $evs; do
	for mode in $modes; do
		for kt in $kts; do
			cleanup
			ip netns add "$ns"
			ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
			ip -n "$ns" link set lo up
			ip -n "$ns" tuntap add "$tap" mode tap vnet_hdr
			ip -n "$ns" link set "$tap" up
			cmdline="console=ttyS0 $workload=$frames size=$size ring=$ring kick_threshold=$kt tx_completion=$mode event_idx=$ev timeout_ms=300000 transport=$transport $extra"
			out=$(mktemp) err=$(mktemp)
			ip netns exec "$ns" "$vmm" --kernel "$guest" --net "tap=$tap,transport=$transport" --cmdline "$cmdline" >"$out" 2>"$err" &
			pid=$!
			if [[ $workload == echo ]]; then
				for _ in $(seq 100); do grep -q 'driver-guest: ready' "$out" && break; sleep 0.1; done
				ip netns exec "$ns" python3 "$peer" "$tap" "$frames" "$size" || true
			fi
			wait "$pid" || true
			python3 - "$out" "$err" "$tap" "$extra" <<'EOF'
import json, sys
out, err, tap, extra = sys.argv[1:5]
d = next((json.loads(l)["driver"] for l in open(out) if l.startswith('{"driver":')), {})
m = next((json.loads(l) for l in reversed(open(err).readlines()) if l.startswith('{"net":')), {})
dev = m.get("net", {}).get(tap, {})
f = max(d.get("done", 0), 1)
print(",".join(str(x) for x in [
    d.get("ring"), d.get("workload"), d.get("size"), d.get("kick_threshold"), d.get("tx_completion"),
    d.get("event_idx"), extra.replace(",", ";"), d.get("status"), d.get("done"),
    round(d.get("elapsed_ns", 0) / 1e6, 1), d.get("pps"), round(d.get("kicks", 0) / f, 4),
    d.get("kicks_suppressed"), round(d.get("irqs_taken", 0) / f, 4), dev.get("irqfd_signals"),
    dev.get("tx", {}).get("interrupts_raised"), dev.get("rx", {}).get("interrupts_raised")]))
EOF
			rm -f "$out" "$err"
		done
	done
done
