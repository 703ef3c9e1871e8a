#!/usr/bin/env bash
# Build the vmm test guest: a minimal x86_64 Linux kernel (Debian's
# linux-source-6.12 + resources/kernel/*.patch + resources/kernel/minimal.config
# on top of tinyconfig) and an uncompressed newc initramfs (static busybox +
# resources/init/), and the bare-metal guest program that runs the guest
# driver crate (guest/baremetal, target x86_64-unknown-none). Artefacts are
# cached outside the clone, keyed by a sha256 of their inputs; see
# resources/README.md.
#
# Usage: resources/build-guest.sh [--kernel-only|--initrd-only|--driver-guest-only] [--print] [--force]
#                                 [--kernel-variant=NAME] [--initrd-variant=NAME]
#   --kernel-only        only the kernel (prints kernel=, bzimage=, config=)
#   --kernel-variant=NAME  the kernel with resources/kernel/variant-NAME.config merged on top of
#                        minimal.config (cached apart; e.g. sysfs: the one test that reads /sys)
#   --initrd-variant=NAME  the initramfs plus the programs of variant NAME and the shared
#                        libraries they need (cached apart; e.g. ethtool: /sbin/ethtool)
#   --initrd-only        only the initramfs (prints initrd=)
#   --driver-guest-only  only the bare-metal driver guest (prints driver_guest=)
#   --print              do not build: print the paths if cached, else exit 1
#   --force              rebuild the selected artefacts even if cached
#
# stdout carries only key=path lines (kernel=, bzimage=, initrd=, config=,
# driver_guest=); all progress goes to stderr.
#
# Environment: VMM_GUEST_CACHE (default ~/.cache/vmm-guest),
#   VMM_GUEST_KEEP_BUILD=1 keeps the kernel build tree (for incremental work).
#
# The text between the "#@@ begin X" / "#@@ end X" markers is part of the
# cache keys: editing the kernel section rebuilds the kernel, editing the
# initrd section the initramfs. Everything that decides what goes into an
# artefact belongs in its section; the rest of the script (logging, package
# checks, locking, argument parsing) can change without a rebuild.
set -euo pipefail

SELF=$(readlink -f -- "${BASH_SOURCE[0]}")
RES=$(dirname -- "$SELF")
CACHE=${VMM_GUEST_CACHE:-$HOME/.cache/vmm-guest}
KSRC_PKG=linux-source-6.12 # its version is part of both keys
KSRC_TAR=/usr/src/linux-source-6.12.tar.xz
KERNEL_PKGS=(linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev xz-utils)
# iproute2: not needed to build, but every network test and scripts/demo.sh need `ip`.
# musl-tools: nettest is linked statically against musl (38 KB; glibc's static build was
# 690 KB, and every initramfs byte costs boot time: ~1 s per MB unpacked in this guest).
INITRD_PKGS=(linux-source-6.12 busybox-static gcc libc6-dev musl-tools xz-utils iproute2)
TRASH=() # build trees to delete once the lock is released
export LC_ALL=C # stable glob order for the keys

log() { printf 'build-guest: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

usage() {
	sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$SELF" >&2
}

# Text of one marked section of this script (part of the cache keys).
section() {
	local text
	text=$(awk -v s="$1" '$0 == "#@@ begin " s { on = 1 } on { print } $0 == "#@@ end " s { on = 0 }' "$SELF")
	[[ -n $text ]] || die "internal: no section '$1' in $SELF"
	printf '%s\n' "$text"
}

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }

