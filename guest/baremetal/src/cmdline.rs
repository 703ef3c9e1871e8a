//! The guest program's command line: the virtio-mmio device the VMM placed
//! (`virtio_mmio.device=4K@0xd0000000:5`) or `transport=pci`, the driver knobs and the
//! workload.
//!
//! Words the program does not know (`console=`, the VMM's host quirks such as `noxsave` or
//! `clearcpuid=…`) are ignored; a known key with a bad value is an error, so that a typo in a
//! test's command line does not silently run the defaults.

use core::fmt;

use vnet_driver::adapt::KICK_THRESHOLD_CAP;
use vnet_driver::{Coalescing, Config, TxCompletion};

use reset_words::ResetWords;

mod reset_words;

/// Largest frame the workloads send (a tap with the default 1500-byte MTU takes 1514 bytes).
pub const MAX_FRAME: usize = 9014;
/// Smallest frame: Ethernet header (14) + sequence number (4) + length (2).
pub const MIN_FRAME: usize = crate::frames::HEADER_LEN;

/// One `virtio_mmio.device=<size>@<base>:<irq>` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioDevice {
    /// Size of the register window.
    pub size: u64,
    /// Guest physical base of the window.
    pub base: u64,
    /// The GSI (IOAPIC pin) of its interrupt.
    pub gsi: u32,
}

/// Where the driver loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// In kernel mode, like a guest kernel driver (emulated on hosts such as KVM's PVM).
    Kernel,
    /// In user mode (CPL3) with the device window, rings and buffers mapped for it; only
    /// interrupt entry and set-up run in kernel mode.
    User,
}

/// Which transport the driver drives the device over (`transport=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportChoice {
    /// virtio-mmio: the window of `virtio_mmio.device=`, its IOAPIC pin, one interrupt
    /// vector and the InterruptStatus read per interrupt (the default, as the VMM's).
    #[default]
    Mmio,
    /// Modern virtio-pci: the function found on PCI bus 0 (vendor 0x1af4, device 0x1041),
    /// an MSI-X vector per queue and for configuration changes, no ISR read.
    Pci,
}

/// How the driver waits when it has nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `hlt` with interrupts on until the next interrupt (the device's, or the tick).
    Halt,
    /// Spin, re-checking the rings and the interrupt count.
    Poll,
}

/// What the program does once the device is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Send this many frames.
    Tx(u64),
    /// Bounce back this many received frames of the test EtherType (XDP_TX, MACs swapped).
    Echo(u64),
    /// Receive this many test frames, check each one (pattern and per-pair sequence number)
    /// and drop it (`rx=N`).
    Rx(u64),
    /// Forwarding at rate (`fwd=N window=W`): send `window` test frames, then bounce every
    /// received test frame back (XDP_TX, MACs swapped, as `Echo`) until `frames` are forwarded.
    Fwd {
        /// Frames to forward.
        frames: u64,
        /// Test frames sent first (sequence numbers `0..window`).
        window: u32,
    },
    /// Request/response latency (`pingpong=N window=W`): keep `window` test frames in
    /// flight, each carrying its sequence number; time every frame's round trip (TSC) from
    /// its send to its return, check it is one in flight and intact, and send the next in its
    /// place (XDP_TX of the returned buffer, rewritten) until `frames` round trips.
    PingPong {
        /// Round trips to time.
        frames: u64,
        /// Frames in flight (1..=[`MAX_PINGPONG_WINDOW`]).
        window: u32,
    },
    /// The request/response loop of `pingpong=` alternating between a flood (`window`
    /// frames in flight) and a trickle (one in flight), each phase lasting `phase_us`
    /// (`mixed=N window=W phase_us=P`; the phases' rules: [`crate::mixed`]).
    Mixed {
        /// Round trips in all.
        frames: u64,
        /// Frames in flight during a flood (1..=[`MAX_PINGPONG_WINDOW`]).
        window: u32,
        /// Microseconds each phase lasts ([`MIN_PHASE_US`]..=[`MAX_PHASE_US`]).
        phase_us: u32,
    },
    /// Bring the device up and report (no traffic).
    Idle,
    /// Measure this host's notification and interrupt costs with this many samples of each
    /// (`calibrate=N`) and print a `{"calibrate":{…}}` line instead of the result line.
    Calibrate(u32),
}

/// Most samples `calibrate=` takes (the samples are kept in memory to take percentiles).
pub const MAX_CALIBRATE_SAMPLES: u32 = 100_000;
/// Most queue pairs `queues=` takes (as the VMM's `--net …,queues=N`).
pub const MAX_QUEUES: u16 = 16;
/// Longest `pause_us=` (one second).
pub const MAX_PAUSE_US: u32 = 1_000_000;
/// Default `window=` of `fwd=`.
pub const DEFAULT_WINDOW: u32 = 256;
/// Largest `window=`.
pub const MAX_WINDOW: u32 = 4096;
/// Default `window=` of `pingpong=`.
pub const DEFAULT_PINGPONG_WINDOW: u32 = 1;
/// Largest `window=` of `pingpong=`.
pub const MAX_PINGPONG_WINDOW: u32 = 64;
/// Default `window=` of `mixed=`: frames in flight during a flood.
pub const DEFAULT_MIXED_WINDOW: u32 = 64;
/// Default `phase_us=` of `mixed=`.
pub const DEFAULT_PHASE_US: u32 = 10_000;
/// Shortest `phase_us=`.
pub const MIN_PHASE_US: u32 = 100;
/// Longest `phase_us=` (one second).
pub const MAX_PHASE_US: u32 = 1_000_000;
/// Default `rx_budget=`: frames per rx poll (NAPI budget).
pub const DEFAULT_RX_BUDGET: usize = 64;
/// Largest `rx_budget=`.
pub const MAX_RX_BUDGET: usize = 4096;
/// Longest `rx_defer_us=` (10 ms).
pub const MAX_RX_DEFER_US: u32 = 10_000;

