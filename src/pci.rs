//! Virtio devices on PCI: bus 0 behind ports 0xCF8–0xCFF (host bridge at 00:00.0, devices
//! from 00:01.0), BAR0 placement in the PCI MMIO window, one GSI per MSI-X vector, and the
//! guest's BAR moves.
//!
//! # Layout
//!
//! | range / numbers | what |
//! |---|---|
//! | `0 .. min(RAM, 0xd000_0000)` | RAM (e820) |
//! | [`crate::memory::MMIO_START`] + 4 KiB × index | virtio-mmio devices |
//! | [`PCI_MMIO_START`] .. [`PCI_MMIO_END`] | PCI window: BAR0s (32 KiB each, naturally aligned) |
//! | `0xfec0_0000`, `0xfee0_0000` | IOAPIC, local APIC (KVM's) |
//! | GSI 0–23 | IOAPIC pins (legacy devices, virtio-mmio from 5) |
//! | GSI [`FIRST_MSI_GSI`].. | one per MSI-X vector of each PCI device, in device order |
//!
//! The window is not RAM and not in the e820 map: the guest finds the BARs where the VMM put
//! them (it reads the BARs; Linux keeps assignments that do not conflict) and sees the hole.
//! A BAR the guest moves is followed (MMIO range and ioeventfds) when the new range lies in
//! the window and is free; otherwise the BAR stops decoding (no MMIO range, no ioeventfds)
//! until it is moved somewhere acceptable, with a warning: guest input never panics the VMM.
//! Once BAR0 decodes at its new place every queue is kicked once (a notification written to
//! the old place in between was lost).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use devices::pci::bus::{PciBusError, PciConfigIo, PCI_CONFIG_IO_LEN, PCI_CONFIG_IO_PORT};
use devices::pci::BarMove;
use devices::virtio::pci::{VirtioPciTransport, BAR0_SIZE};

use crate::boot::mptable;
use crate::bus::{Bus, BusError};
use crate::kvm::{GsiRouting, IoEvents, KvmError, Vm};

/// First address of the PCI MMIO window (above the virtio-mmio slots at 0xd000_0000).
pub const PCI_MMIO_START: u64 = 0xe000_0000;
/// End of the PCI MMIO window (the IOAPIC's page).
pub const PCI_MMIO_END: u64 = mptable::IOAPIC_ADDR as u64;
/// The first GSI of MSI-X vectors: just above the IOAPIC's pins.
pub const FIRST_MSI_GSI: u32 = mptable::IOAPIC_PINS as u32;