# Exit with a clear message if any of the given Debian packages is missing.
require_pkgs() {
	local p missing=() installed
	installed=" $(dpkg-query -W -f='${db:Status-Status}:${Package} ' "$@" 2>/dev/null || true)"
	for p in "$@"; do
		[[ $installed == *" installed:$p "* ]] || missing+=("$p")
	done
	if ((${#missing[@]})) && [[ $(id -u) == 0 && -z ${VMM_NO_INSTALL:-} ]]; then
		# As root on a fresh machine, install what is missing (VMM_NO_INSTALL=1 disables).
		log "installing missing Debian packages: ${missing[*]}"
		apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
			die "apt-get install ${missing[*]} failed"
		missing=()
	fi
	if ((${#missing[@]})); then
		log "error: missing Debian packages: ${missing[*]}"
		log "install them with: apt-get install ${missing[*]}"
		log "(resources/install-deps.sh, which .ci/run runs, does that)"
		exit 2
	fi
}

# sha256 (first 16 hex digits) of stdin
short_hash() { sha256sum | cut -c1-16; }

# name + sha256 of each file, names relative to $RES
hash_files() {
	(cd "$RES" && sha256sum -- "$@")
}

# ---------------------------------------------------------------- arguments
want_kernel=1 want_initrd=1 want_dguest=1 print_only=0 force=0
only=0 variant= initrd_variant=
for arg in "$@"; do
	case $arg in
	--kernel-only) want_initrd=0 want_dguest=0 only=$((only + 1)) ;;
	--initrd-only) want_kernel=0 want_dguest=0 only=$((only + 1)) ;;
	--driver-guest-only) want_kernel=0 want_initrd=0 only=$((only + 1)) ;;
	--print) print_only=1 ;;
	--force) force=1 ;;
	--kernel-variant=*) variant=${arg#--kernel-variant=} ;;
	--initrd-variant=*) initrd_variant=${arg#--initrd-variant=} ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		usage
		die "unknown argument: $arg"
		;;
	esac
done
((only <= 1)) || die "--kernel-only, --initrd-only and --driver-guest-only exclude each other"
((print_only)) && force=0
if [[ -n $variant ]]; then
	[[ $variant =~ ^[a-z0-9-]+$ && -f $RES/kernel/variant-$variant.config ]] ||
		die "no kernel variant '$variant' (resources/kernel/variant-NAME.config)"
fi
[[ $CACHE == /* ]] || CACHE=$PWD/$CACHE
[[ $CACHE != *[[:space:]]* ]] || die "VMM_GUEST_CACHE must not contain whitespace (kbuild cannot handle it): $CACHE"

#@@ begin kernel
kernel_key() {
	{
		echo "vmm-guest kernel v1"
		section kernel
		echo "$KSRC_PKG=$(pkg_version "$KSRC_PKG")"
		gcc --version | sed -n 1p
		hash_files kernel/minimal.config
		if [[ -n $variant ]]; then
			echo "variant $variant"
			hash_files "kernel/variant-$variant.config"
		fi
		local p
		for p in "$RES"/kernel/*.patch; do
			if [[ -e $p ]]; then hash_files "kernel/${p##*/}"; fi
		done
	} | short_hash
}

# Compare the fragment with the final .config; warn (do not fail) about every
# line that did not survive. The report is also kept next to the outputs.
check_fragment() {
	local frag=$1 cfg=$2 report=$3 line sym have n=0
	: >"$report"
	while IFS= read -r line; do
		case $line in
		CONFIG_*=*)
			sym=${line%%=*}
			grep -qxF -- "$line" "$cfg" && continue
			have=$(grep -E "^(# )?$sym[= ]" "$cfg" || true)
			echo "warning: fragment '$line' did not survive; .config has: ${have:-nothing (unknown symbol or unmet dependencies)}" >>"$report"
			n=$((n + 1))
			;;
		"# CONFIG_"*" is not set")
			sym=${line#"# "}
			sym=${sym%% *}
			grep -qxF -- "$line" "$cfg" && continue
			have=$(grep -E "^$sym=" "$cfg" || true)
			if [[ -n $have ]]; then
				echo "warning: fragment '$line' did not survive; .config has: $have" >>"$report"
				n=$((n + 1))
			else
				echo "note: fragment '$line': symbol absent from .config (unknown symbol or unmet dependencies), so it is off" >>"$report"
			fi
			;;
		esac
	done <"$frag"
	if [[ -s $report ]]; then
		sed 's/^/build-guest: /' "$report" >&2
	fi
	log "config check: $n fragment line(s) did not survive"
}

