#!/usr/bin/env python3
"""The device in process against the device out of process (vhost-user), driver guest at ring=3.

Each case runs the driver guest (`guest/baremetal`, the driver crate in user mode) twice per
round, alternated: with the device in the VMM (`vmm --net backend=KIND,KEYS`) and with the
same device in `vhost-user-net` (`vhost-user-net --net backend=KIND,KEYS` and
`vmm --net vhost-user=SOCKET`). The rate is the guest's own (frames done over its elapsed
time); kicks and interrupts per frame are the guest's counts. The ratio is out of process
over in process: the median of the rounds' ratios, and the medians' ratio.

  tx-sink         tx=N size=64 tx_completion=lazy kick_threshold=64 into backend=sink
  tx-sink-poll    the same, the device with busy_poll_us=50
  tx-tap          tx=N size=64 tx_completion=lazy kick_threshold=64 into a plain tap
                  (in a network namespace the script creates and removes)
  rx-source       rx=N from backend=source
  fwd-loop        fwd=N window=256 through backend=loop

Usage: scripts/vhost-user-vm-bench.py [--rounds R] [--frames N] [--cases a,b,...] [--csv FILE]
           [--no-build]
Needs root, /dev/kvm, the guest artefacts (resources/build-guest.sh), an idle machine.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "vubench"
TAP = "vubtap0"

CASES = {
    # case: (backend --net spec, guest words)
    "tx-sink": ("backend=sink", "tx={n} size=64 tx_completion=lazy kick_threshold=64"),
    "tx-sink-poll": ("backend=sink,busy_poll_us=50",
                     "tx={n} size=64 tx_completion=lazy kick_threshold=64"),
    "tx-tap": (f"tap={TAP}", "tx={n} size=64 tx_completion=lazy kick_threshold=64"),
    "rx-source": ("backend=source", "rx={n}"),
    "fwd-loop": ("backend=loop", "fwd={n} window=256"),
}


def artefacts():
    out = subprocess.run(["bash", os.path.join(ROOT, "resources/build-guest.sh")],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def driver(out):
    for line in out.splitlines():
        if line.startswith('{"driver":'):
            return json.loads(line)["driver"]
    raise RuntimeError("no driver result:\n" + out[-2000:])


def in_ns(cmd, tap):
    return ["ip", "netns", "exec", NS, *cmd] if tap else cmd


def run(binaries, guest, spec, words, out_of_process, tmp):
    vmm, backend = binaries
    tap = spec.startswith("tap=")
    cmdline = words + " ring=3"
    if not out_of_process:
        cmd = in_ns([vmm, "--kernel", guest, "--cmdline", cmdline, "--net", spec], tap)
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return driver(res.stdout)
    sock = os.path.join(tmp, "vu.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    be = subprocess.Popen(in_ns([backend, "--socket", sock, "--net", spec], tap),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
        cmd = [vmm, "--kernel", guest, "--cmdline", cmdline, "--net", f"vhost-user={sock}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        return driver(res.stdout)
    finally:
        be.terminate()
        be.wait(timeout=10)


def rate(d):
    if d.get("status") != "done":
        raise RuntimeError(f"the guest did not finish: {d}")
    return d["done"] / (d["elapsed_ns"] / 1e9)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--frames", type=int, default=2_000_000)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--csv")
    p.add_argument("--no-build", action="store_true")
    a = p.parse_args()
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "vmm",
                        "--bin", "vhost-user-net"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binaries = (os.path.join(target, "release", "vmm"),
                os.path.join(target, "release", "vhost-user-net"))
    guest = artefacts()["driver_guest"]
    cases = a.cases.split(",")
    if "tx-tap" in cases:
        subprocess.run(["ip", "netns", "add", NS], check=True)
        subprocess.run(["ip", "netns", "exec", NS, "ip", "tuntap", "add", TAP, "mode", "tap",
                        "vnet_hdr"], check=True)
        subprocess.run(["ip", "netns", "exec", NS, "ip", "link", "set", TAP, "up"], check=True)
    rows = []
    try:
        with open("/proc/loadavg") as f:
            print(f"# load {f.read().split()[0]} at start; {a.rounds} alternated rounds, "
                  f"{a.frames} frames a run", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for case in cases:
                spec, words = CASES[case]
                words = words.format(n=a.frames)
                rounds = []
                for r in range(a.rounds):
                    order = [False, True] if r % 2 == 0 else [True, False]
                    got = {o: run(binaries, guest, spec, words, o, tmp) for o in order}
                    rounds.append((got[False], got[True]))
                    ins, out = rate(got[False]), rate(got[True])
                    print(f"  {case:13} #{r}: in process {ins/1e6:.3f} Mpps, out {out/1e6:.3f}"
                          f" Mpps ({out/ins:.2f})", flush=True)
                per = lambda d, k: d.get(k, 0) / max(d["done"], 1)
                ins = statistics.median(rate(x[0]) for x in rounds)
                out = statistics.median(rate(x[1]) for x in rounds)
                paired = statistics.median(rate(x[1]) / rate(x[0]) for x in rounds)
                kicks = [statistics.median(per(x[i], "kicks") for x in rounds) for i in (0, 1)]
                irqs = [statistics.median(per(x[i], "interrupts") for x in rounds) for i in (0, 1)]
                rows.append((case, ins, out, paired, *kicks, *irqs))
                print(f"{case:13} in {ins/1e6:.3f} Mpps, out {out/1e6:.3f} Mpps, paired "
                      f"{paired:.2f}; kicks/frame {kicks[0]:.4f} vs {kicks[1]:.4f}, "
                      f"interrupts/frame {irqs[0]:.4f} vs {irqs[1]:.4f}", flush=True)
        with open("/proc/loadavg") as f:
            print(f"# load {f.read().split()[0]} at end")
    finally:
        if "tx-tap" in cases:
            subprocess.run(["ip", "netns", "del", NS])
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("case,in_process_pps,out_of_process_pps,paired_ratio,kicks_per_frame_in,"
                    "kicks_per_frame_out,interrupts_per_frame_in,interrupts_per_frame_out\n")
            for r in rows:
                f.write(",".join(f"{x:.4f}" if isinstance(x, float) else str(x) for x in r)
                        + "\n")


if __name__ == "__main__":
    sys.exit(main())
