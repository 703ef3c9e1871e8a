#!/usr/bin/env bash
# The device against a host side faster than the guest, in real VMs (driver guest, ring=3,
# 64 B): what docs/cotune.md ("The seeds' regimes") reports. Alternated rounds of
#   tx   -- the bare non-blocking write loop on a tap (stack and xdp-drop), then the guest's
#           tx=N (lazy, kick_threshold=64) on that tap (stack, xdp-drop), on backend=sink, on
#           backend=sink,busy_poll_us=50, on the same with the poll sleeping 10 µs between
#           looks (busy_poll_sleep_us=10), and on backend=sink with kick coalescing instead
#           (kick_coalesce_packets=192,kick_coalesce_usecs=50; no busy-poll);
#   fwd  -- echo on the tap with a host peer (cotune), then fwd=N window=256 through
#           backend=loop plain, with busy_poll_us=50 and with kick coalescing
#           (kick_coalesce_packets=64,kick_coalesce_usecs=20) (xdp_bulk 1 and 16, clean-from-rx),
#           the guest halting for interrupts (wait=halt) and polling its rings (wait=poll);
#   kick -- tx=N on backend=sink for kick_threshold 1,3,5,8,13,64 x busy_poll_us 0,10,50,200.
# Prints one line per run and /proc/loadavg after each round. As root, on an idle machine.
#
# Usage: scripts/regimes.sh [--rounds R] [--frames N] [tx|fwd|kick]...   (default: all three)
# (--frames 20000000 measures the tx steady state, as docs/benchmarks.md does; the default
# 3 M keeps a whole run short.)
set -euo pipefail
ROOT=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
rounds=3 frames=3000000 parts=()
while (($#)); do
	case $1 in
	--rounds) rounds=$2; shift 2 ;;
	--frames) frames=$2; shift 2 ;;
	tx | fwd | kick) parts+=("$1"); shift ;;
	*) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
	esac
done
((${#parts[@]})) || parts=(tx fwd kick)
cd "$ROOT"
cargo build --release --quiet -p vmm -p cotune
guest=$(bash resources/build-guest.sh --driver-guest-only | sed -n 's/^driver_guest=//p')
ns=vmmregimes-$$
xdp=""
cleanup() {
	[[ -n $xdp ]] && kill "$xdp" 2>/dev/null || true
	ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT

# run NET [xdp] -- ARGS...: one driver guest; prints "status pps kicks/frame".
run() {
	local net=$1 prog=$2
	shift 3
	local pre=()
	if [[ $net == tap=* ]]; then
		ip netns add "$ns"
		ip -n "$ns" link set lo up
		ip -n "$ns" tuntap add rtap0 mode tap vnet_hdr
		ip -n "$ns" link set rtap0 up
		pre=(ip netns exec "$ns")
		if [[ $prog != - ]]; then
			target/release/tap-xdp --netns "$ns" rtap0 "$prog" >/dev/null 2>&1 &
			xdp=$!
			sleep 0.3
		fi
	fi
	# The report is parsed after the VM exits: an interpreter starting beside the run would
	# take CPU from its first ~50 ms.
	local out
	out=$("${pre[@]}" target/release/vmm --kernel "$guest" --net "$net" \
		--cmdline "console=ttyS0 ring=3 timeout_ms=60000 $*" 2>/dev/null) || true
	python3 -c 'import json,sys
d=next((json.loads(l)["driver"] for l in sys.stdin if l.startswith("{\"driver\"")),{})
print(d.get("status"), d.get("pps"), round(d.get("kicks",0)/max(d.get("done",0),1),4))' <<<"$out"
	cleanup
	xdp=""
}

bare() {
	local csv
	csv=$(mktemp)
	target/release/cotune baseline --backend tap --host-path "$1" --duration 2 --repeat 1 \
		--frame-size 64 --csv "$csv" >/dev/null 2>&1
	awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "pps") c = i } NR == 2 { print $c }' "$csv"
	rm -f "$csv"
}

for r in $(seq "$rounds"); do
	for part in "${parts[@]}"; do
		case $part in
		tx)
			tx="tx=$frames size=64 kick_threshold=64 tx_completion=lazy"
			echo "$r bare-write stack $(bare stack)"
			echo "$r bare-write xdp-drop $(bare xdp-drop)"
			echo "$r tap stack $(run tap=rtap0 - -- $tx)"
			echo "$r tap xdp-drop $(run tap=rtap0 drop -- $tx)"
			echo "$r sink $(run backend=sink - -- $tx)"
			echo "$r sink busy_poll_us=50 $(run backend=sink,busy_poll_us=50 - -- $tx)"
			echo "$r sink busy_poll_us=50,busy_poll_sleep_us=10 $(run \
				backend=sink,busy_poll_us=50,busy_poll_sleep_us=10 - -- $tx)"
			echo "$r sink kick_coalesce_packets=192,kick_coalesce_usecs=50 $(run \
				backend=sink,kick_coalesce_packets=192,kick_coalesce_usecs=50 - -- $tx)"
			;;
		fwd)
			csv=$(mktemp)
			target/release/cotune --target vm --repeat 1 --backend tap --quick --csv "$csv" \
				seed-xdp-bulk >/dev/null 2>&1
			echo "$r echo-on-tap $(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "pps") c = i; if ($i == "value") v = i } }
				NR > 1 { printf "B=%s:%s ", $v, $c }' "$csv")"
			rm -f "$csv"
			for net in backend=loop backend=loop,busy_poll_us=50 \
				backend=loop,kick_coalesce_packets=64,kick_coalesce_usecs=20; do
				for wait in halt poll; do
					for b in 1 16; do
						echo "$r $net wait=$wait B=$b $(run "$net" - -- fwd="$frames" window=256 \
							size=64 xdp_bulk=$b tx_completion=clean-from-rx wait=$wait)"
					done
				done
			done
			;;
		kick)
			for bp in 0 10 50 200; do
				for n in 1 3 5 8 13 64; do
					echo "$r sink busy_poll_us=$bp N=$n $(run backend=sink,busy_poll_us=$bp - -- \
						tx="$frames" size=64 kick_threshold=$n tx_completion=lazy)"
				done
			done
			;;
		esac
	done
	echo "# loadavg $(cat /proc/loadavg)"
done