build_kernel() {
	local out=$1 work=$1.build stage=$1.tmp klog=$1.log src rc
	src=$work/src
	rm -rf -- "$work" "$stage" "$klog"
	mkdir -p -- "$src" "$stage"
	log "kernel: building into $out (log: $klog)"

	log "kernel: extracting $KSRC_TAR"
	tar -xJf "$KSRC_TAR" -C "$src" --strip-components=1

	local p
	for p in "$RES"/kernel/*.patch; do
		[[ -e $p ]] || continue
		log "kernel: applying ${p##*/}"
		patch -p1 -d "$src" --batch --forward <"$p" >>"$klog" 2>&1 ||
			die "kernel: patch ${p##*/} does not apply, see $klog"
	done

	# The caller's make/kbuild settings must not leak into the build.
	unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES KBUILD_OUTPUT O ARCH \
		CROSS_COMPILE LOCALVERSION KCONFIG_CONFIG KCONFIG_ALLCONFIG || true
	kmake() {
		make -C "$src" ARCH=x86 KBUILD_BUILD_USER=vmm KBUILD_BUILD_HOST=vmm-guest "$@" >>"$klog" 2>&1
	}
	local fragments=("$RES/kernel/minimal.config")
	[[ -z $variant ]] || fragments+=("$RES/kernel/variant-$variant.config")
	log "kernel: tinyconfig + ${fragments[*]##*/} + olddefconfig"
	kmake tinyconfig || die "kernel: make tinyconfig failed, see $klog"
	(cd "$src" && scripts/kconfig/merge_config.sh -m .config "${fragments[@]}") >>"$klog" 2>&1 ||
		die "kernel: merge_config.sh failed, see $klog"
	kmake olddefconfig || die "kernel: make olddefconfig failed, see $klog"
	local frag
	for frag in "${fragments[@]}"; do
		check_fragment "$frag" "$src/.config" "$stage/fragment-check-${frag##*/}.txt"
	done

	local jobs
	jobs=$(nproc)
	log "kernel: make -j$jobs vmlinux bzImage (a few minutes on 2 cores)"
	local t0=$SECONDS
	rc=0
	kmake -j"$jobs" vmlinux bzImage || rc=$?
	if ((rc)); then
		log "kernel: build failed (exit $rc); last lines of $klog:"
		tail -n 40 "$klog" >&2
		die "kernel build failed; build tree kept in $work"
	fi
	log "kernel: built in $((SECONDS - t0)) s"

	cp -- "$src/vmlinux" "$stage/vmlinux"
	cp -- "$src/arch/x86/boot/bzImage" "$stage/bzImage"
	cp -- "$src/.config" "$stage/config"
	cp -- "$src/System.map" "$stage/System.map"
	# Reuse the extracted tree for the initramfs tool.
	install_gen_init_cpio "$src/usr/gen_init_cpio.c"

	mv -- "$klog" "$stage/build.log"
	rm -rf -- "$out"
	mv -- "$stage" "$out"
	if [[ ${VMM_GUEST_KEEP_BUILD:-0} == 1 ]]; then
		log "kernel: build tree kept in $work"
	else
		# Deleting ~1 GB takes a while: do it after releasing the lock.
		local trash
		trash=$(mktemp -d "$CACHE/kernel/.trash.XXXXXX")
		mv -- "$work" "$trash/"
		TRASH+=("$trash")
	fi
}
#@@ end kernel

#@@ begin initrd
BUSYBOX=/bin/busybox # Debian's busybox-static

# Initramfs variants (--initrd-variant=NAME): the default initramfs plus programs that only a
# few tests need, each with the shared libraries and the loader `ldd` lists for it, at the
# paths ldd prints. Every MB of initramfs costs ~1 s of boot in this guest, so the default
# initramfs has none of them.
#   ethtool: Debian's /usr/sbin/ethtool as /sbin/ethtool (0.6 MB), with glibc's libc, libm and
#            loader and libmnl (3.1 MB more). `ethtool -S` uses the SIOCETHTOOL ioctl, which
#            the test kernel has (the kernel has no ETHTOOL_NETLINK; ethtool falls back).
# Prints "GUEST_PATH HOST_PATH PACKAGE" lines; fails for an unknown NAME.
initrd_variant_programs() {
	case $1 in
	ethtool) echo "/sbin/ethtool /usr/sbin/ethtool ethtool" ;;
	*) return 1 ;;
	esac
}

