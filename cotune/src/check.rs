//! Driver/device agreement after a trial: every kick the driver issued was seen by the device,
//! and every interrupt signal the device raised was taken by the driver.

use vnet_driver::Transport;

use crate::rig::Rig;
use crate::transport::TransportKind;

/// Checks the counters of a quiesced rig (device worker stopped).
pub fn consistency(rig: &mut Rig) -> Result<(), String> {
    let d = rig.net.counters();
    let written = rig.net_transport_kicks();
    let m = &rig.metrics;
    let driver_kicks = d.kicks + d.rx_kicks;
    let device_kicks = m.tx.kicks.get() + m.rx.kicks.get();
    if driver_kicks != written || written != device_kicks {
        return Err(format!(
            "kicks disagree: driver counted {driver_kicks}, transport wrote {written}, device saw {device_kicks}"
        ));
    }
    let signals = m.irqfd_signals.get();
    if rig.transport_kind() == TransportKind::Mmio {
        if rig.irq_signals_taken != signals {
            return Err(format!(
                "interrupts disagree: device signalled {signals}, driver took {}",
                rig.irq_signals_taken
            ));
        }
    } else {
        // virtio-pci: a queue pair's signal fires the vectors of those of its queues that
        // wanted it (one or both), the control queue's its own; the configuration vector none.
        let t = rig.net.transport();
        let taken = |v: Option<u16>| {
            rig.lines()
                .iter()
                .position(|&l| l.is_some() && l == v)
                .map_or(0, |i| rig.line_signals[i])
        };
        let (rx, tx, ctrl) = (
            taken(t.queue_vector(0)),
            taken(t.queue_vector(1)),
            taken(t.queue_vector(2)),
        );
        let config = taken(t.config_vector());
        if rx.max(tx) + ctrl > signals || signals > rx + tx + ctrl {
            return Err(format!(
                "interrupts disagree: device signalled {signals}, driver took rx {rx}, tx {tx}, \
                 ctrl {ctrl} on their MSI-X vectors"
            ));
        }
        if config != 0 {
            return Err(format!("MSI-X: {config} configuration interrupts"));
        }
    }
    if m.tx.malformed_chains.get() + m.rx.malformed_chains.get() != 0 {
        return Err("the device saw malformed chains from the driver".into());
    }
    Ok(())
}
