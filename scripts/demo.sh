#!/usr/bin/env bash
# Boots the demo guest: builds the guest kernel and initramfs on first use (cached outside the
# clone; ~5 min the first time on 2 cores), builds vmm, and runs the guest with its console on
# this terminal. The guest prints a few lines and reboots, which ends the VMM.
#
#   scripts/demo.sh [extra vmm flags...]      e.g. --cmdline "console=ttyS0 reboot=k vmm.shell=1"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
artefacts=$(bash "$root/resources/build-guest.sh")
kernel=$(sed -n 's/^kernel=//p' <<<"$artefacts")
initrd=$(sed -n 's/^initrd=//p' <<<"$artefacts")
cargo build --release --quiet --manifest-path "$root/Cargo.toml" --bin vmm
exec "$root/target/release/vmm" --kernel "$kernel" --initrd "$initrd" "$@"