/// `burst=B pause_us=P`: the tx workload spins `pause_us` after every `burst` frames queued
/// (each burst ends with a flush: publish and kick decision).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    /// Frames per burst (≥ 1).
    pub burst: u32,
    /// Microseconds the driver spins (TSC) after each burst (0: flush every `burst` frames,
    /// no pause).
    pub pause_us: u32,
}

/// `coalesce=TXP/TXU/RXP/RXU`: notification coalescing the guest sets over the control queue
/// (NOTF_COAL TX_SET, then RX_SET) once the device is up, before the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalesce {
    /// Tx `max_packets` and `usecs`.
    pub tx: Coalescing,
    /// Rx `max_packets` and `usecs`.
    pub rx: Coalescing,
}

impl fmt::Display for Coalesce {
    /// The word's value as given (in decimal): `TXP/TXU/RXP/RXU`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tx, self.rx)
    }
}

/// A driver that misprograms the device on purpose (`hostile=`), to test the VMM's defences.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hostile {
    /// `hostile=overlap-used`: the tx queue's used ring on its avail ring (the used ring's
    /// `flags` on the avail ring's `idx`) at DRIVER_OK, then a kick and a reset.
    OverlapUsed,
}

/// Everything the command line decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The first virtio-mmio device on the command line.
    pub device: Option<MmioDevice>,
    /// The driver's configuration.
    pub driver: Config,
    /// The workload.
    pub workload: Workload,
    /// Ethernet frame length of transmitted frames, header included (`size=`).
    pub frame_size: usize,
    /// Frames queued per transmit batch before the batch is flushed (`batch=`).
    pub batch: u32,
    /// Destination MAC of transmitted frames (`dst=`).
    pub dst: [u8; 6],
    /// `ring=0|3`.
    pub ring: Ring,
    /// `wait=halt|poll`.
    pub wait: Wait,
    /// Give up after this long (`timeout_ms=`).
    pub timeout_ms: u64,
    /// The TSC frequency the VMM passes for Linux (`tsc_early_khz=`), if any.
    pub tsc_khz: Option<u64>,
    /// Misprogram the device instead of running a workload (`hostile=`).
    pub hostile: Option<Hostile>,
    /// Pauses between bursts of the tx workload (`burst=`, `pause_us=`); `None`: none.
    pub pause: Option<Pause>,
    /// Coalescing to set over the control queue before the workload (`coalesce=`).
    pub coalesce: Option<Coalesce>,
    /// `transport=mmio|pci` (default mmio).
    pub transport: TransportChoice,
    /// `reset_queue=` and `reset_every=`: per-queue resets during the workload.
    pub reset: Option<crate::reset::ResetPlan>,
    /// Frames per rx poll before the loop services tx and the other pairs (`rx_budget=`).
    pub rx_budget: usize,
    /// With `wait=halt`, how long a pair's rx poll keeps polling after it comes up short
    /// before it re-arms the rx interrupts (`rx_defer_us=`; 0: at once, NAPI's default).
    pub rx_defer_us: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            device: None,
            // The device's counters are read only when asked (`device_stats=1`): reading them
            // adds control commands to the run's counts.
            driver: Config {
                device_stats: false,
                ..Config::default()
            },
            workload: Workload::Idle,
            frame_size: 64,
            batch: 64,
            dst: [0x02, 0, 0, 0, 0, 0x01],
            ring: Ring::Kernel,
            wait: Wait::Halt,
            timeout_ms: 60_000,
            tsc_khz: None,
            hostile: None,
            pause: None,
            coalesce: None,
            transport: TransportChoice::Mmio,
            reset: None,
            rx_budget: DEFAULT_RX_BUDGET,
            rx_defer_us: 0,
        }
    }
}

/// A known key with a value the program cannot use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadValue<'a> {
    /// The key.
    pub key: &'a str,
    /// Its value.
    pub value: &'a str,
}

impl fmt::Display for BadValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad value for {}: {:?}", self.key, self.value)
    }
}

/// The words' values on their way to [`Options`]: those that decide together (the workload,
/// pacing, resets) are kept apart until the whole line is read.
#[derive(Default)]
struct Words {
    o: Options,
    tx: Option<u64>,
    echo: Option<u64>,
    rx: Option<u64>,
    fwd: Option<u64>,
    pingpong: Option<u64>,
    mixed: Option<u64>,
    calibrate: Option<u32>,
    window: Option<u32>,
    phase_us: Option<u32>,
    burst: Option<u32>,
    pause_us: Option<u32>,
    reset: ResetWords,
}

