#!/usr/bin/env bash
# The device's efficiency in a real VM: the driver guest (ring=3: its datapath runs natively
# through real ioeventfds and irqfds) transmits N 64-byte frames with tx_completion=lazy, and its
# pps is divided by a bare tap write loop's (`cotune baseline --backend tap`) measured right
# before it. Prints one line per pair and the medians; records /proc/loadavg.
#
# Usage (as root, from anywhere): scripts/vm-tx-ratio.sh [--repeats R] [--frames N] [--mode MODE]
#                                  [--workload tx|echo] [--vmm PATH] [--transport mmio|pci]
#                                  [--bare write|writev]
#   --repeats  pairs to run (default 5)    --frames  frames per VM run (default 300000)
#   --mode     tx_completion (default lazy) --vmm    the vmm binary (default: build this tree's)
#   --workload tx (default) or echo (the host sends, at most 64 frames in flight; the ratio is
#              then of the echo pps to the bare write loop's)
#   --bare     the bare loop's system call: write (default, the cheapest) or writev (one iovec)
# Measure on an idle machine: a build beside it changes the figures by several times.
set -euo pipefail
ROOT=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
repeats=5 frames=300000 mode=lazy workload=tx vmm="" transport=mmio bare=write
while (($#)); do
	case $1 in
	--repeats) repeats=$2 ;;
	--frames) frames=$2 ;;
	--mode) mode=$2 ;;
	--workload) workload=$2 ;;
	--vmm) vmm=$2 ;;
	--transport) transport=$2 ;;
	--bare) bare=$2 ;;
	*) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
	esac
	shift 2
done
cd "$ROOT"
cargo build --release --quiet -p cotune --bin cotune
if [[ -z $vmm ]]; then
	cargo build --release --quiet -p vmm --bin vmm
	vmm=target/release/vmm
fi
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
echo "# loadavg $(cat /proc/loadavg)"
echo "pair,bare_${bare}_pps,vm_pps,ratio"
ratios=() bases=() vms=()
for i in $(seq "$repeats"); do
	target/release/cotune baseline --backend tap --baseline-syscall "$bare" --duration 2 --repeat 1 \
		--frame-size 64 --csv "$csv" >/dev/null 2>&1
	# The pps column, found by its header name.
	base=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "pps") c = i } NR == 2 { print $c }' "$csv")
	vm=$(guest/baremetal/sweep.sh --workload "$workload" --ring 3 --frames "$frames" --size 64 \
		--kick-thresholds 8 --modes "$mode" --event-idx 1 --transport "$transport" --vmm "$vmm" | awk -F, 'NR == 2 { print $11 }')
	ratio=$(python3 -c "print(round($vm / $base, 3))")
	echo "$i,$base,$vm,$ratio"
	ratios+=("$ratio") bases+=("$base") vms+=("$vm")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "# median: bare $bare $(median "${bases[@]}") pps, VM $(median "${vms[@]}") pps, ratio $(median "${ratios[@]}")"
echo "# loadavg $(cat /proc/loadavg)"
