//! Boots the minimal guest through the `vmm` binary.

use std::time::Duration;

use integration_tests::{artifacts, guest_lock, run_vmm, test_cmdline, RunOutput};

const BOOT_DEADLINE: Duration = Duration::from_secs(180);

fn path(key: &str) -> String {
    artifacts().get(key).to_string_lossy().into_owned()
}

/// Boots the kernel `kernel_key` with the test initramfs running its `test` test.
fn boot_test(kernel_key: &str, test: &str) -> RunOutput {
    let (kernel, initrd) = (path(kernel_key), path("initrd"));
    let cmdline = test_cmdline(test);
    let args = [
        "--kernel",
        &kernel,
        "--initrd",
        &initrd,
        "--cmdline",
        &cmdline,
    ];
    run_vmm(&args, BOOT_DEADLINE)
}

fn assert_boots_to_init_and_exits_zero(kernel_key: &str) {
    let _guest = guest_lock();
    let out = boot_test(kernel_key, "poweroff");
    assert!(out.stdout.contains("vmm-guest: init started"), "{out}");
    assert!(out.stdout.contains("vmm-guest: marker-ok"), "{out}");
    assert!(out.stdout.contains("vmm-guest: done"), "{out}");
    // Bus 0 (its host bridge alone) answers without any PCI device: no alarming probe line.
    assert!(!out.stdout.contains("PCI: Fatal"), "{out}");
    assert!(
        out.success(),
        "the VMM must exit 0 after the guest resets: {out}"
    );
    eprintln!("{kernel_key}: boot to reset in {:.1?}", out.elapsed);
}

#[test]
fn vmlinux_boots_to_init_and_vmm_exits_zero_on_reboot() {
    assert_boots_to_init_and_exits_zero("kernel");
}

#[test]
fn bzimage_boots_to_init_and_vmm_exits_zero_on_reboot() {
    assert_boots_to_init_and_exits_zero("bzimage");
}

#[test]
fn default_cmdline_boots_and_the_vmm_adds_what_the_host_needs() {
    let (kernel, initrd) = (path("kernel"), path("initrd"));
    let _guest = guest_lock();
    let out = run_vmm(&["--kernel", &kernel, "--initrd", &initrd], BOOT_DEADLINE);
    // The demo test runs when the command line names none.
    assert!(out.stdout.contains("vmm-guest: demo"), "{out}");
    assert!(out.stdout.contains("Linux"), "uname output: {out}");
    assert!(out.success(), "{out}");
    if std::path::Path::new("/sys/module/kvm_pvm").exists() {
        assert!(out.stderr.contains("noxsave clearcpuid="), "{out}");
    } else {
        assert!(!out.stderr.contains("noxsave"), "{out}");
    }
}

#[test]
fn a_guest_that_halts_with_interrupts_off_is_reported() {
    let _guest = guest_lock();
    let out = boot_test("kernel", "halt");
    assert!(out.stdout.contains("vmm-guest: halting"), "{out}");
    assert!(
        out.status.is_some(),
        "the VMM must not hang on a halted guest: {out}"
    );
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("halted with interrupts disabled"),
        "{out}"
    );
}

#[test]
fn bad_kernel_path_is_a_clear_error() {
    let out = run_vmm(
        &["--kernel", "/nonexistent/vmlinux"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("cannot open kernel image"), "{out}");
    assert!(out.stderr.contains("/nonexistent/vmlinux"), "{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
}

#[test]
fn a_file_that_is_not_a_kernel_is_rejected() {
    let initrd = path("initrd");
    let out = run_vmm(&["--kernel", &initrd], Duration::from_secs(30));
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("is not a kernel"), "{out}");
}

#[test]
fn bad_sizes_are_clear_errors() {
    let kernel = path("kernel");
    let out = run_vmm(
        &["--kernel", &kernel, "--mem-size", "8"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(
        out.stderr.contains("memory size 8 MiB is out of range"),
        "{out}"
    );

    let out = run_vmm(
        &["--kernel", &kernel, "--vcpus", "0"],
        Duration::from_secs(30),
    );
    assert!(out.stderr.contains("vCPU count 0 is out of range"), "{out}");

    // An initrd larger than guest memory.
    let big = std::env::temp_dir().join(format!("vmm-big-initrd-{}", std::process::id()));
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(64 << 20).unwrap();
    let big_s = big.to_string_lossy().into_owned();
    let out = run_vmm(
        &["--kernel", &kernel, "--initrd", &big_s, "--mem-size", "32"],
        Duration::from_secs(30),
    );
    std::fs::remove_file(&big).unwrap();
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("does not fit in guest memory"), "{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
}

#[test]
fn missing_dev_kvm_is_a_clear_error() {
    // A private mount namespace whose /dev is an empty tmpfs: no /dev/kvm in it.
    let kernel = path("kernel");
    let vmm = integration_tests::vmm_binary()
        .to_string_lossy()
        .into_owned();
    let script = format!("mount -t tmpfs tmpfs /dev && exec '{vmm}' --kernel '{kernel}'");
    let out = integration_tests::run_command(
        std::process::Command::new("unshare").args(["--mount", "sh", "-c", &script]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.and_then(|s| s.code()), Some(1), "{out}");
    assert!(out.stderr.contains("/dev/kvm does not exist"), "{out}");
    assert!(!out.stderr.contains("panicked"), "{out}");
}
