#!/usr/bin/env python3
"""Device adaptation on a plain tap, where no knob can raise the rate: adaptive against fixed.

The driver guest (ring=3) transmits 64-byte frames into a plain `vnet_hdr` tap in a network
namespace the script creates (and removes), with nothing attached to the tap (`stack`), or
with an XDP_DROP program on it (`xdp-drop`, through `tap-xdp`). Four configurations run
alternated, ROUNDS times each, per host path:

  fixed / fixed        --net tap=T                 guest kick_threshold=8
  adaptive / fixed     --net tap=T,adaptive=on     guest kick_threshold=8
  fixed / adaptive     --net tap=T                 guest adaptive=1
  adaptive / adaptive  --net tap=T,adaptive=on     guest adaptive=1

It prints each configuration's median M frames/s, its ratio to fixed / fixed (the median
of the rounds' ratios), and the device adapter's busy-poll window at the end.

With `--compare-vmm PATH`, the two adaptive-device configurations also run with that `vmm`
binary (another build), in the same rounds, marked `(other build)`.

With `--check MIN` it exits with status 1 when a configuration with the device adapting
reads under MIN × fixed / fixed (the median of its rounds' ratios): CI's check that
adaptation does not cost where no knob helps.

Usage: scripts/adaptive-tap.py [--rounds R] [--frames N] [--paths stack,xdp-drop]
           [--compare-vmm PATH] [--check MIN] [--no-build]
Needs root, /dev/kvm, the guest artefacts (resources/build-guest.sh), an idle machine.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "adtap"
TAP = "adtap0"
CONFIGS = [
    ("fixed / fixed", "", "kick_threshold=8"),
    ("adaptive / fixed", ",adaptive=on", "kick_threshold=8"),
    ("fixed / adaptive", "", "adaptive=1"),
    ("adaptive / adaptive", ",adaptive=on", "adaptive=1"),
]


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def run(vmm, guest, keys, words, frames):
    """One run; returns the guest's rate and the adapter's busy-poll window at the end."""
    cmd = ["ip", "netns", "exec", NS, vmm, "--kernel", guest, "--net", f"tap={TAP}{keys}",
           "--cmdline", f"tx={frames} size=64 tx_completion=lazy ring=3 {words}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    d = next(json.loads(l)["driver"] for l in res.stdout.splitlines()
             if l.startswith('{"driver":'))
    if d["status"] != "done":
        raise RuntimeError(f"the guest did not finish: {d}")
    metrics = next((json.loads(l) for l in reversed(res.stderr.splitlines())
                    if l.startswith('{"net":')), {})
    window = metrics.get("net", {}).get(TAP, {}).get("adaptive", {}).get("busy_poll_us", 0)
    return d["done"] / (d["elapsed_ns"] / 1e9), window


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--frames", type=int, default=2_000_000)
    p.add_argument("--paths", default="stack,xdp-drop")
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--compare-vmm", help="another vmm binary for the adaptive configurations")
    p.add_argument("--check", type=float, metavar="MIN",
                   help="fail when a device-adapting configuration reads under MIN x fixed")
    a = p.parse_args()
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "vmm", "-p", "vmm"],
                       cwd=ROOT, check=True)
        subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "cotune", "--bin",
                        "tap-xdp"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    vmm = os.path.join(target, "release", "vmm")
    configs = [(name, keys, words, vmm) for name, keys, words in CONFIGS]
    if a.compare_vmm:
        configs += [(name + " (other build)", keys, words, a.compare_vmm)
                    for name, keys, words in CONFIGS if keys]
    out = sh("bash", os.path.join(ROOT, "resources/build-guest.sh")).stdout
    guest = dict(l.split("=", 1) for l in out.splitlines() if "=" in l)["driver_guest"]
    failed = []
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "netns", "exec", NS, "ip", "tuntap", "add", TAP, "mode", "tap", "vnet_hdr")
        sh("ip", "netns", "exec", NS, "ip", "link", "set", TAP, "up")
        with open("/proc/loadavg") as f:
            print(f"# load {f.read().split()[0]} at start; {a.rounds} alternated rounds of "
                  f"{a.frames} frames", flush=True)
        for path in a.paths.split(","):
            xdp = None
            if path == "xdp-drop":
                xdp = subprocess.Popen([os.path.join(target, "release", "tap-xdp"), "--netns",
                                        NS, TAP, "drop"], stdout=subprocess.PIPE, text=True)
                xdp.stdout.readline()
            try:
                results = {name: [] for name, _, _, _ in configs}
                for r in range(a.rounds):
                    order = configs if r % 2 == 0 else list(reversed(configs))
                    for name, keys, words, binary in order:
                        results[name].append(run(binary, guest, keys, words, a.frames))
                base = results[configs[0][0]]
                for name, _, _, _ in configs:
                    rates = [x[0] for x in results[name]]
                    ratio = statistics.median(x[0] / b[0] for x, b in zip(results[name], base))
                    windows = sorted({x[1] for x in results[name]})
                    adapting = any(n == name and k for n, k, _, _ in configs)
                    if a.check is not None and adapting and ratio < a.check:
                        failed.append(f"{path} {name}: x{ratio:.2f}")
                    print(f"{path:8} {name:34} {statistics.median(rates)/1e6:.3f} M/s "
                          f"({min(rates)/1e6:.3f}-{max(rates)/1e6:.3f}), x{ratio:.2f} of fixed; "
                          f"busy-poll window at the end {windows} us", flush=True)
            finally:
                if xdp:
                    xdp.send_signal(signal.SIGINT)
                    xdp.wait(timeout=10)
        with open("/proc/loadavg") as f:
            print(f"# load {f.read().split()[0]} at end")
    finally:
        sh("ip", "netns", "del", NS, check=False)
    if failed:
        print(f"adaptation costs where no knob helps (under x{a.check}): " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