# The files variant NAME adds: "GUEST_PATH HOST_FILE" lines, sorted: each program, and each
# library and loader `ldd` lists for it (at the path ldd prints, from the file it resolves to).
initrd_variant_files() {
	local lines guest host pkg deps lib
	lines=$(initrd_variant_programs "$1") || die "no initramfs variant '$1'"
	while read -r guest host pkg; do
		[[ -x $host ]] || die "initrd: $host not found (package $pkg)"
		echo "$guest $host"
		deps=$(ldd "$host") || die "initrd: ldd $host failed"
		[[ $deps != *"not found"* ]] || die "initrd: $host misses libraries: $deps"
		for lib in $(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$deps"); do
			echo "$lib $(readlink -f -- "$lib")"
		done
	done <<<"$lines"
}

initrd_key() {
	{
		echo "vmm-guest initrd v1"
		section initrd
		echo "busybox-static=$(pkg_version busybox-static)"
		echo "$KSRC_PKG=$(pkg_version "$KSRC_PKG")" # gen_init_cpio
		hash_files init/init init/src/nettest.c
		echo "gcc=$(gcc -dumpfullversion 2>/dev/null) musl-dev=$(pkg_version musl-dev)"
		local t
		for t in "$RES"/init/tests/*; do
			if [[ -e $t ]]; then hash_files "init/tests/${t##*/}"; fi
		done
		if [[ -n $initrd_variant ]]; then
			echo "variant $initrd_variant"
			local guest host pkg files
			while read -r guest host pkg; do
				echo "$pkg=$(pkg_version "$pkg")"
			done <<<"$(initrd_variant_programs "$initrd_variant")"
			# The libraries' contents too: a libc update selects a new initramfs.
			files=$(initrd_variant_files "$initrd_variant" | sort -u)
			while read -r guest host; do
				echo "$guest $(sha256sum <"$host" | cut -c1-64)"
			done <<<"$files"
		fi
	} | short_hash
}

gen_init_cpio_path() { echo "$CACHE/tools/gen_init_cpio-$(pkg_version "$KSRC_PKG")/gen_init_cpio"; }

# Compile the kernel's usr/gen_init_cpio.c (a standalone C file) into the cache.
install_gen_init_cpio() {
	local c_file=$1 dest tmp
	dest=$(gen_init_cpio_path)
	[[ -x $dest ]] && return 0
	mkdir -p -- "$(dirname -- "$dest")"
	tmp=$dest.tmp.$$
	gcc -O2 -o "$tmp" "$c_file" || die "cannot compile $c_file"
	mv -f -- "$tmp" "$dest"
}

ensure_gen_init_cpio() {
	[[ -x $(gen_init_cpio_path) ]] && return 0
	local tmp
	mkdir -p -- "$CACHE/tools"
	tmp=$(mktemp -d "$CACHE/tools/.src.XXXXXX")
	log "initrd: extracting usr/gen_init_cpio.c from $KSRC_TAR"
	tar -xJf "$KSRC_TAR" -C "$tmp" --strip-components=1 --wildcards '*/usr/gen_init_cpio.c' ||
		die "cannot extract usr/gen_init_cpio.c from $KSRC_TAR"
	install_gen_init_cpio "$tmp/usr/gen_init_cpio.c"
	rm -rf -- "$tmp"
}

