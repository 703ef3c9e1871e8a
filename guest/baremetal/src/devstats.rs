//! The device's own counters (VIRTIO_NET_F_DEVICE_STATS), read over the control queue after
//! the workload and reported beside the driver's as the result line's `dev_*` fields.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use vnet_driver::stats::{CvqStats, RxBasic, RxSpeed, TxBasic, TxSpeed};
use vnet_driver::{CtrlError, Hal, StatsTypes, Transport, VirtioNet};

/// Reads of the data queues [`read_settled`] makes at most before it reports the last one.
pub const MAX_READS: u32 = 20;

/// One queue pair's blocks (each `None` if the device does not support its type).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairStats {
    /// The rx queue's RX_BASIC.
    pub rx: Option<RxBasic>,
    /// The rx queue's RX_SPEED.
    pub rx_speed: Option<RxSpeed>,
    /// The tx queue's TX_BASIC.
    pub tx: Option<TxBasic>,
    /// The tx queue's TX_SPEED.
    pub tx_speed: Option<TxSpeed>,
}

/// Every active pair's blocks and the control queue's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DevStats {
    /// Per active queue pair.
    pub pairs: Vec<PairStats>,
    /// The control queue's CVQ block (read last: its `command_num` counts every statistics
    /// command, that one included).
    pub cvq: Option<CvqStats>,
    /// Reads of the data queues made (see [`read_settled`]).
    pub reads: u32,
}

/// Why the statistics could not be read.
fn failed(what: &str, vq: u16, e: CtrlError) -> String {
    alloc::format!("device_stats: {what} of queue {vq}: {e}")
}

/// One read of every active pair's rx and tx queue, the types of `supported` that fit each.
fn read_pairs<H: Hal, T: Transport>(
    net: &mut VirtioNet<H, T>,
    supported: StatsTypes,
) -> Result<Vec<PairStats>, String> {
    let mut pairs = Vec::new();
    for pair in 0..net.active_queue_pairs() {
        let mut p = PairStats::default();
        for vq in [2 * pair, 2 * pair + 1] {
            let types = net.stats_types_of(vq) & supported;
            if types.is_empty() {
                continue;
            }
            let s = net.get_stats(vq, types).map_err(|e| failed("GET", vq, e))?;
            p.rx = p.rx.or(s.rx_basic);
            p.rx_speed = p.rx_speed.or(s.rx_speed);
            p.tx = p.tx.or(s.tx_basic);
            p.tx_speed = p.tx_speed.or(s.tx_speed);
        }
        pairs.push(p);
    }
    Ok(pairs)
}

/// QUERY, then GET of every active pair's queues until two reads in a row agree (the device
/// counts a notification when its worker reads the eventfd, which can come just after it
/// answers a command), `pause` between reads, at most [`MAX_READS`]; then the control
/// queue's CVQ.
pub fn read_settled<H: Hal, T: Transport>(
    net: &mut VirtioNet<H, T>,
    mut pause: impl FnMut(),
) -> Result<DevStats, String> {
    let ctrl = net.ctrl_queue_index().unwrap_or(2);
    let supported = net.query_stats().map_err(|e| failed("QUERY", ctrl, e))?;
    let mut pairs = read_pairs(net, supported)?;
    let mut reads = 1;
    while reads < MAX_READS {
        pause();
        let again = read_pairs(net, supported)?;
        reads += 1;
        let settled = again == pairs;
        pairs = again;
        if settled {
            break;
        }
    }
    let cvq = if supported.contains(StatsTypes::CVQ) {
        net.get_stats(ctrl, StatsTypes::CVQ)
            .map_err(|e| failed("GET", ctrl, e))?
            .cvq
    } else {
        None
    };
    Ok(DevStats { pairs, cvq, reads })
}

/// Sums `f` over the pairs whose block is there; `None` if no pair has it.
fn sum<B: Copy>(
    pairs: &[PairStats],
    block: impl Fn(&PairStats) -> Option<B>,
    f: impl Fn(B) -> u64,
) -> Option<u64> {
    pairs
        .iter()
        .filter_map(&block)
        .map(f)
        .reduce(|a, b| a.wrapping_add(b))
}

