#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each, from its seed corpus (fuzz/corpus/<target>,
# left as it is: new inputs go to a scratch directory). Fails on any crash, leak, timeout (an
# input running longer than FUZZ_TIMEOUT s, default 10: a hang) or broken invariant;
# libFuzzer's reproducer is kept under fuzz/artifacts/<target>/ (replay one with
# `cargo +nightly fuzz run <target> <file>`).
#
#   scripts/fuzz.sh [SECONDS]                       # all targets, SECONDS each (CI: 20)
#   FUZZ_TARGETS="virtio_queues desc_chain" scripts/fuzz.sh 3600
#
# Targets: http_parser, api_request, config_file (the API and configuration), virtio_queues,
# virtio_mmio, desc_chain (the device; they assert their own time bounds: 100 ms per datapath
# call, 2 s per reset), ctrl_command (the control queue's command parser), packed_ring (the packed virtqueue),
# vhost_user (a hostile vhost-user frontend's messages to the backend).
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "$0")/.." && pwd)"
read -r -a targets <<<"${FUZZ_TARGETS:-http_parser api_request config_file virtio_queues virtio_mmio desc_chain ctrl_command packed_ring vhost_user}"
timeout="${FUZZ_TIMEOUT:-10}"

cd "$root"
cargo +nightly fuzz build
bin_dir="${CARGO_TARGET_DIR:-$root/fuzz/target}/x86_64-unknown-linux-gnu/release"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
status=0
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "fuzz/artifacts/$target"
    echo "== $target: ${seconds}s"
    if ! "$bin_dir/$target" "$scratch/$target" "fuzz/corpus/$target" \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout="$timeout" -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$target/" 2>"$scratch/$target.log"; then
        tail -n 40 "$scratch/$target.log"
        echo "== $target: FAILED (reproducer under fuzz/artifacts/$target/)"
        status=1
        continue
    fi
    runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$' || true)"
    per_sec="$(grep -o 'exec/s: [0-9]*' "$scratch/$target.log" | tail -n 1 | grep -o '[0-9]*$' || true)"
    echo "== $target: ok, ${runs:-?} executions (${per_sec:-?}/s)"
done
exit "$status"