build_initrd() {
	local out=$1 stage=$1.tmp t name
	rm -rf -- "$stage"
	mkdir -p -- "$stage"
	ensure_gen_init_cpio
	[[ -x $BUSYBOX ]] || die "$BUSYBOX not found (package busybox-static)"
	log "initrd: building into $out"
	# nettest: the guest side of the network tests, static so it needs no libc in the guest.
	# musl, not glibc: 38 KB instead of 690 KB, and the guest kernel unpacks the initramfs at
	# ~1 MB/s (docs/benchmarks.md, "Guest boot").
	musl-gcc -static -O2 -s -Wall -o "$stage/nettest" "$RES/init/src/nettest.c" ||
		die "initrd: cannot compile init/src/nettest.c (musl-gcc, package musl-tools)"
	# Device nodes come from the list, so no root is needed. Uncompressed on
	# purpose: gzip inflate in this guest took 22 s (NOTES.md).
	{
		echo "# generated by resources/build-guest.sh"
		local d
		for d in /dev /proc /sys /bin /sbin /tests; do
			echo "dir $d 0755 0 0"
		done
		echo "dir /tmp 1777 0 0"
		echo "nod /dev/console 0600 0 0 c 5 1"
		echo "nod /dev/null 0666 0 0 c 1 3"
		echo "file /bin/busybox $BUSYBOX 0755 0 0"
		echo "slink /bin/sh busybox 0777 0 0"
		echo "file /bin/nettest $stage/nettest 0755 0 0"
		echo "file /init $RES/init/init 0755 0 0"
		for t in "$RES"/init/tests/*.sh; do
			[[ -e $t ]] || continue
			name=${t##*/}
			[[ $name =~ ^[A-Za-z0-9_.-]+$ && $RES != *[[:space:]]* ]] ||
				die "initrd: unsupported file name: $t"
			echo "file /tests/$name $t 0755 0 0"
		done
		if [[ -n $initrd_variant ]]; then
			local files guest host dirs d
			files=$(initrd_variant_files "$initrd_variant" | sort -u)
			# Every parent directory the default list does not have (/lib, /lib64, ...).
			dirs=$(while read -r guest host; do
				d=${guest%/*}
				while [[ -n $d ]]; do
					echo "$d"
					d=${d%/*}
				done
			done <<<"$files" | sort -u)
			for d in $dirs; do
				case $d in /dev | /proc | /sys | /bin | /sbin | /tests | /tmp) ;;
				*) echo "dir $d 0755 0 0" ;;
				esac
			done
			while read -r guest host; do
				[[ $guest$host != *[[:space:]]* ]] || die "initrd: unsupported file name: $host"
				echo "file $guest $host 0755 0 0"
			done <<<"$files"
		fi
	} >"$stage/initramfs.list"
	"$(gen_init_cpio_path)" -t 0 "$stage/initramfs.list" >"$stage/initramfs.cpio" ||
		die "initrd: gen_init_cpio failed"
	rm -rf -- "$out"
	mv -- "$stage" "$out"
	log "initrd${initrd_variant:+ (variant $initrd_variant)}: $(stat -c %s "$out/initramfs.cpio") bytes"
}
#@@ end initrd

#@@ begin driver-guest
# The bare-metal guest program (guest/baremetal) and the driver crate it runs
# (guest/driver), built with cargo for x86_64-unknown-none. Its cargo target
# directory lives in the cache so that rebuilds are incremental.
DG_TARGET=x86_64-unknown-none

driver_guest_key() {
	{
		echo "vmm driver-guest v1"
		section driver-guest
		rustc --version
		cargo --version
		(cd "$RES/.." && find guest/baremetal guest/driver -path '*/target' -prune -o -type f \
			\( -name '*.rs' -o -name '*.toml' -o -name '*.ld' -o -name Cargo.lock \) -print |
			sort | xargs sha256sum --)
	} | short_hash
}

ensure_rust_target() {
	if ! rustup target list --installed 2>/dev/null | grep -qx "$DG_TARGET"; then
		log "driver-guest: installing the Rust target $DG_TARGET (rustup target add)"
		rustup target add "$DG_TARGET" >&2 || die "cannot add the Rust target $DG_TARGET"
	fi
}

build_driver_guest() {
	local out=$1 stage=$1.tmp elf
	rm -rf -- "$stage"
	mkdir -p -- "$stage"
	ensure_rust_target
	log "driver-guest: cargo build --release --target $DG_TARGET (guest/baremetal)"
	# From inside the crate, so that its .cargo/config.toml (non-relocatable image) applies.
	(cd "$RES/../guest/baremetal" &&
		CARGO_TARGET_DIR="$CACHE/driver-guest/target" cargo build --release --target "$DG_TARGET" >&2) ||
		die "driver-guest: cargo build failed"
	elf=$CACHE/driver-guest/target/$DG_TARGET/release/driver-guest
	# The VMM loads ELF segments at their physical addresses: the image must be ET_EXEC.
	[[ $(od -An -tx1 -j16 -N2 "$elf" | tr -d ' ') == 0200 ]] ||
		die "driver-guest: $elf is not a non-relocatable (ET_EXEC) ELF"
	cp -- "$elf" "$stage/driver-guest"
	rm -rf -- "$out"
	mv -- "$stage" "$out"
	log "driver-guest: $(stat -c %s "$out/driver-guest") bytes"
}
#@@ end driver-guest

