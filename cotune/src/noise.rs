//! Noise: the machine's load average at each point, the CPU each thread got, and pinning the
//! driver (or vCPU) thread and the device worker to separate cores (`--pin`).

use std::io;

/// The 1-minute load average (`/proc/loadavg`), or NaN when it cannot be read.
pub fn loadavg1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| parse_loadavg1(&s))
        .unwrap_or(f64::NAN)
}

/// The first field of a `/proc/loadavg` line.
pub fn parse_loadavg1(s: &str) -> Option<f64> {
    s.split_whitespace().next()?.parse().ok()
}

/// Load average above which `cotune` warns that numbers will be noisy.
pub const BUSY_LOADAVG: f64 = 0.5;

/// On-CPU time of thread `tid` of process `pid`, ns (`/proc/<pid>/task/<tid>/schedstat`).
pub fn proc_task_cpu_ns(pid: u32, tid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The thread of process `pid` whose name (`comm`) is exactly `name`, if any.
pub fn proc_thread_named(pid: u32, name: &str) -> Option<i32> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    dir.filter_map(|e| e.ok()).find_map(|e| {
        let tid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim_end() == name).then_some(tid)
    })
}

/// The name Linux gives a thread named `name`: its first 15 bytes (`comm`).
pub fn comm_name(name: &str) -> String {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// The calling thread's affinity mask.
fn affinity() -> io::Result<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain old data; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes into `set`, which
    // lives for the call.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(set)
}

fn set_affinity(tid: i32, set: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads size_of::<cpu_set_t>() bytes from `set`, which lives for
    // the call; it changes only the scheduling of thread `tid`.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set) };
    if rc != 0 {
        return Err(io::Error::other(format!(
            "sched_setaffinity(thread {tid}): {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Pins the calling thread to one CPU until dropped, then gives it its old mask back.
pub struct PinGuard {
    old: libc::cpu_set_t,
}

impl PinGuard {
    /// Pins the calling thread to `cpu`.
    pub fn pin(cpu: usize) -> io::Result<PinGuard> {
        let old = affinity()?;
        pin_thread(0, cpu)?;
        Ok(PinGuard { old })
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let _ = set_affinity(0, &self.old);
    }
}

/// The CPUs the calling thread may run on (its affinity mask), lowest first.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = affinity()?;
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET only reads the set, and the index is below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins thread `tid` (0: the calling thread) to CPU `cpu` alone.
pub fn pin_thread(tid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::other(format!("no CPU {cpu}")));
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes one bit of `set`; `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_affinity(tid, &set).map_err(|e| io::Error::other(format!("{e} (cpu {cpu})")))
}

/// Two distinct CPUs the calling thread may use: (driver/vCPU, device worker). Error when it
/// may use only one. Call before pinning anything.
pub fn cpu_pair() -> io::Result<(usize, usize)> {
    let cpus = allowed_cpus()?;
    match cpus.as_slice() {
        [a, b, ..] => Ok((*a, *b)),
        _ => Err(io::Error::other(format!(
            "--pin needs two CPUs, this process may use {cpus:?}"
        ))),
    }
}

/// CPU time over wall time, in percent.
pub fn cpu_pct(cpu_ns: u64, wall_secs: f64) -> f64 {
    if wall_secs <= 0.0 {
        return f64::NAN;
    }
    cpu_ns as f64 / (wall_secs * 1e9) * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_first_loadavg_field() {
        assert_eq!(parse_loadavg1("0.46 0.84 1.07 2/84 22338\n"), Some(0.46));
        assert_eq!(parse_loadavg1(""), None);
        assert!(loadavg1() >= 0.0);
    }

    #[test]
    fn comm_names_are_cut_at_15_bytes() {
        assert_eq!(comm_name("net-ctap0"), "net-ctap0");
        assert_eq!(comm_name("net-a-very-long-tap"), "net-a-very-long");
    }

    #[test]
    fn finds_its_own_named_thread_and_pins_it() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("noise-probe".into())
            .spawn(move || {
                let _ = rx.recv();
                allowed_cpus().unwrap()
            })
            .unwrap();
        let mut tid = None;
        for _ in 0..100 {
            tid = proc_thread_named(std::process::id(), "noise-probe");
            if tid.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let tid = tid.expect("the probe thread is listed");
        let all = allowed_cpus().unwrap();
        let cpu = *all.last().unwrap();
        pin_thread(tid, cpu).unwrap();
        tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), vec![cpu]);
        // A guard pins the calling thread and gives the old mask back.
        let mine = std::thread::spawn(move || {
            let before = allowed_cpus().unwrap();
            let pinned = {
                let _g = PinGuard::pin(cpu).unwrap();
                allowed_cpus().unwrap()
            };
            (before, pinned, allowed_cpus().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(mine.1, vec![cpu]);
        assert_eq!(mine.0, mine.2);
        assert_eq!(mine.0, all);
    }

    #[test]
    fn cpu_percent_is_cpu_over_wall() {
        assert_eq!(cpu_pct(500_000_000, 1.0), 50.0);
        assert!(cpu_pct(1, 0.0).is_nan());
    }
}
