//! The only module that talks to KVM: the VM (memory slots, in-kernel irqchip and PIT,
//! ioeventfd/irqfd registration) and the vCPUs.

mod cpuid;
mod pagewalk;
pub mod vcpu;

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_irq_routing_entry, kvm_pit_config, kvm_userspace_memory_region, KvmIrqRouting,
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP,
    KVM_IRQ_ROUTING_MSI, KVM_MAX_IRQ_ROUTES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{IoEventAddress, Kvm, NoDatamatch, VmFd};
use vm_memory::{Address, GuestMemoryBackend as _, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use crate::memory::GuestMemory;

/// Where KVM keeps its TSS on Intel (three pages just below the BIOS ROM).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

/// A KVM failure, with what we were doing.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("/dev/kvm does not exist: this host has no KVM (is the kvm module loaded, or nested virtualisation enabled?)")]
    NoKvm,
    #[error("permission denied opening /dev/kvm: run as root or add the user to the group that owns /dev/kvm")]
    KvmPermission,
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] io::Error),
    #[error("KVM API version {0} is not supported (need 12)")]
    ApiVersion(i32),
    #[error("KVM_CREATE_VM failed")]
    CreateVm(#[source] io::Error),
    #[error("KVM_SET_TSS_ADDR failed")]
    SetTss(#[source] io::Error),
    #[error("KVM_CREATE_IRQCHIP failed")]
    CreateIrqchip(#[source] io::Error),
    #[error("KVM_CREATE_PIT2 failed")]
    CreatePit(#[source] io::Error),
    #[error("KVM_SET_USER_MEMORY_REGION failed for slot {slot}")]
    SetMemory {
        slot: u32,
        #[source]
        source: io::Error,
    },
    #[error("KVM_IRQFD failed for GSI {gsi}")]
    Irqfd {
        gsi: u32,
        #[source]
        source: io::Error,
    },
    #[error("KVM_IOEVENTFD failed at {addr:#x}")]
    Ioeventfd {
        addr: u64,
        #[source]
        source: io::Error,
    },
    #[error("KVM_IOEVENTFD (deassign) failed at {addr:#x}")]
    IoeventfdRemove {
        addr: u64,
        #[source]
        source: io::Error,
    },
    #[error("KVM_SET_GSI_ROUTING failed for GSI {gsi}")]
    GsiRouting {
        gsi: u32,
        #[source]
        source: io::Error,
    },
    #[error("GSI {0} is past KVM's {KVM_MAX_IRQ_ROUTES} routes")]
    GsiRange(u32),
    #[error("KVM_GET_SUPPORTED_CPUID failed")]
    SupportedCpuid(#[source] io::Error),
    #[error("vCPU {id}: {what} failed")]
    Vcpu {
        id: u8,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_err(e: kvm_ioctls::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

/// A KVM VM with its memory registered and an in-kernel irqchip (PIC, IOAPIC, LAPICs) and PIT.
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    routing: Arc<GsiRouting>,
    /// Keeps the memory that KVM's slots point at mapped for as long as the VM exists.
    _mem: GuestMemory,
}

impl Vm {
    /// Opens `/dev/kvm`, creates the VM and registers `mem`.
    pub fn new(mem: &GuestMemory) -> Result<Vm, KvmError> {
        let kvm = Kvm::new().map_err(|e| match e.errno() {
            libc::ENOENT | libc::ENODEV | libc::ENXIO => KvmError::NoKvm,
            libc::EACCES | libc::EPERM => KvmError::KvmPermission,
            _ => KvmError::OpenKvm(io_err(e)),
        })?;
        let api = kvm.get_api_version();
        if api != 12 {
            return Err(KvmError::ApiVersion(api));
        }
        let fd = kvm.create_vm().map_err(|e| KvmError::CreateVm(io_err(e)))?;
        // Memory before the irqchip: on the PVM host the first KVM_SET_USER_MEMORY_REGION
        // after KVM_CREATE_IRQCHIP takes 4-8 ms (most of the VMM's start-up), before it 0.2 ms,
        // and KVM_CREATE_IRQCHIP after it 0.02 ms (Firecracker uses this order too).
        for (slot, region) in mem.iter().enumerate() {
            let slot = slot as u32;
            let region_desc = kvm_userspace_memory_region {
                slot,
                guest_phys_addr: region.start_addr().raw_value(),
                memory_size: region.len(),
                userspace_addr: region.as_ptr() as u64,
                flags: 0,
            };
            // SAFETY: the host range [as_ptr, as_ptr + len) is a live mapping owned by `mem`;
            // the VM keeps a clone of `mem` (`_mem`), so the mapping outlives the slot, and the
            // slots do not overlap because guest memory regions never do.
            unsafe { fd.set_user_memory_region(region_desc) }.map_err(|e| KvmError::SetMemory {
                slot,
                source: io_err(e),
            })?;
        }
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(|e| KvmError::SetTss(io_err(e)))?;
        fd.create_irq_chip()
            .map_err(|e| KvmError::CreateIrqchip(io_err(e)))?;
        let pit = kvm_pit_config {
            flags: KVM_PIT_SPEAKER_DUMMY,
            ..Default::default()
        };
        fd.create_pit2(pit)
            .map_err(|e| KvmError::CreatePit(io_err(e)))?;
        let fd = Arc::new(fd);
        Ok(Vm {
            kvm,
            routing: Arc::new(GsiRouting::new(fd.clone())),
            fd,
            _mem: mem.clone(),
        })
    }

    /// Delivers an interrupt on `gsi` whenever `evt` is written, without a VMM round trip.
    pub fn register_irqfd(&self, evt: &EventFd, gsi: u32) -> Result<(), KvmError> {
        self.fd
            .register_irqfd(evt, gsi)
            .map_err(|e| KvmError::Irqfd {
                gsi,
                source: io_err(e),
            })
    }

    /// Signals `evt` when the guest writes the 32-bit value `datamatch` to MMIO `addr`; the write
    /// is completed in the kernel and never reaches a vCPU thread.
    pub fn register_mmio_ioevent(
        &self,
        evt: &EventFd,
        addr: u64,
        datamatch: u32,
    ) -> Result<(), KvmError> {
        self.fd
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), datamatch)
            .map_err(|e| KvmError::Ioeventfd {
                addr,
                source: io_err(e),
            })
    }

    /// The VM's GSI routing table (shared with the MSI-X route handlers).
    pub fn gsi_routing(&self) -> &Arc<GsiRouting> {
        &self.routing
    }

    /// A handle that adds and removes MMIO ioeventfds (for BAR moves, on a vCPU thread).
    pub fn ioevents(&self) -> IoEvents {
        IoEvents(self.fd.clone())
    }

    pub(crate) fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    pub(crate) fn fd(&self) -> &VmFd {
        &self.fd
    }
}

/// Registers and removes "any access, any value" MMIO ioeventfds (virtio-pci notify slots).
#[derive(Clone)]
pub struct IoEvents(Arc<VmFd>);

impl IoEvents {
    /// Signals `evt` on every write to MMIO `addr` (any length, any value: no datamatch);
    /// the write completes in the kernel.
    pub fn register(&self, evt: &EventFd, addr: u64) -> Result<(), KvmError> {
        self.0
            .register_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(|e| KvmError::Ioeventfd {
                addr,
                source: io_err(e),
            })
    }

    /// Removes what [`IoEvents::register`] added.
    pub fn unregister(&self, evt: &EventFd, addr: u64) -> Result<(), KvmError> {
        self.0
            .unregister_ioevent(evt, &IoEventAddress::Mmio(addr), NoDatamatch)
            .map_err(|e| KvmError::IoeventfdRemove {
                addr,
                source: io_err(e),
            })
    }
}

/// The VM's GSI routing table. `KVM_SET_GSI_ROUTING` replaces the whole table, so the VMM
/// keeps it: KVM's default irqchip routes (GSI 0–15 to the PICs and the IOAPIC, 16–23 to the
/// IOAPIC) plus one MSI route per MSI-X vector, set as the guest programs the vectors. Used on
/// the control path only (a vCPU thread rewriting an MSI-X entry); interrupts themselves go
/// through irqfds and never touch it.
pub struct GsiRouting {
    fd: Arc<VmFd>,
    msi: Mutex<BTreeMap<u32, (u64, u32)>>,
}

impl GsiRouting {
    fn new(fd: Arc<VmFd>) -> GsiRouting {
        GsiRouting {
            fd,
            msi: Mutex::new(BTreeMap::new()),
        }
    }

    /// Routes `gsi` to the MSI message (`address`, `data`) and installs the whole table.
    pub fn set_msi(&self, gsi: u32, address: u64, data: u32) -> Result<(), KvmError> {
        if gsi >= KVM_MAX_IRQ_ROUTES as u32 {
            return Err(KvmError::GsiRange(gsi));
        }
        let mut msi = self.msi.lock().unwrap_or_else(|p| p.into_inner());
        let previous = msi.insert(gsi, (address, data));
        let entries = routing_entries(&msi);
        let installed = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| KvmError::GsiRange(gsi))
            .and_then(|table| {
                self.fd
                    .set_gsi_routing(&table)
                    .map_err(|e| KvmError::GsiRouting {
                        gsi,
                        source: io_err(e),
                    })
            });
        if installed.is_err() {
            // Keep the table what KVM has.
            match previous {
                Some(p) => msi.insert(gsi, p),
                None => msi.remove(&gsi),
            };
        }
        installed
    }
}

/// KVM's default irqchip routes (`kvm_setup_default_irq_routing`) followed by `msi`.
pub fn routing_entries(msi: &BTreeMap<u32, (u64, u32)>) -> Vec<kvm_irq_routing_entry> {
    let irqchip = |gsi: u32, chip: u32, pin: u32| {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_IRQCHIP,
            ..Default::default()
        };
        e.u.irqchip.irqchip = chip;
        e.u.irqchip.pin = pin;
        e
    };
    let mut entries = Vec::new();
    for gsi in 0..24 {
        entries.push(irqchip(gsi, KVM_IRQCHIP_IOAPIC, gsi));
        if gsi < 16 {
            let pic = if gsi < 8 {
                KVM_IRQCHIP_PIC_MASTER
            } else {
                KVM_IRQCHIP_PIC_SLAVE
            };
            entries.push(irqchip(gsi, pic, gsi % 8));
        }
    }
    for (&gsi, &(address, data)) in msi {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_MSI,
            ..Default::default()
        };
        e.u.msi.address_lo = address as u32;
        e.u.msi.address_hi = (address >> 32) as u32;
        e.u.msi.data = data;
        entries.push(e);
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_keeps_the_irqchip_defaults_and_adds_msi() {
        let mut msi = BTreeMap::new();
        msi.insert(24, (0xfee0_1000u64, 0x4031u32));
        msi.insert(30, (0x1_fee0_0000u64, 0x22u32));
        let e = routing_entries(&msi);
        assert_eq!(e.len(), 16 * 2 + 8 + 2);
        let chips: Vec<(u32, u32, u32)> = e
            .iter()
            .filter(|e| e.type_ == KVM_IRQ_ROUTING_IRQCHIP)
            // SAFETY: irqchip entries carry the irqchip member of the union.
            .map(|e| unsafe { (e.gsi, e.u.irqchip.irqchip, e.u.irqchip.pin) })
            .collect();
        assert!(chips.contains(&(0, KVM_IRQCHIP_PIC_MASTER, 0)));
        assert!(chips.contains(&(0, KVM_IRQCHIP_IOAPIC, 0)));
        assert!(chips.contains(&(12, KVM_IRQCHIP_PIC_SLAVE, 4)));
        assert!(chips.contains(&(12, KVM_IRQCHIP_IOAPIC, 12)));
        assert!(chips.contains(&(23, KVM_IRQCHIP_IOAPIC, 23)));
        assert!(!chips.iter().any(|c| c.0 >= 16 && c.1 != KVM_IRQCHIP_IOAPIC));
        let msis: Vec<(u32, u32, u32, u32)> = e
            .iter()
            .filter(|e| e.type_ == KVM_IRQ_ROUTING_MSI)
            // SAFETY: MSI entries carry the msi member of the union.
            .map(|e| unsafe { (e.gsi, e.u.msi.address_lo, e.u.msi.address_hi, e.u.msi.data) })
            .collect();
        assert_eq!(
            msis,
            vec![(24, 0xfee0_1000, 0, 0x4031), (30, 0xfee0_0000, 1, 0x22)]
        );
    }
}
