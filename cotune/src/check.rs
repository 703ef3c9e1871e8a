//! Driver/device agreement after a trial: every kick the driver issued was seen by the device,
//! every interrupt signal the device raised was taken by the driver, and the device's own
//! counters (VIRTIO_NET_F_DEVICE_STATS, read by the driver over the control queue; the
//! device's metrics where it is not negotiated) agree with the driver's: frames sent and
//! received, notifications, interrupts and control commands.

use serde_json::Value;
use vnet_driver::features::NET_F_DEVICE_STATS;
use vnet_driver::{StatsTypes, Transport, VirtioNet};

/// The device's counters the agreement check uses, summed over the active queue pairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Frames sent (TX_BASIC `tx_packets`).
    pub tx_packets: u64,
    /// Frames dropped on transmit (TX_BASIC `tx_drops`).
    pub tx_drops: u64,
    /// Tx notifications (TX_BASIC `tx_notifications`).
    pub tx_notifications: u64,
    /// Tx interrupt decisions (TX_BASIC `tx_interrupts`).
    pub tx_interrupts: u64,
    /// Frames delivered (RX_BASIC `rx_packets`).
    pub rx_packets: u64,
    /// Rx notifications (RX_BASIC `rx_notifications`).
    pub rx_notifications: u64,
    /// Rx interrupt decisions (RX_BASIC `rx_interrupts`).
    pub rx_interrupts: u64,
    /// CVQ `command_num` and `ok_num`, when read over the control queue.
    pub cvq: Option<(u64, u64)>,
}

/// The driver's side of the comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Frames the device returned (tx chains reclaimed, and used but not reclaimed yet).
    pub tx_completed: u64,
    /// Frames queued (copy and AF_XDP transmit, and XDP_TX) and not returned yet: 0 after a
    /// final drain; in co-simulation frames a stopped peer's full socket holds back.
    pub tx_in_flight: u64,
    /// Tx notifications issued.
    pub kicks: u64,
    /// Rx notifications issued.
    pub rx_kicks: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Frames the device may have delivered that the driver has not polled yet (its rx used
    /// entries not popped; in a VM, the rx rings' size).
    pub rx_slack: u64,
    /// Control commands queued.
    pub ctrl_commands: u64,
    /// Control commands not ended in VIRTIO_NET_OK.
    pub ctrl_failed: u64,
}

/// Interrupts the driver took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// On one line shared by the rx and tx queues (virtio-mmio).
    Shared(u64),
    /// On the rx and tx queues' own MSI-X vectors (virtio-pci).
    PerQueue {
        /// On the rx queue's vector.
        rx: u64,
        /// On the tx queue's vector.
        tx: u64,
    },
}

