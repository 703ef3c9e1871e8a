//! The guest program's command line: the virtio-mmio device the VMM placed
//! (`virtio_mmio.device=4K@0xd0000000:5`), the driver knobs and the workload.
//!
//! Words the program does not know (`console=`, the VMM's host quirks such as `noxsave` or
//! `clearcpuid=…`) are ignored; a known key with a bad value is an error, so that a typo in a
//! test's command line does not silently run the defaults.

use core::fmt;

use vnet_driver::{Config, TxCompletion};

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
    /// Bring the device up and report (no traffic).
    Idle,
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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            device: None,
            driver: Config::default(),
            workload: Workload::Idle,
            frame_size: 64,
            batch: 64,
            dst: [0x02, 0, 0, 0, 0, 0x01],
            ring: Ring::Kernel,
            wait: Wait::Halt,
            timeout_ms: 60_000,
            tsc_khz: None,
            hostile: None,
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

/// Parses the whole command line.
pub fn parse(cmdline: &str) -> Result<Options, BadValue<'_>> {
    let mut o = Options::default();
    let mut tx = None;
    let mut echo = None;
    for word in cmdline.split_ascii_whitespace() {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        let bad = BadValue { key, value };
        match key {
            "virtio_mmio.device" => {
                let device = parse_mmio_device(value).ok_or(bad)?;
                o.device.get_or_insert(device);
            }
            "kick_threshold" => o.driver.kick_threshold = number(value).ok_or(bad)?,
            "xdp_bulk" => o.driver.xdp_bulk = number(value).ok_or(bad)?,
            "queue_size" => {
                let size = number(value).ok_or(bad)?;
                o.driver.rx_queue_size = size;
                o.driver.tx_queue_size = size;
            }
            "event_idx" => o.driver.event_idx = flag(value).ok_or(bad)?,
            "mrg_rxbuf" => o.driver.mrg_rxbuf = flag(value).ok_or(bad)?,
            "tx_completion" => {
                o.driver.tx_completion = match value {
                    "tx-interrupt" => TxCompletion::TxInterrupt,
                    "clean-from-rx" => TxCompletion::CleanFromRx,
                    "lazy" => TxCompletion::Lazy,
                    _ => return Err(bad),
                }
            }
            "tx" => tx = Some(number(value).ok_or(bad)?),
            "echo" => echo = Some(number(value).ok_or(bad)?),
            "size" => {
                o.frame_size = number(value)
                    .filter(|s| (MIN_FRAME..=MAX_FRAME).contains(s))
                    .ok_or(bad)?
            }
            "batch" => o.batch = number(value).filter(|&b| b > 0).ok_or(bad)?,
            "dst" => o.dst = parse_mac(value).ok_or(bad)?,
            "ring" => {
                o.ring = match value {
                    "0" => Ring::Kernel,
                    "3" => Ring::User,
                    _ => return Err(bad),
                }
            }
            "wait" => {
                o.wait = match value {
                    "halt" => Wait::Halt,
                    "poll" => Wait::Poll,
                    _ => return Err(bad),
                }
            }
            "timeout_ms" => o.timeout_ms = number(value).filter(|&t| t > 0).ok_or(bad)?,
            "tsc_early_khz" => o.tsc_khz = number(value).filter(|&k| k > 0),
            "hostile" => {
                o.hostile = match value {
                    "overlap-used" => Some(Hostile::OverlapUsed),
                    _ => return Err(bad),
                }
            }
            _ => {}
        }
    }
    o.workload = match (tx, echo) {
        (Some(_), Some(_)) => {
            return Err(BadValue {
                key: "tx/echo",
                value: "both given",
            })
        }
        (Some(n), None) => Workload::Tx(n),
        (None, Some(n)) => Workload::Echo(n),
        (None, None) => Workload::Idle,
    };
    Ok(o)
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
        assert_eq!(o.driver.xdp_bulk, 4);
        assert_eq!((o.driver.rx_queue_size, o.driver.tx_queue_size), (64, 64));
        assert_eq!(o.driver.tx_completion, TxCompletion::CleanFromRx);
        assert_eq!(
            (o.ring, o.wait, o.batch, o.timeout_ms),
            (Ring::User, Wait::Poll, 16, 500)
        );
        assert_eq!(o.dst, [10, 11, 12, 13, 14, 15]);
        assert_eq!(parse("").unwrap().workload, Workload::Idle);
        assert_eq!(parse("").unwrap().hostile, None);
        assert_eq!(
            parse("hostile=overlap-used").unwrap().hostile,
            Some(Hostile::OverlapUsed)
        );
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
    fn mmio_device_forms() {
        let d = parse_mmio_device("0x1000@3489660928:7:2").unwrap();
        assert_eq!((d.size, d.base, d.gsi), (0x1000, 0xd000_0000, 7));
        assert_eq!(parse_mmio_device("1M@0xfe000000:12").unwrap().size, 1 << 20);
        assert!(parse_mmio_device("4K@0xd0000000").is_none());
    }
}
