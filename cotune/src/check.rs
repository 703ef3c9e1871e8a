//! Driver/device agreement after a trial: every kick the driver issued was seen by the device,
//! and every interrupt signal the device raised was taken by the driver.

use vnet_driver::Transport;

use crate::rig::Rig;

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
    if rig.irq_signals_taken != signals {
        return Err(format!(
            "interrupts disagree: device signalled {signals}, driver took {}",
            rig.irq_signals_taken
        ));
    }
    // virtio-pci: a device signal (which queue unknown) fires every queue's vector once, so
    // every queue vector took as many as the device signalled; the configuration vector none.
    let config_vector = rig.net.transport().config_vector();
    for (vector, taken) in rig.lines().into_iter().zip(rig.line_signals.clone()) {
        let expected = if vector.is_some() && vector == config_vector {
            0
        } else {
            signals
        };
        if taken != expected {
            return Err(format!(
                "interrupts disagree on vector {vector:?}: expected {expected}, driver took {taken}"
            ));
        }
    }
    if m.tx.malformed_chains.get() + m.rx.malformed_chains.get() != 0 {
        return Err("the device saw malformed chains from the driver".into());
    }
    Ok(())
}