/// Takes a key's value into [`Words`]; `None`: a bad value.
type Setter = fn(&mut Words, &str) -> Option<()>;

/// The keys the program knows (besides `reset_queue=` and `reset_every=`) and what each sets.
const KEYS: &[(&str, Setter)] = &[
    ("virtio_mmio.device", |w, v| {
        // The first device on the line is the one driven; a later one must still parse.
        let device = parse_mmio_device(v)?;
        w.o.device.get_or_insert(device);
        Some(())
    }),
    ("kick_threshold", |w, v| {
        set(&mut w.o.driver.kick_threshold, number(v))
    }),
    ("xdp_bulk", |w, v| set(&mut w.o.driver.xdp_bulk, number(v))),
    ("adaptive", |w, v| set(&mut w.o.driver.adaptive, flag(v))),
    ("kick_threshold_max", |w, v| {
        let n = number(v).filter(|n| (1..=KICK_THRESHOLD_CAP).contains(n));
        set(&mut w.o.driver.kick_threshold_max, n)
    }),
    ("queue_size", |w, v| {
        let size = number(v)?;
        w.o.driver.rx_queue_size = size;
        w.o.driver.tx_queue_size = size;
        Some(())
    }),
    ("event_idx", |w, v| set(&mut w.o.driver.event_idx, flag(v))),
    ("mrg_rxbuf", |w, v| set(&mut w.o.driver.mrg_rxbuf, flag(v))),
    ("packed", |w, v| set(&mut w.o.driver.packed, flag(v))),
    ("in_order", |w, v| set(&mut w.o.driver.in_order, flag(v))),
    ("ctrl_vq", |w, v| set(&mut w.o.driver.ctrl_vq, flag(v))),
    ("device_stats", |w, v| {
        set(&mut w.o.driver.device_stats, flag(v))
    }),
    ("queues", |w, v| {
        let n = number(v).filter(|n| (1..=MAX_QUEUES).contains(n));
        set(&mut w.o.driver.queue_pairs, n)
    }),
    ("coalesce", |w, v| {
        set(&mut w.o.coalesce, parse_coalesce(v).map(Some))
    }),
    ("tx_completion", |w, v| {
        let c = one_of(
            v,
            &[
                ("tx-interrupt", TxCompletion::TxInterrupt),
                ("clean-from-rx", TxCompletion::CleanFromRx),
                ("lazy", TxCompletion::Lazy),
            ],
        );
        set(&mut w.o.driver.tx_completion, c)
    }),
    ("tx", |w, v| set(&mut w.tx, number(v).map(Some))),
    ("echo", |w, v| set(&mut w.echo, number(v).map(Some))),
    ("rx", |w, v| set(&mut w.rx, number(v).map(Some))),
    ("fwd", |w, v| set(&mut w.fwd, number(v).map(Some))),
    ("pingpong", |w, v| set(&mut w.pingpong, number(v).map(Some))),
    ("mixed", |w, v| set(&mut w.mixed, number(v).map(Some))),
    ("phase_us", |w, v| {
        let p = number(v).filter(|p| (MIN_PHASE_US..=MAX_PHASE_US).contains(p));
        set(&mut w.phase_us, p.map(Some))
    }),
    ("window", |w, v| {
        let n = number(v).filter(|n| (1..=MAX_WINDOW).contains(n));
        set(&mut w.window, n.map(Some))
    }),
    ("rx_budget", |w, v| {
        let n = number(v).filter(|n| (1..=MAX_RX_BUDGET).contains(n));
        set(&mut w.o.rx_budget, n)
    }),
    ("rx_defer_us", |w, v| {
        let n = number(v).filter(|n| *n <= MAX_RX_DEFER_US);
        set(&mut w.o.rx_defer_us, n)
    }),
    ("calibrate", |w, v| {
        let n = number(v).filter(|n| (1..=MAX_CALIBRATE_SAMPLES).contains(n));
        set(&mut w.calibrate, n.map(Some))
    }),
    ("burst", |w, v| {
        set(&mut w.burst, number(v).filter(|&b: &u32| b > 0).map(Some))
    }),
    ("pause_us", |w, v| {
        let p = number(v).filter(|&p| p <= MAX_PAUSE_US);
        set(&mut w.pause_us, p.map(Some))
    }),
    ("size", |w, v| {
        let s = number(v).filter(|s| (MIN_FRAME..=MAX_FRAME).contains(s));
        set(&mut w.o.frame_size, s)
    }),
    ("batch", |w, v| {
        set(&mut w.o.batch, number(v).filter(|&b| b > 0))
    }),
    ("dst", |w, v| set(&mut w.o.dst, parse_mac(v))),
    ("ring", |w, v| {
        set(
            &mut w.o.ring,
            one_of(v, &[("0", Ring::Kernel), ("3", Ring::User)]),
        )
    }),
    ("transport", |w, v| {
        let t = one_of(
            v,
            &[
                ("mmio", TransportChoice::Mmio),
                ("pci", TransportChoice::Pci),
            ],
        );
        set(&mut w.o.transport, t)
    }),
    ("wait", |w, v| {
        set(
            &mut w.o.wait,
            one_of(v, &[("halt", Wait::Halt), ("poll", Wait::Poll)]),
        )
    }),
    ("timeout_ms", |w, v| {
        set(&mut w.o.timeout_ms, number(v).filter(|&t| t > 0))
    }),
    // Never an error: a value the program cannot use leaves the TSC to be measured.
    ("tsc_early_khz", |w, v| {
        set(&mut w.o.tsc_khz, Some(number(v).filter(|&k| k > 0)))
    }),
    ("hostile", |w, v| {
        let h = one_of(v, &[("overlap-used", Hostile::OverlapUsed)]);
        set(&mut w.o.hostile, h.map(Some))
    }),
];

