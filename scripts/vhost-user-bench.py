#!/usr/bin/env python3
"""vhost-user-net against DPDK's own vhost backend, driven by the same frontend.

One `dpdk-testpmd` with a virtio-user port (DPDK's virtio PMD, the frontend) drives, in turn,
`vhost-user-net` and a second `dpdk-testpmd` with a `net_vhost` port (DPDK's vhost library),
with the same cores and arguments. Three directions, each on split rings and on packed rings
with IN_ORDER, 64-byte frames, one queue pair:

  tx    frontend txonly   ->  vhost-user-net backend=sink   |  DPDK vhost rxonly
  rx    frontend rxonly   <-  vhost-user-net backend=source |  DPDK vhost txonly
  loop  frontend macswap  <-> vhost-user-net backend=loop   |  DPDK vhost macswap
        (the frontend starts with `tx_first 8`: 256 frames circulate)

The frontend's forwarding lcore runs on CPU 1; the backend on CPU 0 (DPDK's forwarding lcore,
or the whole vhost-user-net process). A trial runs SECONDS; the rate is the median of the
frontend's 1-second rates after the first two (its Tx-pps for tx, Rx-pps otherwise). The
backend's CPU time per frame comes from /proc/PID/stat over the same window (DPDK's lcore
polls: its CPU time is the wall time). Trials alternate ours and DPDK's, REPEATS each; the
ratio is ours over DPDK's, paired (median of per-pair ratios) and of the medians.

Usage: scripts/vhost-user-bench.py [--repeats N] [--seconds S] [--cases tx,rx,loop]
           [--layouts split,packed] [--our-keys KEYS] [--csv FILE] [--no-build]
Needs root (no hugepages: EAL --no-huge), Debian's dpdk, an idle machine.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICKS = os.sysconf("SC_CLK_TCK")

CASES = {
    # case: (frontend mode, our backend, DPDK vhost mode, frontend start command, rate key)
    "tx": ("txonly", "sink", "rxonly", "start", "Tx-pps"),
    "rx": ("rxonly", "source", "txonly", "start", "Rx-pps"),
    "loop": ("macswap", "loop", "macswap", "start tx_first 8", "Rx-pps"),
}
LAYOUTS = {
    # layout: (virtio-user devargs, vhost-user-net --net keys)
    "split": ("packed_vq=0,in_order=0", ""),
    "packed": ("packed_vq=1,in_order=1", ",packed=on,in_order=on"),
}
EAL = ["--no-huge", "-m", "1024", "--no-pci"]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_frontend(sock, devargs, mode, prefix):
    cmd = ["stdbuf", "-oL", "dpdk-testpmd", "-l", "0,1", "--main-lcore", "0", *EAL,
           "--file-prefix", prefix, "--vdev", f"net_virtio_user0,path={sock},{devargs}",
           "--", "-i", "--total-num-mbufs=32768", f"--forward-mode={mode}", "--nb-cores=1"]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)


def start_ours(binary, sock, backend, keys):
    cmd = ["taskset", "-c", "0", binary, "--socket", sock, "--net", f"backend={backend}{keys}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(100):
        if os.path.exists(sock):
            return proc
        time.sleep(0.05)
    raise RuntimeError(f"vhost-user-net did not create {sock}: {proc.stderr.read()}")


def start_dpdk(sock, mode, prefix):
    # Its forwarding lcore on CPU 0, its main lcore on CPU 1.
    cmd = ["dpdk-testpmd", "-l", "0,1", "--main-lcore", "1", *EAL, "--file-prefix", prefix,
           "--vdev", f"net_vhost0,iface={sock},queues=1", "--", "--total-num-mbufs=32768",
           f"--forward-mode={mode}", "--nb-cores=1", "--stats-period", "3600"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock):
            return proc
        time.sleep(0.05)
    raise RuntimeError("DPDK's vhost backend did not create its socket")


def trial(case, layout, ours, binary, seconds, tmp, our_keys):
    fmode, our_backend, dpdk_mode, start, key = CASES[case]
    devargs, keys = LAYOUTS[layout]
    if our_keys:
        keys += "," + our_keys
    sock = os.path.join(tmp, "vu.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    if ours:
        backend = start_ours(binary, sock, our_backend, keys)
    else:
        backend = start_dpdk(sock, dpdk_mode, f"vhb{os.getpid()}")
    frontend = start_frontend(sock, devargs, fmode, f"vuf{os.getpid()}")
    out = []
    try:
        # The prompt has no newline: the last line before it is the link check.
        wait_for(frontend, out, "Checking link statuses")
        time.sleep(0.5)
        frontend.stdin.write(start + "\n")
        frontend.stdin.flush()
        rates = []
        cpu0 = None
        for second in range(seconds):
            time.sleep(1)
            if second == 1:
                cpu0 = cpu_seconds(backend.pid)
                t0 = time.monotonic()
            frontend.stdin.write("show port stats all\n")
            frontend.stdin.flush()
            block = wait_for(frontend, out, "Tx-bps")
            m = re.search(key + r":\s+(\d+)", block)
            if m and second >= 2:
                rates.append(int(m.group(1)))
        cpu = cpu_seconds(backend.pid) - cpu0
        wall = time.monotonic() - t0
        frontend.stdin.write("stop\nquit\n")
        frontend.stdin.flush()
        frontend.wait(timeout=30)
    finally:
        for p in (frontend, backend):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    rate = statistics.median(rates)
    frames = rate * wall
    return rate, cpu / frames * 1e9 if frames else float("nan"), cpu / wall


def wait_for(proc, out, needle, timeout=30):
    """Reads the frontend's output until `needle`; returns what came since the last call."""
    deadline = time.monotonic() + timeout
    chunk = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("testpmd exited:\n" + "".join(out[-40:]))
        out.append(line)
        chunk.append(line)
        if needle in line:
            return "".join(chunk)
    raise RuntimeError(f"no {needle!r} from testpmd:\n" + "".join(out[-40:]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--cases", default="tx,rx,loop")
    p.add_argument("--layouts", default="split,packed")
    p.add_argument("--csv")
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--our-keys", default="",
                   help="more --net keys for vhost-user-net (e.g. busy_poll_us=50, adaptive=on)")
    a = p.parse_args()
    if not shutil.which("dpdk-testpmd"):
        sys.exit("dpdk-testpmd not found: apt-get install dpdk")
    if not a.no_build:
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "vhost-user-net"],
                       cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, "release", "vhost-user-net")
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"# load {load} at start; {a.repeats} alternated pairs of {a.seconds} s trials; "
          f"vhost-user-net keys: {a.our_keys or '(defaults)'}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            for layout in a.layouts.split(","):
                pairs = []
                for r in range(a.repeats):
                    # Alternate which goes first.
                    order = [True, False] if r % 2 == 0 else [False, True]
                    got = {}
                    for ours in order:
                        got[ours] = trial(case, layout, ours, binary, a.seconds, tmp, a.our_keys)
                    pairs.append((got[True], got[False]))
                    print(f"  {case:4} {layout:6} #{r}: ours {got[True][0]/1e6:6.2f} Mpps "
                          f"({got[True][1]:6.1f} ns/frame CPU), DPDK {got[False][0]/1e6:6.2f} Mpps "
                          f"({got[False][1]:6.1f} ns/frame CPU)", flush=True)
                ours_rate = statistics.median(x[0][0] for x in pairs)
                dpdk_rate = statistics.median(x[1][0] for x in pairs)
                paired = statistics.median(x[0][0] / x[1][0] for x in pairs)
                ours_cpu = statistics.median(x[0][1] for x in pairs)
                dpdk_cpu = statistics.median(x[1][1] for x in pairs)
                ours_busy = statistics.median(x[0][2] for x in pairs)
                row = (case, layout, ours_rate, dpdk_rate, paired, ours_cpu, dpdk_cpu, ours_busy)
                rows.append(row)
                print(f"{case:4} {layout:6} ours {ours_rate/1e6:.2f} Mpps, DPDK {dpdk_rate/1e6:.2f} "
                      f"Mpps, paired ratio {paired:.2f}; backend CPU {ours_cpu:.1f} vs "
                      f"{dpdk_cpu:.1f} ns/frame (ours busy {ours_busy:.2f} of a CPU)", flush=True)
    with open("/proc/loadavg") as f:
        print(f"# load {f.read().split()[0]} at end")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("case,layout,ours_pps,dpdk_pps,paired_ratio,ours_cpu_ns_per_frame,"
                    "dpdk_cpu_ns_per_frame,ours_cpu_busy\n")
            for r in rows:
                f.write(",".join(str(round(x, 3)) if isinstance(x, float) else str(x) for x in r)
                        + "\n")


if __name__ == "__main__":
    main()
