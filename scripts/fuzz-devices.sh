#!/usr/bin/env bash
# Runs each device fuzz target (fuzz/: virtio_queues, virtio_mmio, desc_chain) for SECONDS
# (default 60) from its committed seed corpus, and fails on a crash, a failed invariant, a leak or
# a hang (an input running longer than the per-input timeout). Needs the nightly toolchain and
# cargo-fuzz (`cargo install cargo-fuzz`).
#
#   scripts/fuzz-devices.sh [SECONDS]          # every device target, SECONDS each
#   FUZZ_TARGETS="desc_chain" scripts/fuzz-devices.sh 3600
#   FUZZ_JOBS=2 scripts/fuzz-devices.sh 3600   # long runs: libFuzzer workers per target
#
# New corpus entries go to fuzz/corpus/<target>/ (ignored by git; seeds are named seed-*).
# Crash and timeout reproducers go to fuzz/artifacts/<target>/; replay one with
#   cargo +nightly fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
targets=(${FUZZ_TARGETS:-virtio_queues virtio_mmio desc_chain})
jobs=${FUZZ_JOBS:-1}
# Per-input bound: the targets assert far tighter bounds themselves (100 ms per datapath call,
# 2 s per reset); this catches a hang that never returns to those checks.
timeout=${FUZZ_TIMEOUT:-10}

cargo +nightly fuzz build
status=0
for t in "${targets[@]}"; do
	echo "== fuzz $t for ${secs}s (timeout ${timeout}s per input)"
	mkdir -p "corpus/$t"
	log=$(mktemp)
	extra=()
	if [ "$jobs" -gt 1 ]; then
		extra=(-jobs="$jobs" -workers="$jobs")
	fi
	if cargo +nightly fuzz run "$t" "corpus/$t" -- \
		-max_total_time="$secs" -timeout="$timeout" -print_final_stats=1 "${extra[@]}" \
		>"$log" 2>&1; then
		grep -E '^(Done|stat::number_of_executed_units|stat::average_exec_per_sec)' "$log" || true
	else
		echo "!! $t failed:"
		grep -vE '^(#[0-9]+|\s*NEW_FUNC|"|INFO:)' "$log" | tail -n 60
		status=1
	fi
	rm -f "$log"
done
exit $status
