#!/usr/bin/env bash
# Boots the demo guest with networking: builds the guest kernel and initramfs on first use
# (cached outside the clone; 3–5 min the first time on 2 cores), builds vmm, creates a network
# namespace `vmm-demo` holding the tap `vmmdemo0` (10.200.0.1/24), and runs the guest there with
# a virtio-net device on that tap. The guest brings eth0 up as 10.200.0.2, pings the host,
# prints "vmm-guest: done" and reboots, which ends the VMM; the namespace is then removed.
# Needs root (network namespace, tap) and /dev/kvm.
#
#   scripts/demo.sh [extra vmm flags...]    e.g. --metrics-interval 2
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ns=vmm-demo tap=vmmdemo0
artefacts=$(bash "$root/resources/build-guest.sh")
kernel=$(sed -n 's/^kernel=//p' <<<"$artefacts")
initrd=$(sed -n 's/^initrd=//p' <<<"$artefacts")
cargo build --release --quiet --manifest-path "$root/Cargo.toml" --bin vmm

ip netns del "$ns" 2>/dev/null || true
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip -n "$ns" link set lo up
ip -n "$ns" tuntap add "$tap" mode tap vnet_hdr
ip -n "$ns" addr add 10.200.0.1/24 dev "$tap"
ip -n "$ns" link set "$tap" up

ip netns exec "$ns" "$root/target/release/vmm" --kernel "$kernel" --initrd "$initrd" \
	--net "tap=$tap" \
	--cmdline "console=ttyS0 reboot=k panic=-1 quiet vmm.run=net vmm.ip=10.200.0.2/24 vmm.peer=10.200.0.1" \
	"$@"
