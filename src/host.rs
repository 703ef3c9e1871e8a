//! Detection of host quirks the VMM must work around. Workarounds are applied only where the
//! quirk is detected, never assumed.

use std::path::Path;

/// Kernel command-line options a guest needs on KVM's PVM module in its mode for unmodified
/// guests: the host ignores most of KVM_SET_CPUID2, so features whose instructions cannot run
/// at CPL0 there (XSAVE, popcnt, rdtscp, cx16, pcid, invpcid, clwb, fsgsbase, rdpid, smap,
/// erms, fsrm) are cleared by number (a tiny kernel config drops the names).
pub const PVM_CMDLINE: &str =
    "noxsave clearcpuid=151,59,141,145,298,312,288,534,308,297,580 rodata=off";

/// What we know about the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostQuirks {
    /// `/dev/kvm` is KVM's PVM module: guest kernel code is emulated.
    pub pvm: bool,
}

impl HostQuirks {
    /// Looks at the running host.
    pub fn detect() -> Self {
        Self::detect_in(Path::new("/sys/module"))
    }

    /// Looks for the quirks under a sysfs module directory (for tests).
    pub fn detect_in(sys_module: &Path) -> Self {
        HostQuirks {
            pvm: sys_module.join("kvm_pvm").exists(),
        }
    }

    /// Options to append to the guest command line, if any.
    pub fn extra_cmdline(&self) -> Option<&'static str> {
        self.pvm.then_some(PVM_CMDLINE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvm_is_detected_from_sysfs() {
        let dir = std::env::temp_dir().join(format!("vmm-host-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let q = HostQuirks::detect_in(&dir);
        assert!(!q.pvm);
        assert_eq!(q.extra_cmdline(), None);
        std::fs::create_dir_all(dir.join("kvm_pvm")).unwrap();
        let q = HostQuirks::detect_in(&dir);
        assert!(q.pvm);
        assert!(q.extra_cmdline().unwrap().contains("noxsave"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