/// The value named `v` in `names`, if any.
fn one_of<T: Copy>(v: &str, names: &[(&str, T)]) -> Option<T> {
    names.iter().find(|(name, _)| *name == v).map(|&(_, t)| t)
}

/// Stores `value` in `field`, if there is one (else a bad value).
fn set<T>(field: &mut T, value: Option<T>) -> Option<()> {
    *field = value?;
    Some(())
}

/// Parses the whole command line.
pub fn parse(cmdline: &str) -> Result<Options, BadValue<'_>> {
    let mut w = Words::default();
    for word in cmdline.split_ascii_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        let bad = BadValue { key, value };
        match KEYS.iter().find(|(k, _)| *k == key) {
            Some((_, take)) => take(&mut w, value).ok_or(bad)?,
            None => {
                if w.reset.take(key, value) == Some(false) {
                    return Err(bad);
                }
            }
        }
    }
    w.finish()
}

impl Words {
    /// The options, once the whole line is read: the words that decide together checked
    /// against each other.
    fn finish(mut self) -> Result<Options, BadValue<'static>> {
        self.o.workload = self.workload()?;
        self.o.pause = match (self.burst, self.pause_us) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(BadValue {
                    key: "pause_us",
                    value: "needs burst=",
                })
            }
            (Some(burst), pause_us) => Some(Pause {
                burst,
                pause_us: pause_us.unwrap_or(0),
            }),
        };
        let o = &mut self.o;
        if o.pause.is_some() && !matches!(o.workload, Workload::Tx(_)) {
            return Err(BadValue {
                key: "burst",
                value: "only with tx=",
            });
        }
        if o.driver.queue_pairs > 1 && !o.driver.ctrl_vq {
            return Err(BadValue {
                key: "queues",
                value: "more than 1 needs ctrl_vq=1",
            });
        }
        o.reset = self.reset.finish(o.workload)?;
        if o.coalesce.is_some() && !o.driver.ctrl_vq {
            return Err(BadValue {
                key: "coalesce",
                value: "needs ctrl_vq=1",
            });
        }
        if o.coalesce.is_some() && o.driver.adaptive {
            return Err(BadValue {
                key: "coalesce",
                value: "not with adaptive=1, which sets the rx coalescing itself",
            });
        }
        Ok(self.o)
    }

    /// The workload: at most one of `tx=`, `echo=`, `rx=`, `fwd=`, `pingpong=`, `mixed=` and
    /// `calibrate=`; `window=` only with `fwd=` (1..=4096), `pingpong=` or `mixed=` (1..=64),
    /// `phase_us=` only with `mixed=`.
    fn workload(&self) -> Result<Workload, BadValue<'static>> {
        let given = [
            self.tx,
            self.echo,
            self.rx,
            self.fwd,
            self.pingpong,
            self.mixed,
            self.calibrate.map(u64::from),
        ];
        if given.iter().filter(|w| w.is_some()).count() > 1 {
            return Err(BadValue {
                key: WORKLOAD_KEYS,
                value: "more than one given",
            });
        }
        let small_window = |name| match self.window {
            Some(w) if w > MAX_PINGPONG_WINDOW => Err(BadValue {
                key: "window",
                value: name,
            }),
            w => Ok(w),
        };
        let workload = if let Some(n) = self.tx {
            Workload::Tx(n)
        } else if let Some(n) = self.echo {
            Workload::Echo(n)
        } else if let Some(n) = self.rx {
            Workload::Rx(n)
        } else if let Some(frames) = self.fwd {
            let window = self.window.unwrap_or(DEFAULT_WINDOW);
            Workload::Fwd { frames, window }
        } else if let Some(frames) = self.pingpong {
            let window = small_window("at most 64 with pingpong=")?;
            let window = window.unwrap_or(DEFAULT_PINGPONG_WINDOW);
            Workload::PingPong { frames, window }
        } else if let Some(frames) = self.mixed {
            let window = small_window("at most 64 with mixed=")?;
            Workload::Mixed {
                frames,
                window: window.unwrap_or(DEFAULT_MIXED_WINDOW),
                phase_us: self.phase_us.unwrap_or(DEFAULT_PHASE_US),
            }
        } else if let Some(n) = self.calibrate {
            Workload::Calibrate(n)
        } else {
            Workload::Idle
        };
        let windowed = matches!(
            workload,
            Workload::Fwd { .. } | Workload::PingPong { .. } | Workload::Mixed { .. }
        );
        if self.window.is_some() && !windowed {
            return Err(BadValue {
                key: "window",
                value: "only with fwd=, pingpong= or mixed=",
            });
        }
        if self.phase_us.is_some() && !matches!(workload, Workload::Mixed { .. }) {
            return Err(BadValue {
                key: "phase_us",
                value: "only with mixed=",
            });
        }
        Ok(workload)
    }
}