/// Why a PCI device could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum PciError {
    #[error("no room for a {size:#x}-byte BAR in the PCI MMIO window")]
    WindowFull { size: u64 },
    #[error(transparent)]
    Bus(#[from] PciBusError),
    #[error("cannot map BAR0")]
    Map(#[source] BusError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
}

/// Whether the guest may put a BAR of `size` bytes at `base`: naturally aligned, inside the
/// PCI window (so neither RAM, the virtio-mmio slots nor the APICs).
pub fn bar_range_allowed(base: u64, size: u64) -> bool {
    size.is_power_of_two()
        && base.is_multiple_of(size)
        && base >= PCI_MMIO_START
        && base
            .checked_add(size)
            .is_some_and(|end| end <= PCI_MMIO_END)
}

/// Hands out naturally aligned BAR ranges from the window, lowest first.
#[derive(Debug)]
pub struct BarAllocator {
    next: u64,
}

impl Default for BarAllocator {
    fn default() -> Self {
        BarAllocator {
            next: PCI_MMIO_START,
        }
    }
}

impl BarAllocator {
    /// The next `size`-aligned range of `size` bytes (a power of two).
    pub fn allocate(&mut self, size: u64) -> Option<u64> {
        if !size.is_power_of_two() {
            return None;
        }
        let base = self.next.checked_next_multiple_of(size)?;
        bar_range_allowed(base, size).then(|| {
            self.next = base + size;
            base
        })
    }
}

/// One device's BAR0 as the VMM has it mapped.
struct MappedBar {
    transport: Arc<Mutex<VirtioPciTransport>>,
    /// Where BAR0 decodes (MMIO range and ioeventfds), `None` after a refused move.
    at: Option<u64>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bus 0 as the VMM builds it: the configuration ports, BAR and GSI allocation.
pub struct PciSetup {
    config_io: Arc<Mutex<PciConfigIo>>,
    bars: BarAllocator,
    next_gsi: u32,
    mapped: BTreeMap<u8, MappedBar>,
}

impl Default for PciSetup {
    fn default() -> Self {
        PciSetup {
            config_io: Arc::new(Mutex::new(PciConfigIo::new())),
            bars: BarAllocator::default(),
            next_gsi: FIRST_MSI_GSI,
            mapped: BTreeMap::new(),
        }
    }
}

/// Where a device went.
#[derive(Clone, Copy, Debug)]
pub struct PciPlacement {
    /// Device number on bus 0.
    pub slot: u8,
    /// BAR0's address.
    pub bar0: u64,
    /// GSIs `first_gsi .. first_gsi + vectors` carry the MSI-X vectors.
    pub first_gsi: u32,
    /// MSI-X vectors.
    pub vectors: u16,
}

impl PciSetup {
    /// Puts `transport` on the bus: the next device number, BAR0 in the window, an irqfd per
    /// MSI-X vector on GSIs of its own with a route handler that follows the guest's table,
    /// ioeventfds on every queue's notify address, and BAR0 on `mmio`.
    pub fn attach(
        &mut self,
        vm: &Vm,
        mmio: &Bus,
        mut transport: VirtioPciTransport,
    ) -> Result<(Arc<Mutex<VirtioPciTransport>>, PciPlacement), PciError> {
        let slot = lock(&self.config_io).next_free_slot()?;
        let bar0 = self
            .bars
            .allocate(BAR0_SIZE)
            .ok_or(PciError::WindowFull { size: BAR0_SIZE })?;
        transport.set_bar0_address(bar0);
        let vectors = transport.msix_vectors().clone();
        let first_gsi = self.next_gsi;
        for v in 0..vectors.len() {
            if let Some(irqfd) = vectors.irqfd(v) {
                vm.register_irqfd(irqfd, first_gsi + u32::from(v))?;
            }
        }
        self.next_gsi += u32::from(vectors.len());
        transport.set_msix_route_handler(route_handler(vm.gsi_routing().clone(), first_gsi));
        let ioevents = vm.ioevents();
        for (evt, addr, _len) in transport.ioeventfds(bar0) {
            ioevents.register(evt, addr)?;
        }
        let transport = Arc::new(Mutex::new(transport));
        mmio.insert(transport.clone(), bar0, BAR0_SIZE)
            .map_err(PciError::Map)?;
        lock(&self.config_io).add_device(slot, transport.clone())?;
        self.mapped.insert(
            slot,
            MappedBar {
                transport: transport.clone(),
                at: Some(bar0),
            },
        );
        Ok((
            transport,
            PciPlacement {
                slot,
                bar0,
                first_gsi,
                vectors: vectors.len(),
            },
        ))
    }

    /// Puts the configuration ports on `pio` and starts following the guest's BAR moves.
    ///
    /// The ports are there even when no device was attached: a guest then finds bus 0 with
    /// its host bridge alone. Without them a Linux guest built with PCI support logs
    /// "PCI: Fatal: No config space access function found" on every virtio-mmio boot, which
    /// reads like an error and is none.
    pub fn finish(self, vm: &Vm, pio: &Bus, mmio: &Bus) -> Result<(), BusError> {
        if !self.mapped.is_empty() {
            let mut bars = BarMoves {
                mapped: self.mapped,
                mmio: mmio.clone(),
                ioevents: vm.ioevents(),
            };
            lock(&self.config_io)
                .set_bar_move_handler(Box::new(move |slot, moved| bars.moved(slot, moved)));
        }
        pio.insert(self.config_io, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_LEN)
    }
}

/// Installs the MSI route of a vector when the guest makes its message effective (vCPU
/// thread, inside the MSI-X table or Message Control write).
fn route_handler(routing: Arc<GsiRouting>, first_gsi: u32) -> devices::pci::msix::RouteHandler {
    Box::new(move |vector, msg| {
        let gsi = first_gsi + u32::from(vector);
        if let Err(e) = routing.set_msi(gsi, msg.address, msg.data) {
            log::warn!(
                "MSI-X vector {vector} (GSI {gsi}) → {:#x}/{:#x}: {}",
                msg.address,
                msg.data,
                crate::error_chain(&e)
            );
        }
    })
}

/// Follows BAR moves (runs on the vCPU thread that wrote the BAR).
struct BarMoves {
    mapped: BTreeMap<u8, MappedBar>,
    mmio: Bus,
    ioevents: IoEvents,
}

impl BarMoves {
    fn moved(&mut self, slot: u8, moved: BarMove) {
        let Some(bar) = self.mapped.get_mut(&slot) else {
            return;
        };
        if moved.bar != 0 || bar.at == Some(moved.new) {
            return;
        }
        let size = moved.size;
        let acceptable = bar_range_allowed(moved.new, size) && self.mmio.is_free(moved.new, size);
        let transport = bar.transport.clone();
        let t = lock(&transport);
        if let Some(old) = bar.at.take() {
            for (evt, addr, _) in t.ioeventfds(old) {
                if let Err(e) = self.ioevents.unregister(evt, addr) {
                    log::warn!("00:{slot:02x}.0: {}", crate::error_chain(&e));
                }
            }
            if let Err(e) = self.mmio.remove(old) {
                log::warn!("00:{slot:02x}.0: BAR0 at {old:#x}: {e}");
            }
        }
        if !acceptable {
            log::warn!(
                "00:{slot:02x}.0: the guest moved BAR0 to {:#x}, outside the PCI window \
                 {PCI_MMIO_START:#x}..{PCI_MMIO_END:#x}, misaligned or onto another device: \
                 BAR0 does not decode until it is moved back",
                moved.new
            );
            return;
        }
        // The device's lock is held; the bus takes only its map's lock.
        if let Err(e) = self.mmio.insert(transport.clone(), moved.new, size) {
            log::warn!("00:{slot:02x}.0: BAR0 at {:#x}: {e}", moved.new);
            return;
        }
        for (evt, addr, _) in t.ioeventfds(moved.new) {
            if let Err(e) = self.ioevents.register(evt, addr) {
                log::warn!("00:{slot:02x}.0: {}", crate::error_chain(&e));
            }
            // A notification the driver wrote while BAR0 was elsewhere was lost (and with
            // EVENT_IDX it would not notify again): one spurious kick per queue makes the
            // workers look at their rings; with nothing there it costs one empty pass.
            if let Err(e) = evt.write(1) {
                log::warn!("00:{slot:02x}.0: queue kick after the move: {e}");
            }
        }
        bar.at = Some(moved.new);
        log::info!("00:{slot:02x}.0: BAR0 moved to {:#x}", moved.new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot;
    use crate::memory;

    #[test]
    fn bars_are_aligned_inside_the_window_and_off_ram() {
        let mut a = BarAllocator::default();
        let first = a.allocate(BAR0_SIZE).unwrap();
        assert_eq!(first, PCI_MMIO_START);
        assert_eq!(a.allocate(0x1000), Some(PCI_MMIO_START + BAR0_SIZE));
        // Natural alignment after a smaller BAR.
        assert_eq!(a.allocate(BAR0_SIZE), Some(PCI_MMIO_START + 2 * BAR0_SIZE));
        assert_eq!(a.allocate(0x3000), None, "not a power of two");
        assert_eq!(a.allocate(1 << 40), None, "larger than the window");
        // Every e820 RAM range of the largest guest ends below the window or starts above 4 GiB.
        for entry in boot::e820_map(crate::config::MAX_MEM_MIB << 20) {
            let (addr, size) = (entry.addr, entry.size);
            assert!(
                addr + size <= memory::MMIO_START || addr >= memory::FOUR_GIB,
                "{addr:#x}+{size:#x}"
            );
        }
        // The last virtio-mmio slot, the IOAPIC and the LAPIC are outside the window.
        let (last_mmio, _) = boot::virtio_slot(boot::MAX_VIRTIO_DEVICES - 1);
        assert!(last_mmio + boot::MMIO_DEVICE_SIZE <= PCI_MMIO_START);
        assert!(PCI_MMIO_END <= u64::from(mptable::IOAPIC_ADDR));
        assert!(PCI_MMIO_END <= u64::from(mptable::APIC_ADDR));
    }

    #[test]
    fn guest_bar_moves_allowed_only_in_the_window() {
        assert!(bar_range_allowed(0xe000_8000, BAR0_SIZE));
        assert!(bar_range_allowed(PCI_MMIO_END - BAR0_SIZE, BAR0_SIZE));
        assert!(!bar_range_allowed(0xe000_4000, BAR0_SIZE), "misaligned");
        assert!(!bar_range_allowed(0x100_0000, BAR0_SIZE), "RAM");
        assert!(
            !bar_range_allowed(memory::MMIO_START, BAR0_SIZE),
            "virtio-mmio"
        );
        assert!(!bar_range_allowed(0xfec0_0000, BAR0_SIZE), "IOAPIC");
        assert!(!bar_range_allowed(0xfee0_0000, BAR0_SIZE), "LAPIC");
        assert!(!bar_range_allowed(0x1_0000_0000, BAR0_SIZE), "above 4 GiB");
        assert!(
            !bar_range_allowed(u64::MAX - BAR0_SIZE + 1, BAR0_SIZE),
            "wraps"
        );
    }

    #[test]
    fn msi_gsis_start_above_the_ioapic_pins() {
        let (_, last_pin) = boot::virtio_slot(boot::MAX_VIRTIO_DEVICES - 1);
        assert!(last_pin < FIRST_MSI_GSI);
        assert_eq!(FIRST_MSI_GSI, 24);
    }
}