/// The relations that must hold between the driver's counters and the device's:
/// - `tx_packets + tx_drops` = frames the device returned to the driver (the frames queued,
///   less those still in flight);
/// - `tx_notifications` = tx kicks and `rx_notifications` = rx kicks (the device counts
///   eventfd values: kicks the eventfd merged still add up);
/// - `rx_packets` ≥ frames the driver received, by at most the frames it had not polled yet;
/// - interrupts: on a shared line each signal the driver took stands for at least one
///   interrupt decision of the rx or tx queue (one signal can serve both, and coalescing
///   merges several), so taken ≤ `rx_interrupts + tx_interrupts`, and some were taken if the
///   device decided any; on MSI-X the same per queue;
/// - CVQ (read last): `command_num` = the driver's commands, `ok_num` = its commands that
///   ended in VIRTIO_NET_OK, less the GET being answered.
pub fn device_agreement(
    d: &DriverCounters,
    dev: &DeviceCounters,
    taken: Taken,
) -> Result<(), String> {
    if dev.tx_packets + dev.tx_drops != d.tx_completed {
        return Err(format!(
            "tx frames disagree: the device returned {} to the driver ({} more in flight), \
             it counts {} sent and {} dropped",
            d.tx_completed, d.tx_in_flight, dev.tx_packets, dev.tx_drops
        ));
    }
    if dev.tx_notifications != d.kicks || dev.rx_notifications != d.rx_kicks {
        return Err(format!(
            "notifications disagree: driver kicked tx {} rx {}, device counted tx {} rx {}",
            d.kicks, d.rx_kicks, dev.tx_notifications, dev.rx_notifications
        ));
    }
    if dev.rx_packets < d.rx_frames || dev.rx_packets - d.rx_frames > d.rx_slack {
        return Err(format!(
            "rx frames disagree: driver received {} (up to {} more not polled), device \
             delivered {}",
            d.rx_frames, d.rx_slack, dev.rx_packets
        ));
    }
    let pairs = match taken {
        Taken::Shared(n) => vec![("", n, dev.rx_interrupts + dev.tx_interrupts)],
        Taken::PerQueue { rx, tx } => vec![
            (" on the rx vector", rx, dev.rx_interrupts),
            (" on the tx vector", tx, dev.tx_interrupts),
        ],
    };
    for (which, taken, decided) in pairs {
        if taken > decided || (taken == 0) != (decided == 0) {
            return Err(format!(
                "interrupts disagree: driver took {taken}{which}, device decided {decided} \
                 (rx {}, tx {})",
                dev.rx_interrupts, dev.tx_interrupts
            ));
        }
    }
    if let Some((commands, ok)) = dev.cvq {
        let driver_ok = d.ctrl_commands.saturating_sub(d.ctrl_failed + 1);
        if commands != d.ctrl_commands || ok != driver_ok {
            return Err(format!(
                "control commands disagree: driver sent {} ({} failed), device took {commands} \
                 and acknowledged {ok} OK before the last",
                d.ctrl_commands, d.ctrl_failed
            ));
        }
    }
    Ok(())
}

/// Reads the device's counters over the control queue (VIRTIO_NET_F_DEVICE_STATS): QUERY,
/// GET of every active pair's rx and tx queue, then the control queue's CVQ. `None` if the
/// feature is not negotiated.
pub fn read_device_stats<H: vnet_driver::Hal, T: Transport>(
    net: &mut VirtioNet<H, T>,
) -> Option<Result<DeviceCounters, String>> {
    if net.features() & NET_F_DEVICE_STATS == 0 {
        return None;
    }
    let read = |net: &mut VirtioNet<H, T>| -> Result<DeviceCounters, String> {
        let supported = net.query_stats().map_err(|e| format!("STATS QUERY: {e}"))?;
        let mut c = DeviceCounters::default();
        for vq in 0..2 * net.active_queue_pairs() {
            let types =
                net.stats_types_of(vq) & supported & (StatsTypes::RX_BASIC | StatsTypes::TX_BASIC);
            if types.is_empty() {
                return Err(format!(
                    "queue {vq}: the device supports no basic statistics"
                ));
            }
            let s = net
                .get_stats(vq, types)
                .map_err(|e| format!("STATS GET of queue {vq}: {e}"))?;
            if let Some(rx) = s.rx_basic {
                c.rx_packets += rx.rx_packets;
                c.rx_notifications += rx.rx_notifications;
                c.rx_interrupts += rx.rx_interrupts;
            }
            if let Some(tx) = s.tx_basic {
                c.tx_packets += tx.tx_packets;
                c.tx_drops += tx.tx_drops;
                c.tx_notifications += tx.tx_notifications;
                c.tx_interrupts += tx.tx_interrupts;
            }
        }
        if let Some(ctrl) = net.ctrl_queue_index() {
            if supported.contains(StatsTypes::CVQ) {
                let s = net
                    .get_stats(ctrl, StatsTypes::CVQ)
                    .map_err(|e| format!("STATS GET of the control queue: {e}"))?;
                c.cvq = s.cvq.map(|q| (q.command_num, q.ok_num));
            }
        }
        Ok(c)
    };
    Some(read(net))
}