/// The key an error of two workloads names.
const WORKLOAD_KEYS: &str = "tx/echo/rx/fwd/pingpong/mixed/calibrate";

/// `TXP/TXU/RXP/RXU`: four numbers (decimal or `0x` hex, each fitting 32 bits).
pub fn parse_coalesce(value: &str) -> Option<Coalesce> {
    let mut parts = value.split('/');
    let mut next = || -> Option<u32> { number(parts.next()?) };
    let c = Coalesce {
        tx: Coalescing {
            max_packets: next()?,
            usecs: next()?,
        },
        rx: Coalescing {
            max_packets: next()?,
            usecs: next()?,
        },
    };
    parts.next().is_none().then_some(c)
}

/// `<size>@<base>:<irq>[:<id>]`, as Linux's virtio-mmio driver reads it (sizes and addresses
/// take a `0x` prefix and a K/M/G suffix).
pub fn parse_mmio_device(value: &str) -> Option<MmioDevice> {
    let (size, rest) = value.split_once('@')?;
    let (base, rest) = rest.split_once(':')?;
    let gsi = rest.split(':').next()?;
    let device = MmioDevice {
        size: memsize(size)?,
        base: memsize(base)?,
        gsi: number(gsi)?,
    };
    (device.size > 0 && device.base.is_multiple_of(4096)).then_some(device)
}

/// A number in decimal or `0x` hex, with an optional K/M/G suffix.
fn memsize(s: &str) -> Option<u64> {
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = number(digits)?;
    n.checked_mul(1u64 << shift)
}

/// A decimal or `0x` hex number that fits `T`.
fn number<T: TryFrom<u64>>(s: &str) -> Option<T> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok()?,
        None => s.parse::<u64>().ok()?,
    };
    T::try_from(n).ok()
}

