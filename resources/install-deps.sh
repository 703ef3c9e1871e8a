#!/usr/bin/env bash
# Installs the Debian packages that building the guest and running the tests need, when they
# are missing. A no-op (well under a second) when everything is present. Needs root to install.
set -euo pipefail
PKGS=(linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev xz-utils cpio
	busybox-static gcc libc6-dev musl-tools iproute2 ethtool
	dpdk dpdk-dev qemu-system-x86)
missing=()
installed=" $(dpkg-query -W -f='${db:Status-Status}:${Package} ' "${PKGS[@]}" 2>/dev/null || true)"
for p in "${PKGS[@]}"; do
	[[ $installed == *" installed:$p "* ]] || missing+=("$p")
done
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]]; then
	echo "install-deps: missing Debian packages: ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
	exit 2
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq "${missing[@]}" >&2