/// The device's counters straight from its metrics (the co-simulation shares them).
pub(crate) fn from_metrics(m: &devices::virtio::net::NetMetrics) -> DeviceCounters {
    DeviceCounters {
        tx_packets: m.tx.frames.get(),
        tx_drops: m.tx.backend_errors.get() + m.tx.malformed_chains.get(),
        tx_notifications: m.tx.kicks.get(),
        tx_interrupts: m.tx.interrupts_raised.get(),
        rx_packets: m.rx.frames.get(),
        rx_notifications: m.rx.kicks.get(),
        rx_interrupts: m.rx.interrupts_raised.get(),
        cvq: None,
    }
}

/// A field of the driver guest's result line.
fn num(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// The same agreement in a VM, from the driver guest's result line (`{"driver":…}`'s object):
/// its `dev_*` fields against its own counters. `Ok(None)` when the line has no device
/// statistics (not negotiated, or a guest that does not read them), with the reason.
pub fn vm_device_agreement(report: &Value) -> Result<Option<&'static str>, String> {
    match num(report, "device_stats") {
        None => {
            return Ok(Some(
                "this driver guest does not read the device's statistics",
            ))
        }
        Some(0) => return Ok(Some("VIRTIO_NET_F_DEVICE_STATS not negotiated")),
        Some(_) => {}
    }
    if let Some(e) = report.get("dev_stats_error") {
        return Err(format!(
            "the driver guest could not read the device's statistics: {e}"
        ));
    }
    let field = |key: &str| num(report, key).ok_or_else(|| format!("no {key} in {report}"));
    let dev = DeviceCounters {
        tx_packets: field("dev_tx_packets")?,
        tx_drops: field("dev_tx_drops")?,
        tx_notifications: field("dev_tx_notifications")?,
        tx_interrupts: field("dev_tx_interrupts")?,
        rx_packets: field("dev_rx_packets")?,
        rx_notifications: field("dev_rx_notifications")?,
        rx_interrupts: field("dev_rx_interrupts")?,
        cvq: match (num(report, "dev_ctrl_commands"), num(report, "dev_ctrl_ok")) {
            (Some(c), Some(o)) => Some((c, o)),
            _ => None,
        },
    };
    // The guest waits for the device to return every tx buffer before it reports.
    let (sent, reclaimed) = (
        field("tx_frames")? + field("xdp_tx")?,
        field("tx_reclaimed")?,
    );
    if sent != reclaimed {
        return Err(format!(
            "{} tx frames still in flight after the guest's final drain",
            sent.abs_diff(reclaimed)
        ));
    }
    let driver = DriverCounters {
        tx_completed: reclaimed,
        tx_in_flight: 0,
        kicks: field("kicks")?,
        rx_kicks: field("rx_kicks")?,
        rx_frames: field("rx_frames")?,
        // Frames delivered after the workload's last poll stay on the rings.
        rx_slack: field("rx_queue_size")? * field("queue_pairs")?.max(1),
        ctrl_commands: field("ctrl_commands")?,
        ctrl_failed: field("ctrl_failed")?,
    };
    let taken = if report.get("transport").and_then(Value::as_str) == Some("pci") {
        Taken::PerQueue {
            rx: field("irqs_rx")?,
            tx: field("irqs_tx")?,
        }
    } else {
        Taken::Shared(field("irqs_taken")?)
    };
    device_agreement(&driver, &dev, taken).map(|()| None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agreeing() -> (DriverCounters, DeviceCounters) {
        let d = DriverCounters {
            tx_completed: 1000,
            tx_in_flight: 2,
            kicks: 40,
            rx_kicks: 3,
            rx_frames: 500,
            rx_slack: 4,
            ctrl_commands: 6,
            ctrl_failed: 0,
        };
        let dev = DeviceCounters {
            tx_packets: 1000,
            tx_drops: 0,
            tx_notifications: 40,
            tx_interrupts: 30,
            rx_packets: 502,
            rx_notifications: 3,
            rx_interrupts: 20,
            cvq: Some((6, 5)),
        };
        (d, dev)
    }

    #[test]
    fn agreeing_counters_pass() {
        let (d, dev) = agreeing();
        device_agreement(&d, &dev, Taken::Shared(45)).unwrap();
        device_agreement(&d, &dev, Taken::PerQueue { rx: 20, tx: 1 }).unwrap();
        // Drops count as sent, the metrics source has no CVQ.
        let dev2 = DeviceCounters {
            tx_packets: 990,
            tx_drops: 10,
            cvq: None,
            ..dev
        };
        device_agreement(&d, &dev2, Taken::Shared(1)).unwrap();
    }

    #[test]
    fn each_disagreement_fails() {
        let (d, dev) = agreeing();
        let cases: [(DeviceCounters, Taken, &str); 8] = [
            (
                DeviceCounters {
                    tx_packets: 999,
                    ..dev
                },
                Taken::Shared(1),
                "tx frames",
            ),
            (
                DeviceCounters {
                    tx_notifications: 39,
                    ..dev
                },
                Taken::Shared(1),
                "notifications",
            ),
            (
                DeviceCounters {
                    rx_notifications: 4,
                    ..dev
                },
                Taken::Shared(1),
                "notifications",
            ),
            (
                DeviceCounters {
                    rx_packets: 499,
                    ..dev
                },
                Taken::Shared(1),
                "rx frames",
            ),
            (
                DeviceCounters {
                    rx_packets: 505,
                    ..dev
                },
                Taken::Shared(1),
                "rx frames",
            ),
            (dev, Taken::Shared(51), "interrupts"),
            (dev, Taken::PerQueue { rx: 21, tx: 0 }, "interrupts"),
            (
                DeviceCounters {
                    cvq: Some((6, 6)),
                    ..dev
                },
                Taken::Shared(1),
                "control",
            ),
        ];
        for (dev, taken, what) in cases {
            let e = device_agreement(&d, &dev, taken).unwrap_err();
            assert!(e.starts_with(what), "{e}");
        }
        // No interrupt taken although the device decided some.
        let e = device_agreement(&d, &dev, Taken::Shared(0)).unwrap_err();
        assert!(e.starts_with("interrupts"), "{e}");
    }

    #[test]
    fn vm_result_lines() {
        let line = |extra: &str| -> Value {
            serde_json::from_str(&format!(
                "{{\"transport\":\"mmio\",\"device_stats\":1,\"tx_frames\":100,\"xdp_tx\":0,\
                 \"kicks\":13,\"rx_kicks\":1,\"rx_frames\":0,\"tx_reclaimed\":100,\"rx_queue_size\":256,\
                 \"queue_pairs\":1,\"ctrl_commands\":5,\"ctrl_failed\":0,\"irqs_taken\":4,\
                 \"irqs_rx\":0,\"irqs_tx\":0,\"dev_tx_packets\":100,\"dev_tx_drops\":0,\
                 \"dev_tx_notifications\":13,\"dev_tx_interrupts\":4,\"dev_rx_packets\":0,\
                 \"dev_rx_notifications\":1,\"dev_rx_interrupts\":0,\"dev_ctrl_commands\":5,\
                 \"dev_ctrl_ok\":4{extra}}}"
            ))
            .unwrap()
        };
        assert_eq!(vm_device_agreement(&line("")), Ok(None));
        let e = vm_device_agreement(&line(",\"dev_stats_error\":\"x\"")).unwrap_err();
        assert!(e.contains("could not read"), "{e}");
        let mut v = line("");
        v["dev_tx_notifications"] = 12.into();
        assert!(vm_device_agreement(&v).is_err());
        let mut w = line("");
        w["tx_reclaimed"] = 99.into();
        let e = vm_device_agreement(&w).unwrap_err();
        assert!(e.contains("in flight"), "{e}");
        v["device_stats"] = 0.into();
        assert!(vm_device_agreement(&v).unwrap().is_some());
        let old: Value = serde_json::from_str("{\"tx_frames\":1}").unwrap();
        assert!(vm_device_agreement(&old).unwrap().is_some());
    }
}