# ---------------------------------------------------------------- main
pkgs=()
((want_kernel)) && pkgs+=("${KERNEL_PKGS[@]}")
((want_initrd)) && pkgs+=("${INITRD_PKGS[@]}")
if [[ -n $initrd_variant ]]; then
	[[ $initrd_variant =~ ^[a-z0-9-]+$ ]] && vlines=$(initrd_variant_programs "$initrd_variant") ||
		die "no initramfs variant '$initrd_variant' (see initrd_variant_programs in $SELF)"
	((want_initrd)) && pkgs+=($(awk '{ print $3 }' <<<"$vlines"))
fi
if ((want_kernel || want_initrd)); then
	require_pkgs "${pkgs[@]}"
	[[ -r $KSRC_TAR ]] || die "$KSRC_TAR not found (package $KSRC_PKG)"
fi

kdir= idir= gdir=
if ((want_kernel)); then
	key=$(kernel_key)
	[[ $key =~ ^[0-9a-f]{16}$ ]] || die "internal: bad kernel key '$key'"
	kdir=$CACHE/kernel/$key
fi
if ((want_initrd)); then
	key=$(initrd_key)
	[[ $key =~ ^[0-9a-f]{16}$ ]] || die "internal: bad initramfs key '$key'"
	idir=$CACHE/initrd/$key
fi
if ((want_dguest)); then
	key=$(driver_guest_key)
	[[ $key =~ ^[0-9a-f]{16}$ ]] || die "internal: bad driver-guest key '$key'"
	gdir=$CACHE/driver-guest/$key
fi

# An output directory appears atomically (rename) once complete.
need_kernel=0 need_initrd=0 need_dguest=0
if ((want_kernel)) && { ((force)) || [[ ! -f $kdir/vmlinux ]]; }; then need_kernel=1; fi
if ((want_initrd)) && { ((force)) || [[ ! -f $idir/initramfs.cpio ]]; }; then need_initrd=1; fi
if ((want_dguest)) && { ((force)) || [[ ! -f $gdir/driver-guest ]]; }; then need_dguest=1; fi

if ((print_only)); then
	if ((need_kernel || need_initrd || need_dguest)); then
		((need_kernel)) && log "kernel not cached (would be $kdir)"
		((need_initrd)) && log "initramfs not cached (would be $idir)"
		((need_dguest)) && log "driver guest not cached (would be $gdir)"
		exit 1
	fi
elif ((need_kernel || need_initrd || need_dguest)); then
	mkdir -p -- "$CACHE"
	exec 9>"$CACHE/.lock"
	if ! flock -n 9; then
		log "waiting for the lock on $CACHE (another build-guest.sh is running)"
		flock 9
	fi
	# Another invocation may have built it while we waited.
	if ((need_kernel)) && { ((force)) || [[ ! -f $kdir/vmlinux ]]; }; then
		build_kernel "$kdir"
	fi
	if ((need_initrd)) && { ((force)) || [[ ! -f $idir/initramfs.cpio ]]; }; then
		build_initrd "$idir"
	fi
	if ((need_dguest)) && { ((force)) || [[ ! -f $gdir/driver-guest ]]; }; then
		build_driver_guest "$gdir"
	fi
	exec 9>&-
	if ((${#TRASH[@]})); then
		log "deleting the kernel build tree"
		rm -rf -- "${TRASH[@]}"
	fi
fi

if ((want_kernel)); then
	echo "kernel=$kdir/vmlinux"
	echo "bzimage=$kdir/bzImage"
fi
((want_initrd)) && echo "initrd=$idir/initramfs.cpio"
((want_kernel)) && echo "config=$kdir/config"
((want_dguest)) && echo "driver_guest=$gdir/driver-guest"
exit 0