fn flag(s: &str) -> Option<bool> {
    match s {
        "0" | "off" | "false" => Some(false),
        "1" | "on" | "true" => Some(true),
        _ => None,
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in mac.iter_mut() {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workload `line` asks for.
    fn workload(line: &str) -> Workload {
        parse(line).unwrap().workload
    }

    /// Each line of `cases` is refused for a bad value of its key.
    fn assert_bad_keys(cases: &[(&str, &str)]) {
        for &(line, key) in cases {
            let e = parse(line).unwrap_err();
            assert_eq!(e.key, key, "{line}: {e}");
        }
    }

    /// `line` is refused with the error `text`.
    fn assert_error(line: &str, text: &str) {
        let e = parse(line).unwrap_err();
        assert_eq!(alloc::format!("{e}"), text);
    }

    #[test]
    fn each_key_once() {
        for (i, (key, _)) in KEYS.iter().enumerate() {
            assert!(KEYS[i + 1..].iter().all(|(k, _)| k != key), "{key} twice");
            assert!(!matches!(*key, "reset_queue" | "reset_every"), "{key}");
        }
    }

    #[test]
    fn vmm_command_line() {
        let line = "console=ttyS0 tx=1000 size=128 kick_threshold=8 tx_completion=lazy \
                    virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 \
                    noxsave clearcpuid=151,59 rodata=off tsc_early_khz=2100000";
        let o = parse(line).unwrap();
        assert_eq!(
            o.device,
            Some(MmioDevice {
                size: 4096,
                base: 0xd000_0000,
                gsi: 5
            })
        );
        assert_eq!(o.workload, Workload::Tx(1000));
        assert_eq!(o.frame_size, 128);
        assert_eq!(o.driver.kick_threshold, 8);
        assert_eq!(o.driver.tx_completion, TxCompletion::Lazy);
        assert_eq!(o.tsc_khz, Some(2_100_000));
        assert_eq!(o.ring, Ring::Kernel);
    }

    #[test]
    fn knobs() {
        let o = parse(
            "echo=5 event_idx=0 xdp_bulk=4 ring=3 wait=poll dst=0a:0b:0c:0d:0e:0f \
             queue_size=64 batch=16 mrg_rxbuf=off timeout_ms=500 tx_completion=clean-from-rx",
        )
        .unwrap();
        assert_eq!(o.workload, Workload::Echo(5));
        assert!(!o.driver.event_idx && !o.driver.mrg_rxbuf);
        assert!(
            !o.driver.packed && !o.driver.in_order,
            "split rings by default"
        );
        let packed = parse("packed=1 in_order=1").unwrap();
        assert!(packed.driver.packed && packed.driver.in_order);
        assert!(parse("packed=maybe").is_err() && parse("in_order=2").is_err());
        assert!(!o.driver.device_stats, "off by default");
        assert!(parse("device_stats=1").unwrap().driver.device_stats);
        assert!(parse("device_stats=maybe").is_err());
        assert_eq!(o.driver.xdp_bulk, 4);
        assert_eq!((o.driver.rx_queue_size, o.driver.tx_queue_size), (64, 64));
        assert_eq!(o.driver.tx_completion, TxCompletion::CleanFromRx);
        assert_eq!(
            (o.ring, o.wait, o.batch, o.timeout_ms),
            (Ring::User, Wait::Poll, 16, 500)
        );
        assert_eq!(o.dst, [10, 11, 12, 13, 14, 15]);
        assert_eq!(workload(""), Workload::Idle);
        assert_eq!(parse("").unwrap().hostile, None);
        assert_eq!(
            parse("hostile=overlap-used").unwrap().hostile,
            Some(Hostile::OverlapUsed)
        );
    }

    #[test]
    fn adaptive_words() {
        let o = parse("tx=10").unwrap();
        assert!(!o.driver.adaptive, "off by default");
        assert_eq!(o.driver.kick_threshold_max, 64);
        let o = parse("tx=10 adaptive=1 kick_threshold_max=12 kick_threshold=4").unwrap();
        assert!(o.driver.adaptive);
        assert_eq!(
            (o.driver.kick_threshold_max, o.driver.kick_threshold),
            (12, 4)
        );
        assert_eq!(o.driver.validate(), Ok(()));
        assert!(!parse("adaptive=0").unwrap().driver.adaptive);
        assert_bad_keys(&[
            ("adaptive=2", "adaptive"),
            ("adaptive=yes", "adaptive"),
            ("kick_threshold_max=0", "kick_threshold_max"),
            ("kick_threshold_max=65", "kick_threshold_max"),
            ("kick_threshold_max=x", "kick_threshold_max"),
            ("adaptive=1 coalesce=1/2/3/4", "coalesce"),
        ]);
        // Coalescing set once by the guest stays possible without adaptation.
        assert!(parse("adaptive=0 coalesce=1/2/3/4").is_ok());
    }

    #[test]
    fn bad_values_are_errors() {
        for line in [
            "kick_threshold=x",
            "kick_threshold=70000",
            "tx_completion=sometimes",
            "event_idx=2",
            "size=10",
            "size=100000",
            "ring=1",
            "dst=01:02",
            "virtio_mmio.device=4K@0xd0000001:5",
            "virtio_mmio.device=garbage",
            "tx=1 echo=1",
            "batch=0",
            "hostile=maybe",
        ] {
            assert!(parse(line).is_err(), "{line}");
        }
        let e = parse("console=ttyS0 tx=abc").unwrap_err();
        assert_eq!((e.key, e.value), ("tx", "abc"));
    }

    #[test]
    fn calibrate_workload() {
        let o = parse("console=ttyS0 calibrate=2000 ring=3").unwrap();
        assert_eq!(o.workload, Workload::Calibrate(2000));
        assert_eq!((o.ring, o.pause), (Ring::User, None));
        assert_eq!(workload("calibrate=1"), Workload::Calibrate(1));
        assert_eq!(workload("calibrate=0x10"), Workload::Calibrate(16));
        assert_eq!(
            workload("calibrate=100000"),
            Workload::Calibrate(MAX_CALIBRATE_SAMPLES)
        );
        assert_bad_keys(&[
            ("calibrate=0", "calibrate"),
            ("calibrate=100001", "calibrate"),
            ("calibrate=-1", "calibrate"),
            ("calibrate=", "calibrate"),
            ("calibrate=many", "calibrate"),
            ("calibrate=5000000000", "calibrate"),
            ("calibrate=10 tx=5", WORKLOAD_KEYS),
            ("echo=5 calibrate=10", WORKLOAD_KEYS),
            ("calibrate=10 burst=8", "burst"),
        ]);
        let e = parse("calibrate=0").unwrap_err();
        assert_eq!((e.key, e.value), ("calibrate", "0"));
        let e = parse("tx=1 calibrate=2").unwrap_err();
        assert_eq!(e.key, WORKLOAD_KEYS);
    }

    #[test]
    fn burst_and_pause() {
        assert_eq!(parse("tx=100").unwrap().pause, None);
        let o = parse("tx=1000 burst=8 pause_us=50").unwrap();
        assert_eq!(
            o.pause,
            Some(Pause {
                burst: 8,
                pause_us: 50
            })
        );
        assert_eq!(o.workload, Workload::Tx(1000));
        // Without pause_us: flush every `burst` frames, no pause.
        assert_eq!(
            parse("pause_us=0 burst=1 tx=3").unwrap().pause,
            Some(Pause {
                burst: 1,
                pause_us: 0
            })
        );
        assert_eq!(
            parse("tx=3 burst=4").unwrap().pause,
            Some(Pause {
                burst: 4,
                pause_us: 0
            })
        );
        assert_eq!(
            parse("tx=3 burst=4 pause_us=1000000").unwrap().pause,
            Some(Pause {
                burst: 4,
                pause_us: MAX_PAUSE_US
            })
        );
        assert_bad_keys(&[
            ("tx=10 burst=0", "burst"),
            ("tx=10 burst=x pause_us=5", "burst"),
            ("tx=10 burst=4294967296", "burst"),
            ("tx=10 burst=8 pause_us=1000001", "pause_us"),
            ("tx=10 burst=8 pause_us=-3", "pause_us"),
            ("tx=10 burst=8 pause_us=", "pause_us"),
            ("tx=10 pause_us=50", "pause_us"),
            ("echo=10 burst=8 pause_us=50", "burst"),
            ("burst=8", "burst"),
        ]);
    }

    #[test]
    fn coalesce_word() {
        assert_eq!(parse("tx=10").unwrap().coalesce, None);
        let o = parse("tx=10 coalesce=64/500/0/0").unwrap();
        let c = o.coalesce.unwrap();
        assert_eq!(
            (c.tx.max_packets, c.tx.usecs, c.rx.max_packets, c.rx.usecs),
            (64, 500, 0, 0)
        );
        assert_eq!(alloc::format!("{c}"), "64/500/0/0");
        assert!(
            o.driver.ctrl_vq,
            "the control queue is negotiated by default"
        );
        let c = parse("coalesce=0x10/4294967295/1/2 echo=5")
            .unwrap()
            .coalesce
            .unwrap();
        assert_eq!(alloc::format!("{c}"), "16/4294967295/1/2");
        assert!(!parse("ctrl_vq=0").unwrap().driver.ctrl_vq);
        assert_bad_keys(&[
            ("coalesce=64/500/0", "coalesce"),
            ("coalesce=64/500/0/0/0", "coalesce"),
            ("coalesce=64/500//0", "coalesce"),
            ("coalesce=64/500/0/x", "coalesce"),
            ("coalesce=4294967296/0/0/0", "coalesce"),
            ("coalesce=-1/0/0/0", "coalesce"),
            ("coalesce=", "coalesce"),
            ("coalesce=64,500,0,0", "coalesce"),
            ("coalesce=1/2/3/4 ctrl_vq=0", "coalesce"),
            ("ctrl_vq=2", "ctrl_vq"),
        ]);
        let e = parse("tx=1 coalesce=1/2/3").unwrap_err();
        assert_eq!((e.key, e.value), ("coalesce", "1/2/3"));
    }

    #[test]
    fn transport_word() {
        assert_eq!(
            parse("").unwrap().transport,
            TransportChoice::Mmio,
            "default"
        );
        assert_eq!(
            parse("transport=pci").unwrap().transport,
            TransportChoice::Pci
        );
        assert_eq!(
            parse("transport=pci transport=mmio").unwrap().transport,
            TransportChoice::Mmio,
            "the last word wins"
        );
        for bad in ["transport=PCI", "transport=", "transport=virtio-pci"] {
            assert_eq!(parse(bad).unwrap_err().key, "transport", "{bad}");
        }
    }

    #[test]
    fn queues_word() {
        assert_eq!(parse("tx=10").unwrap().driver.queue_pairs, 1);
        assert_eq!(parse("tx=10 queues=2").unwrap().driver.queue_pairs, 2);
        assert_eq!(parse("echo=1 queues=16").unwrap().driver.queue_pairs, 16);
        assert_eq!(parse("queues=1 ctrl_vq=0").unwrap().driver.queue_pairs, 1);
        assert_bad_keys(&[
            ("queues=0", "queues"),
            ("queues=17", "queues"),
            ("queues=-1", "queues"),
            ("queues=", "queues"),
            ("queues=two", "queues"),
            ("queues=2 ctrl_vq=0", "queues"),
        ]);
        assert_error("tx=1 queues=17", "bad value for queues: \"17\"");
    }

    #[test]
    fn rx_and_fwd_workloads() {
        let o = parse("console=ttyS0 rx=100000 ring=3 wait=poll").unwrap();
        assert_eq!(o.workload, Workload::Rx(100_000));
        assert_eq!((o.wait, o.rx_budget), (Wait::Poll, DEFAULT_RX_BUDGET));
        assert_eq!(
            workload("fwd=5000 xdp_bulk=8"),
            Workload::Fwd {
                frames: 5000,
                window: DEFAULT_WINDOW
            }
        );
        assert_eq!(
            workload("window=1 fwd=0x10"),
            Workload::Fwd {
                frames: 16,
                window: 1
            }
        );
        assert_eq!(
            workload("fwd=1 window=4096"),
            Workload::Fwd {
                frames: 1,
                window: MAX_WINDOW
            }
        );
        assert_eq!(parse("rx=10 rx_budget=1").unwrap().rx_budget, 1);
        assert_eq!(parse("echo=10 rx_budget=4096").unwrap().rx_budget, 4096);
        assert_eq!(parse("fwd=10").unwrap().rx_defer_us, 0);
        assert_eq!(parse("fwd=10 rx_defer_us=20").unwrap().rx_defer_us, 20);
        assert_eq!(workload("rx=0"), Workload::Rx(0));
        assert_bad_keys(&[
            ("rx=x", "rx"),
            ("rx=-1", "rx"),
            ("rx=", "rx"),
            ("fwd=many", "fwd"),
            ("fwd=10 window=0", "window"),
            ("fwd=10 window=4097", "window"),
            ("fwd=10 window=", "window"),
            ("window=256", "window"),
            ("rx=10 window=256", "window"),
            ("tx=10 window=256", "window"),
            ("rx=1 tx=1", "tx/echo/rx/fwd/pingpong/mixed/calibrate"),
            ("rx=1 fwd=1", "tx/echo/rx/fwd/pingpong/mixed/calibrate"),
            ("fwd=1 echo=1", "tx/echo/rx/fwd/pingpong/mixed/calibrate"),
            (
                "fwd=1 calibrate=10",
                "tx/echo/rx/fwd/pingpong/mixed/calibrate",
            ),
            ("rx=1 rx_budget=0", "rx_budget"),
            ("rx=1 rx_budget=4097", "rx_budget"),
            ("rx=1 rx_budget=lots", "rx_budget"),
            ("fwd=1 rx_defer_us=10001", "rx_defer_us"),
            ("fwd=1 rx_defer_us=-1", "rx_defer_us"),
            ("rx=10 burst=8", "burst"),
            ("fwd=10 burst=8 pause_us=5", "burst"),
            ("rx=10 reset_queue=rx reset_every=5", "reset_queue"),
            ("fwd=10 reset_queue=tx reset_every=5", "reset_queue"),
        ]);
        assert_error("fwd=10 window=0", "bad value for window: \"0\"");
    }

    #[test]
    fn pingpong_workload() {
        let o = parse("console=ttyS0 pingpong=10000 ring=3 wait=poll xdp_bulk=1").unwrap();
        assert_eq!(
            o.workload,
            Workload::PingPong {
                frames: 10_000,
                window: DEFAULT_PINGPONG_WINDOW
            }
        );
        assert_eq!((o.wait, o.driver.xdp_bulk), (Wait::Poll, 1));
        assert_eq!(
            workload("window=64 pingpong=0x10 packed=1"),
            Workload::PingPong {
                frames: 16,
                window: MAX_PINGPONG_WINDOW
            }
        );
        assert_bad_keys(&[
            ("pingpong=x", "pingpong"),
            ("pingpong=", "pingpong"),
            ("pingpong=10 window=0", "window"),
            ("pingpong=10 window=65", "window"),
            (
                "pingpong=1 fwd=1",
                "tx/echo/rx/fwd/pingpong/mixed/calibrate",
            ),
            ("pingpong=1 tx=1", "tx/echo/rx/fwd/pingpong/mixed/calibrate"),
            ("pingpong=10 burst=8", "burst"),
            ("pingpong=10 reset_queue=tx reset_every=5", "reset_queue"),
        ]);
        assert_error(
            "pingpong=10 window=65",
            "bad value for window: \"at most 64 with pingpong=\"",
        );
    }

    #[test]
    fn mixed_workload() {
        let o = parse("console=ttyS0 mixed=100000 ring=3 wait=poll").unwrap();
        assert_eq!(
            o.workload,
            Workload::Mixed {
                frames: 100_000,
                window: DEFAULT_MIXED_WINDOW,
                phase_us: DEFAULT_PHASE_US
            }
        );
        assert_eq!(
            workload("phase_us=100 window=1 mixed=0x10"),
            Workload::Mixed {
                frames: 16,
                window: 1,
                phase_us: MIN_PHASE_US
            }
        );
        assert_eq!(
            workload("mixed=5 window=64 phase_us=1000000"),
            Workload::Mixed {
                frames: 5,
                window: MAX_PINGPONG_WINDOW,
                phase_us: MAX_PHASE_US
            }
        );
        assert_bad_keys(&[
            ("mixed=x", "mixed"),
            ("mixed=", "mixed"),
            ("mixed=-1", "mixed"),
            ("mixed=10 window=0", "window"),
            ("mixed=10 window=65", "window"),
            ("mixed=10 phase_us=99", "phase_us"),
            ("mixed=10 phase_us=1000001", "phase_us"),
            ("mixed=10 phase_us=", "phase_us"),
            ("mixed=10 phase_us=10ms", "phase_us"),
            ("phase_us=1000", "phase_us"),
            ("pingpong=10 phase_us=1000", "phase_us"),
            ("fwd=10 phase_us=1000", "phase_us"),
            ("mixed=1 pingpong=1", WORKLOAD_KEYS),
            ("mixed=1 fwd=1", WORKLOAD_KEYS),
            ("tx=1 mixed=1", WORKLOAD_KEYS),
            ("mixed=1 calibrate=10", WORKLOAD_KEYS),
            ("mixed=10 burst=8", "burst"),
            ("mixed=10 reset_queue=tx reset_every=5", "reset_queue"),
        ]);
        assert_error(
            "mixed=10 window=65",
            "bad value for window: \"at most 64 with mixed=\"",
        );
        assert_error(
            "phase_us=500",
            "bad value for phase_us: \"only with mixed=\"",
        );
        assert_error("mixed=10 phase_us=50", "bad value for phase_us: \"50\"");
    }

    #[test]
    fn mmio_device_forms() {
        let d = parse_mmio_device("0x1000@3489660928:7:2").unwrap();
        assert_eq!((d.size, d.base, d.gsi), (0x1000, 0xd000_0000, 7));
        assert_eq!(parse_mmio_device("1M@0xfe000000:12").unwrap().size, 1 << 20);
        assert!(parse_mmio_device("4K@0xd0000000").is_none());
    }
}
