//! The exit-cost model and CPU-time accounting.
//!
//! On a host thread a kick is an eventfd write (~0.3 µs); in a VM it is an MMIO-write VM exit
//! that the vCPU pays (~1–2 µs round trip on hardware KVM), and an interrupt costs the vCPU an
//! injection plus the guest handler's entry and exit. The harness charges those costs on the
//! driver thread by busy-waiting, so co-simulation does not understate what notification
//! suppression buys. Defaults and sources: docs/cotune.md.

use std::time::{Duration, Instant};

/// Default cost of one driver kick (an MMIO-write VM exit handled by an in-kernel ioeventfd),
/// in ns of vCPU time.
pub const DEFAULT_KICK_COST_NS: u64 = 1_500;
/// Default cost of one interrupt taken by the guest (injection, handler entry/exit, EOI), in ns
/// of vCPU time.
pub const DEFAULT_IRQ_COST_NS: u64 = 2_000;

/// Busy-waits `ns` nanoseconds on the calling thread (0: returns at once).
pub fn spin_for_ns(ns: u64) {
    if ns == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// CPU time consumed by the calling thread, in ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec we pass, which lives for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// On-CPU time of thread `tid` of this process, in ns (from /proc's schedstat).
pub fn task_cpu_ns(tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The thread ids of this process's threads whose name starts with `prefix`.
pub fn threads_named(prefix: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            comm.trim_end().starts_with(prefix).then_some(tid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_consumes_thread_cpu_time() {
        let before = thread_cpu_ns();
        spin_for_ns(2_000_000);
        let used = thread_cpu_ns() - before;
        assert!(used >= 1_000_000, "spun 2 ms but used {used} ns of CPU");
    }

    #[test]
    fn finds_named_threads_and_their_cpu_time() {
        let handle = std::thread::Builder::new()
            .name("cotune-probe".into())
            .spawn(|| {
                spin_for_ns(1_000_000);
                std::thread::sleep(Duration::from_millis(200));
            })
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let tids = threads_named("cotune-probe");
        assert_eq!(tids.len(), 1);
        assert!(task_cpu_ns(tids[0]).unwrap() > 0);
        handle.join().unwrap();
    }
}