impl DevStats {
    /// Writes the `,"dev_…":N` fields of the result line's top level: the counters summed
    /// over the pairs, then the control queue's (a field is left out if the device does not
    /// support its block).
    pub fn write_totals<W: Write>(&self, w: &mut W) -> fmt::Result {
        let p = &self.pairs[..];
        let rx = |f: fn(RxBasic) -> u64| sum(p, |s| s.rx, f);
        let tx = |f: fn(TxBasic) -> u64| sum(p, |s| s.tx, f);
        let rx_speed = |f: fn(RxSpeed) -> u64| sum(p, |s| s.rx_speed, f);
        let tx_speed = |f: fn(TxSpeed) -> u64| sum(p, |s| s.tx_speed, f);
        let fields = [
            ("dev_tx_packets", tx(|b| b.tx_packets)),
            ("dev_tx_bytes", tx(|b| b.tx_bytes)),
            ("dev_tx_notifications", tx(|b| b.tx_notifications)),
            ("dev_tx_interrupts", tx(|b| b.tx_interrupts)),
            ("dev_tx_drops", tx(|b| b.tx_drops)),
            ("dev_tx_drop_malformed", tx(|b| b.tx_drop_malformed)),
            ("dev_rx_packets", rx(|b| b.rx_packets)),
            ("dev_rx_bytes", rx(|b| b.rx_bytes)),
            ("dev_rx_notifications", rx(|b| b.rx_notifications)),
            ("dev_rx_interrupts", rx(|b| b.rx_interrupts)),
            ("dev_rx_drops", rx(|b| b.rx_drops)),
            ("dev_rx_drop_overruns", rx(|b| b.rx_drop_overruns)),
            (
                "dev_tx_packets_allowance_exceeded",
                tx_speed(|b| b.tx_packets_allowance_exceeded),
            ),
            (
                "dev_tx_bytes_allowance_exceeded",
                tx_speed(|b| b.tx_bytes_allowance_exceeded),
            ),
            (
                "dev_rx_packets_allowance_exceeded",
                rx_speed(|b| b.rx_packets_allowance_exceeded),
            ),
            (
                "dev_rx_bytes_allowance_exceeded",
                rx_speed(|b| b.rx_bytes_allowance_exceeded),
            ),
            ("dev_ctrl_commands", self.cvq.map(|c| c.command_num)),
            ("dev_ctrl_ok", self.cvq.map(|c| c.ok_num)),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                write!(w, ",\"{name}\":{v}")?;
            }
        }
        write!(w, ",\"dev_stats_reads\":{}", self.reads)
    }

    /// Writes pair `i`'s `,"dev_…":N` fields inside its `queues` entry, named after the
    /// driver's own keys there (nothing if the pair has no blocks).
    pub fn write_pair<W: Write>(&self, i: usize, w: &mut W) -> fmt::Result {
        let Some(p) = self.pairs.get(i) else {
            return Ok(());
        };
        if let Some(tx) = p.tx {
            write!(
                w,
                ",\"dev_tx\":{},\"dev_kicks\":{},\"dev_irqs_tx\":{}",
                tx.tx_packets, tx.tx_notifications, tx.tx_interrupts
            )?;
        }
        if let Some(rx) = p.rx {
            write!(
                w,
                ",\"dev_rx\":{},\"dev_rx_kicks\":{},\"dev_irqs_rx\":{}",
                rx.rx_packets, rx.rx_notifications, rx.rx_interrupts
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(n: u64) -> PairStats {
        PairStats {
            rx: Some(RxBasic {
                rx_packets: n,
                rx_notifications: 1,
                rx_interrupts: 2,
                ..RxBasic::default()
            }),
            rx_speed: None,
            tx: Some(TxBasic {
                tx_packets: 10 * n,
                tx_notifications: 3,
                tx_interrupts: 4,
                tx_bytes: 640 * n,
                ..TxBasic::default()
            }),
            tx_speed: Some(TxSpeed::default()),
        }
    }

    #[test]
    fn totals_sum_the_pairs_and_leave_out_unsupported_blocks() {
        let s = DevStats {
            pairs: alloc::vec![pair(1), pair(2)],
            cvq: Some(CvqStats {
                command_num: 7,
                ok_num: 6,
            }),
            reads: 2,
        };
        let mut line = String::new();
        s.write_totals(&mut line).unwrap();
        for field in [
            ",\"dev_tx_packets\":30,\"dev_tx_bytes\":1920,\"dev_tx_notifications\":6,\
             \"dev_tx_interrupts\":8,",
            ",\"dev_rx_packets\":3,",
            ",\"dev_tx_packets_allowance_exceeded\":0,",
            ",\"dev_ctrl_commands\":7,\"dev_ctrl_ok\":6,\"dev_stats_reads\":2",
        ] {
            assert!(line.contains(field), "{field} missing in {line}");
        }
        assert!(!line.contains("dev_rx_packets_allowance"), "{line}");
        let mut q = String::new();
        s.write_pair(1, &mut q).unwrap();
        assert_eq!(
            q,
            ",\"dev_tx\":20,\"dev_kicks\":3,\"dev_irqs_tx\":4,\"dev_rx\":2,\"dev_rx_kicks\":1,\
             \"dev_irqs_rx\":2"
        );
        let mut q = String::new();
        s.write_pair(2, &mut q).unwrap();
        assert!(q.is_empty());
    }
}
