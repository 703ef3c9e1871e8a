#!/usr/bin/env bash
# Guest boot time: boots the test guest (ELF vmlinux + initramfs from resources/build-guest.sh)
# N times (default 5) with the release `vmm` and prints, per run and as min/median:
#   init    process start -> the guest's "vmm-guest: init started" (first line of /init)
#   exit    process start -> the VMM's exit after the guest's `reboot -f`
#   vmm     the VMM's own start-up: process start (before exec) -> the first KVM_RUN, from the
#           vmm's "first KVM_RUN" log line (wall clock, so it includes exec and dynamic loading)
#   main    the same from the start of main() (the log line's own figure)
#   load    /proc/loadavg (1-minute figure) just before the run
# The guest runs `vmm.run=poweroff` (/init prints its marker, then reboots at once).
#
# Usage: scripts/boot-time.sh [N]
# Environment: CARGO_TARGET_DIR (default: target/ in the repository), BOOT_TIME_MEM (MiB, default:
#   the VMM's default), BOOT_TIME_CMDLINE (extra kernel command-line words, e.g. initcall_debug),
#   BOOT_TIME_KEEP=DIR (keep each run's console and log there), BOOT_TIME_NO_BUILD=1 (use the
#   existing release binary and the cached guest; fails when they are missing),
#   BOOT_TIME_KERNEL=PATH (boot this kernel instead of the cached one, e.g. an older config's),
#   BOOT_TIME_NET=SPEC (add `--net SPEC`, e.g. `tap=bt0,transport=pci`: the guest probes the
#   device at boot; run the script inside a network namespace, `ip netns exec NS ...`, so that
#   the tap the VMM creates is not in the host's namespace).
#
# Boot times depend on the other load on the host's cores: run it on an idle machine (no build
# beside it), and compare the load column.
set -euo pipefail

N=${1:-5}
[[ $N =~ ^[1-9][0-9]*$ ]] || {
	echo "usage: $0 [N]" >&2
	exit 2
}
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
VMM=$CARGO_TARGET_DIR/release/vmm

if [[ ${BOOT_TIME_NO_BUILD:-0} != 1 ]]; then
	(cd "$ROOT" && cargo build --release -q -p vmm --bin vmm) >&2
	guest_flags=()
else
	guest_flags=(--print)
fi
declare -A art
while IFS='=' read -r k v; do art[$k]=$v; done < <(
	"$ROOT/resources/build-guest.sh" --kernel-only "${guest_flags[@]}"
	"$ROOT/resources/build-guest.sh" --initrd-only "${guest_flags[@]}"
)
KERNEL=${BOOT_TIME_KERNEL:-${art[kernel]:?no kernel from build-guest.sh}}
INITRD=${art[initrd]:?no initrd from build-guest.sh}
[[ -x $VMM ]] || {
	echo "boot-time: $VMM not found" >&2
	exit 1
}

CMDLINE="console=ttyS0 reboot=k panic=-1 quiet vmm.run=poweroff${BOOT_TIME_CMDLINE:+ $BOOT_TIME_CMDLINE}"
args=(--kernel "$KERNEL" --initrd "$INITRD" --cmdline "$CMDLINE")
[[ -n ${BOOT_TIME_MEM:-} ]] && args+=(--mem-size "$BOOT_TIME_MEM")
[[ -n ${BOOT_TIME_NET:-} ]] && args+=(--net "$BOOT_TIME_NET")

tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
keep=${BOOT_TIME_KEEP:-}
[[ -z $keep ]] || mkdir -p -- "$keep"

echo "kernel: $KERNEL ($(stat -c %s "$KERNEL") bytes)"
echo "initrd: $INITRD ($(stat -c %s "$INITRD") bytes)"
echo "vmm:    $VMM"
echo "cmdline: $CMDLINE${BOOT_TIME_MEM:+, ${BOOT_TIME_MEM} MiB}${BOOT_TIME_NET:+, --net $BOOT_TIME_NET}"
printf '%-4s %8s %8s %9s %9s  %s\n' run init/s exit/s vmm/ms main/ms loadavg

# seconds (decimal) -> microseconds (integer), without floating point in bash
us() {
	local s=${1%.*} f=${1#*.}
	[[ $1 == *.* ]] || f=0
	f=${f}000000
	echo $((10#$s * 1000000 + 10#${f:0:6}))
}

ok=0
for ((i = 1; i <= N; i++)); do
	load=$(cut -d' ' -f1-3 /proc/loadavg)
	# The start time is taken in the subshell that then execs the vmm: nothing but exec between.
	(
		echo "$EPOCHREALTIME" >"$tmp/t0"
		exec "$VMM" "${args[@]}" 2>"$tmp/stderr" </dev/null
	) | while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$tmp/console" &&
		rc=0 || rc=$?
	t_end=$EPOCHREALTIME
	t0=$(<"$tmp/t0")
	if [[ -n $keep ]]; then
		cp -- "$tmp/console" "$keep/console.$i"
		cp -- "$tmp/stderr" "$keep/stderr.$i"
	fi
	t_init=$(awk '/vmm-guest: init started/ { print $1; exit }' "$tmp/console")
	first_run=$(sed -n 's/.*first KVM_RUN: \([0-9.]*\) ms after the VMM started (unix time \([0-9.]*\)).*/\1 \2/p' "$tmp/stderr" | head -n1)
	if ((rc != 0)) || [[ -z $t_init || -z $first_run ]]; then
		echo "boot-time: run $i failed (exit $rc); stderr:" >&2
		tail -n 20 "$tmp/stderr" >&2
		exit 1
	fi
	read -r main_ms t_run <<<"$first_run"
	b=$(us "$t0")
	init_us=$(($(us "$t_init") - b))
	exit_us=$(($(us "$t_end") - b))
	vmm_us=$(($(us "$t_run") - b))
	printf '%-4s %8.3f %8.3f %9.3f %9s  %s\n' "$i" "$(bc <<<"scale=6; $init_us/1000000")" \
		"$(bc <<<"scale=6; $exit_us/1000000")" "$(bc <<<"scale=3; $vmm_us/1000")" "$main_ms" "$load"
	echo "$init_us $exit_us $vmm_us $main_ms" >>"$tmp/results"
	ok=$((ok + 1))
done

# min and median (the lower middle value for an even N) of column $1
stat_col() {
	sort -g <(awk -v c="$1" '{ print $c }' "$tmp/results") |
		awk '{ v[NR] = $1 } END { printf "%s %s", v[1], v[int((NR + 1) / 2)] }'
}
read -r init_min init_med <<<"$(stat_col 1)"
read -r exit_min exit_med <<<"$(stat_col 2)"
read -r vmm_min vmm_med <<<"$(stat_col 3)"
read -r main_min main_med <<<"$(stat_col 4)"
printf 'min  %8.3f %8.3f %9.3f %9s\n' "$(bc <<<"scale=6; $init_min/1000000")" \
	"$(bc <<<"scale=6; $exit_min/1000000")" "$(bc <<<"scale=3; $vmm_min/1000")" "$main_min"
printf 'med  %8.3f %8.3f %9.3f %9s\n' "$(bc <<<"scale=6; $init_med/1000000")" \
	"$(bc <<<"scale=6; $exit_med/1000000")" "$(bc <<<"scale=3; $vmm_med/1000")" "$main_med"
echo "($ok runs; loadavg after: $(cut -d' ' -f1-3 /proc/loadavg))"
