//! The only module that talks to KVM: the VM (memory slots, in-kernel irqchip and PIT,
//! ioeventfd/irqfd registration) and the vCPUs.

mod cpuid;
mod pagewalk;
pub mod vcpu;

use std::io;

use kvm_bindings::{kvm_pit_config, kvm_userspace_memory_region, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{IoEventAddress, Kvm, VmFd};
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
    fd: VmFd,
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
        Ok(Vm {
            kvm,
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

    pub(crate) fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    pub(crate) fn fd(&self) -> &VmFd {
        &self.fd
    }
}
