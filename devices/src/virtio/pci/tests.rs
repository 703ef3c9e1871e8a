//! Transport tests without KVM: the registers of configuration space and BAR0 as a table, one
//! test that they drive the common status machine (tested itself in `virtio::common`), BAR
//! sizing, the capability chain, notifications, ISR, MSI-X masking/pending/routes, and hostile
//! accesses.

use std::sync::{Arc, Mutex};

use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::pci::config::*;
use crate::pci::msix::{MsiMessage, VIRTIO_MSI_NO_VECTOR};
use crate::test_utils::mmio::xorshift;
use crate::virtio::common::fake::{lock, FakeDevice, FakeState, F_DEP, F_NEEDS};
use crate::virtio::QueueResetState;
use crate::BusDevice;

mod reset;

const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;

// Common configuration offsets.
const DFSEL: u64 = 0x00;
const DF: u64 = 0x04;
const GFSEL: u64 = 0x08;
const GF: u64 = 0x0c;
const MSIX_CONFIG: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const STATUS: u64 = 0x14;
const GENERATION: u64 = 0x15;
const Q_SELECT: u64 = 0x16;
const Q_SIZE: u64 = 0x18;
const Q_MSIX: u64 = 0x1a;
const Q_ENABLE: u64 = 0x1c;
const Q_NOTIFY_OFF: u64 = 0x1e;
const Q_DESC: u64 = 0x20;
const Q_DRIVER: u64 = 0x28;
const Q_DEVICE: u64 = 0x30;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).expect("guest memory")
}

const OFFERED: u64 = VERSION_1
    | F_NEEDS
    | F_DEP
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_F_RING_RESET)
    | (1 << 39)
    | (1 << VIRTIO_F_ACCESS_PLATFORM);

/// A transport over a fake device with queues of 64, 64 and 16 entries that can reset them;
/// BAR0 at 0xe000_0000.
fn transport() -> (VirtioPciTransport, Arc<Mutex<FakeState>>) {
    transport_with(OFFERED, true)
}

/// [`transport`] with a device offering `features`, resetting queues if `resettable`.
fn transport_with(features: u64, resettable: bool) -> (VirtioPciTransport, Arc<Mutex<FakeState>>) {
    let state = Arc::new(Mutex::new(FakeState::default()));
    let device = FakeDevice {
        state: state.clone(),
        sizes: vec![64, 64, 16],
        features,
        resettable,
    };
    let mut t = VirtioPciTransport::new(mem(), Box::new(device)).expect("transport");
    t.set_bar0_address(0xe000_0000);
    enable_memory(&mut t);
    (t, state)
}

fn enable_memory(t: &mut VirtioPciTransport) {
    let cmd = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
    cfg_w(t, PCI_COMMAND as u64, 2, cmd.into());
}

fn le(value: u64, len: usize) -> Vec<u8> {
    value.to_le_bytes()[..len].to_vec()
}

fn from_le(data: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b[..data.len()].copy_from_slice(data);
    u64::from_le_bytes(b)
}

fn cfg_r(t: &mut VirtioPciTransport, offset: u64, len: usize) -> u64 {
    let mut data = vec![0xeeu8; len];
    t.read_config_register(offset, &mut data);
    from_le(&data)
}

fn cfg_w(t: &mut VirtioPciTransport, offset: u64, len: usize, value: u64) -> Option<BarMove> {
    t.write_config_register(offset, &le(value, len))
}

fn bar_r(t: &mut VirtioPciTransport, offset: u64, len: usize) -> u64 {
    let mut data = vec![0xeeu8; len];
    BusDevice::read(t, offset, &mut data);
    from_le(&data)
}

fn bar_w(t: &mut VirtioPciTransport, offset: u64, len: usize, value: u64) {
    BusDevice::write(t, offset, &le(value, len));
}

fn status(t: &mut VirtioPciTransport) -> u32 {
    bar_r(t, STATUS, 1) as u32
}

fn set_status(t: &mut VirtioPciTransport, value: u32) {
    bar_w(t, STATUS, 1, u64::from(value));
}

/// Resets, ACKNOWLEDGE, DRIVER, writes `features`, FEATURES_OK. True if it stuck.
fn negotiate(t: &mut VirtioPciTransport, features: u64) -> bool {
    set_status(t, 0);
    set_status(t, ACK);
    set_status(t, ACK | DRIVER);
    for sel in 0..2u64 {
        bar_w(t, GFSEL, 4, sel);
        bar_w(t, GF, 4, (features >> (32 * sel)) & 0xffff_ffff);
    }
    set_status(t, ACK | DRIVER | FEATURES_OK);
    status(t) & FEATURES_OK != 0
}

/// Programs queue `index` (size, rings at `base`, vector) and enables it.
fn setup_queue(t: &mut VirtioPciTransport, index: u16, size: u16, base: u64, vector: u16) {
    bar_w(t, Q_SELECT, 2, index.into());
    bar_w(t, Q_SIZE, 2, size.into());
    bar_w(t, Q_DESC, 8, base);
    // The driver ring as two dwords, as a 32-bit driver writes it.
    bar_w(t, Q_DRIVER, 4, (base + 0x400) & 0xffff_ffff);
    bar_w(t, Q_DRIVER + 4, 4, (base + 0x400) >> 32);
    bar_w(t, Q_DEVICE, 8, base + 0x800);
    bar_w(t, Q_MSIX, 2, vector.into());
    bar_w(t, Q_ENABLE, 2, 1);
}

fn driver_ok(t: &mut VirtioPciTransport) {
    let s = status(t);
    set_status(t, s | DRIVER_OK);
}

/// Walks the capability list: (offset, id) in order.
fn capabilities(t: &mut VirtioPciTransport) -> Vec<(u64, u8)> {
    let mut caps = Vec::new();
    let mut next = cfg_r(t, PCI_CAPABILITY_LIST as u64, 1);
    while next != 0 {
        assert!(caps.len() < 48, "capability list loops");
        assert!(
            next >= 0x40 && next.is_multiple_of(4) && next < 0x100,
            "cap at {next:#x}"
        );
        caps.push((next, cfg_r(t, next, 1) as u8));
        next = cfg_r(t, next + 1, 1);
    }
    caps
}

/// The virtio capability of `cfg_type`: (cap offset, cap_len, bar, offset, length).
fn virtio_cap(t: &mut VirtioPciTransport, cfg_type: u8) -> (u64, u8, u8, u64, u64) {
    for (at, id) in capabilities(t) {
        if id == PCI_CAP_ID_VNDR && cfg_r(t, at + 3, 1) as u8 == cfg_type {
            return (
                at,
                cfg_r(t, at + 2, 1) as u8,
                cfg_r(t, at + 4, 1) as u8,
                cfg_r(t, at + 8, 4),
                cfg_r(t, at + 12, 4),
            );
        }
    }
    panic!("no capability of type {cfg_type}");
}

fn msix_cap(t: &mut VirtioPciTransport) -> u64 {
    capabilities(t)
        .into_iter()
        .find(|&(_, id)| id == PCI_CAP_ID_MSIX)
        .expect("MSI-X capability")
        .0
}

fn fired(fd: &vmm_sys_util::eventfd::EventFd) -> u64 {
    fd.read().unwrap_or(0)
}

#[test]
fn bar0_is_not_decoded_while_memory_space_is_disabled() {
    let (mut t, _) = transport();
    cfg_w(&mut t, PCI_COMMAND as u64, 2, 0);
    assert_eq!(bar_r(&mut t, NUM_QUEUES, 2), 0xffff, "master abort");
    set_status(&mut t, ACK);
    bar_w(&mut t, NOTIFY_OFFSET, 2, 0);
    assert_eq!(fired(t.ioeventfds(0)[0].0), 0);
    enable_memory(&mut t);
    assert_eq!(status(&mut t), 0, "the write was dropped");
    assert_eq!(bar_r(&mut t, NUM_QUEUES, 2), 3);
    // The PCI_CFG window still reaches the structures.
    cfg_w(&mut t, PCI_COMMAND as u64, 2, 0);
    let (cap, ..) = virtio_cap(&mut t, VIRTIO_PCI_CAP_PCI_CFG);
    cfg_w(&mut t, cap + 8, 4, NUM_QUEUES);
    cfg_w(&mut t, cap + 12, 4, 2);
    assert_eq!(cfg_r(&mut t, cap + 16, 2), 3);
}

#[test]
fn read_only_fields_stay_read_only() {
    let (mut t, _) = transport();
    let before: Vec<u64> = (0..64u64).map(|o| cfg_r(&mut t, o * 4, 4)).collect();
    let skip = [
        PCI_COMMAND / 4,
        PCI_CACHE_LINE_SIZE / 4,
        4,
        5,
        PCI_INTERRUPT_LINE / 4,
    ];
    for dword in 0..64u64 {
        if skip.contains(&(dword as usize)) {
            continue;
        }
        cfg_w(&mut t, dword * 4, 4, 0xffff_ffff);
        cfg_w(&mut t, dword * 4, 4, 0);
    }
    for dword in 0..64u64 {
        if skip.contains(&(dword as usize)) {
            continue;
        }
        let at = dword * 4;
        let now = cfg_r(&mut t, at, 4);
        // The PCI_CFG capability's bar/offset/length are the driver's (checked elsewhere);
        // MSI-X Message Control has its enable and mask bits.
        let (pci_cfg, ..) = virtio_cap(&mut t, VIRTIO_PCI_CAP_PCI_CFG);
        let msix = msix_cap(&mut t);
        if (pci_cfg + 4..pci_cfg + 16).contains(&at) || at == msix {
            continue;
        }
        assert_eq!(now, before[dword as usize], "dword {at:#x} changed");
    }
    // Command: only memory, bus master and INTx disable stick.
    cfg_w(&mut t, PCI_COMMAND as u64, 2, 0xffff);
    assert_eq!(
        cfg_r(&mut t, PCI_COMMAND as u64, 2) as u16,
        PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE
    );
    assert!(t.config_space().memory_enabled());
    assert!(t.config_space().bus_master_enabled());
    // Status is not writable (its capability bit stays, nothing else appears).
    cfg_w(&mut t, PCI_STATUS as u64, 2, 0xffff);
    assert_eq!(
        cfg_r(&mut t, PCI_STATUS as u64, 2) as u16,
        PCI_STATUS_CAP_LIST
    );
    // Interrupt line is a scratch register; pin is not.
    cfg_w(&mut t, PCI_INTERRUPT_LINE as u64, 2, 0xffff);
    assert_eq!(cfg_r(&mut t, PCI_INTERRUPT_LINE as u64, 2), 0x00ff);
    // The other BARs and the expansion ROM are unimplemented: 0 whatever is written.
    for bar in [0x18u64, 0x1c, 0x20, 0x24, 0x30] {
        cfg_w(&mut t, bar, 4, 0xffff_ffff);
        assert_eq!(cfg_r(&mut t, bar, 4), 0, "{bar:#x}");
    }
}

#[test]
fn bar0_sizing_protocol() {
    let (mut t, _) = transport();
    let lo = PCI_BAR0 as u64;
    assert_eq!(
        cfg_r(&mut t, lo, 4),
        0xe000_0004,
        "64-bit, non-prefetchable memory BAR"
    );
    assert_eq!(cfg_r(&mut t, lo + 4, 4), 0);
    assert_eq!(t.bar0(), (0xe000_0000, BAR0_SIZE));
    assert!(BAR0_SIZE.is_power_of_two());
    // Sizing, as Linux does it: all ones, read, restore; low dword then high dword.
    assert_eq!(cfg_w(&mut t, lo, 4, 0xffff_ffff), None);
    let mask_lo = cfg_r(&mut t, lo, 4);
    assert_eq!(mask_lo, (!(BAR0_SIZE - 1) & 0xffff_fff0) | 0b100);
    assert_eq!(cfg_w(&mut t, lo, 4, 0xe000_0000), None, "restored: no move");
    assert_eq!(cfg_w(&mut t, lo + 4, 4, 0xffff_ffff), None);
    assert_eq!(cfg_r(&mut t, lo + 4, 4), 0xffff_ffff);
    assert_eq!(cfg_w(&mut t, lo + 4, 4, 0), None);
    let size = !((mask_lo & !0xf) | 0xffff_ffff_0000_0000) + 1;
    assert_eq!(size, BAR0_SIZE);
    assert_eq!(t.bar0_address(), 0xe000_0000);
    // The type bits are read-only, the address bits below the size too.
    assert_eq!(
        cfg_w(&mut t, lo, 4, 0xd000_7ff8),
        Some(BarMove {
            bar: 0,
            old: 0xe000_0000,
            new: 0xd000_0000,
            size: BAR0_SIZE
        })
    );
    assert_eq!(cfg_r(&mut t, lo, 4), 0xd000_0004);
    // Moving above 4 GiB through the high dword.
    let moved = cfg_w(&mut t, lo + 4, 4, 0x1).expect("move");
    assert_eq!((moved.old, moved.new), (0xd000_0000, 0x1_d000_0000));
    assert_eq!(t.bar0(), (0x1_d000_0000, BAR0_SIZE));
    // Byte writes go through the same mask.
    cfg_w(&mut t, lo, 1, 0xff);
    assert_eq!(cfg_r(&mut t, lo, 4), 0xd000_0004);
}

#[test]
fn capability_chain() {
    let (mut t, _) = transport();
    let caps = capabilities(&mut t);
    assert_eq!(caps.len(), 6, "{caps:x?}");
    // Every capability lies inside the space and after the previous one.
    let mut ends = Vec::new();
    for &(at, id) in &caps {
        let len = match id {
            PCI_CAP_ID_VNDR => cfg_r(&mut t, at + 2, 1),
            PCI_CAP_ID_MSIX => 12,
            other => panic!("unexpected capability {other:#x}"),
        };
        assert!(at + len <= 0x100);
        if let Some(&prev_end) = ends.last() {
            assert!(at >= prev_end, "capabilities overlap");
        }
        ends.push(at + len);
    }
    let mut regions = Vec::new();
    for (cfg_type, offset, min_len) in [
        (VIRTIO_PCI_CAP_COMMON_CFG, COMMON_OFFSET, 0x38),
        (VIRTIO_PCI_CAP_NOTIFY_CFG, NOTIFY_OFFSET, 3 * 4),
        (VIRTIO_PCI_CAP_ISR_CFG, ISR_OFFSET, 1),
        (VIRTIO_PCI_CAP_DEVICE_CFG, DEVICE_OFFSET, 8),
    ] {
        let (at, cap_len, bar, off, len) = virtio_cap(&mut t, cfg_type);
        let expected_cap_len = if cfg_type == VIRTIO_PCI_CAP_NOTIFY_CFG {
            20
        } else {
            16
        };
        assert_eq!(cap_len, expected_cap_len, "type {cfg_type}");
        assert_eq!(bar, 0);
        assert_eq!(off, offset, "type {cfg_type}");
        assert!(len >= min_len, "type {cfg_type}: length {len}");
        assert!(off + len <= BAR0_SIZE);
        regions.push((off, off + len));
        if cfg_type == VIRTIO_PCI_CAP_NOTIFY_CFG {
            assert_eq!(cfg_r(&mut t, at + 16, 4), u64::from(NOTIFY_OFF_MULTIPLIER));
            assert_eq!(
                len,
                3 * u64::from(NOTIFY_OFF_MULTIPLIER),
                "one slot per queue"
            );
        }
    }
    let (_, cap_len, ..) = virtio_cap(&mut t, VIRTIO_PCI_CAP_PCI_CFG);
    assert_eq!(cap_len, 20);
    // MSI-X: 4 vectors (3 queues + config), table and PBA in BAR0.
    let msix = msix_cap(&mut t);
    assert_eq!(
        cfg_r(&mut t, msix + 2, 2),
        3,
        "table size N-1, disabled, unmasked"
    );
    let table = cfg_r(&mut t, msix + 4, 4);
    let pba = cfg_r(&mut t, msix + 8, 4);
    assert_eq!(table & 7, 0, "table BIR 0");
    assert_eq!(pba & 7, 0, "PBA BIR 0");
    assert_eq!(table & !7, MSIX_TABLE_OFFSET);
    assert_eq!(pba & !7, MSIX_PBA_OFFSET);
    regions.push((MSIX_TABLE_OFFSET, MSIX_TABLE_OFFSET + 4 * 16));
    regions.push((MSIX_PBA_OFFSET, MSIX_PBA_OFFSET + 8));
    regions.sort();
    for pair in regions.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "BAR0 regions overlap: {regions:x?}");
    }
    assert!(regions.last().unwrap().1 <= BAR0_SIZE);
}

/// The 64 feature bits the device offers, as the driver reads them.
fn offered(t: &mut VirtioPciTransport) -> u64 {
    bar_w(t, DFSEL, 4, 0);
    let lo = bar_r(t, DF, 4);
    bar_w(t, DFSEL, 4, 1);
    let hi = bar_r(t, DF, 4);
    hi << 32 | lo
}

/// Where a row of [`register_table`] starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    Fresh,
    /// ACKNOWLEDGE and DRIVER set.
    Driver,
    /// VERSION_1 negotiated, FEATURES_OK set.
    FeaturesOk,
    /// Queues of 32, 32 and 16 entries at 0x1000, 0x2000 and 0x3000, DRIVER_OK set.
    Running,
}

/// What a row looks at: a read of BAR0 or of configuration space (`len` bytes prefilled with
/// 0xee, the first 8 as a number), or the acknowledged features.
#[derive(Clone, Copy, Debug)]
enum Probe {
    Bar(u64, usize),
    Cfg(u64, usize),
    Acked,
}
use Probe::*;

/// A row of [`register_table`]: what, start, BAR0 writes (offset, len, value), probe, value.
type Row = (
    &'static str,
    Start,
    &'static [(u64, usize, u64)],
    Probe,
    u64,
);

fn start(t: &mut VirtioPciTransport, start: Start) {
    match start {
        Start::Fresh => {}
        Start::Driver => {
            set_status(t, ACK);
            set_status(t, ACK | DRIVER);
        }
        Start::FeaturesOk => assert!(negotiate(t, VERSION_1)),
        Start::Running => {
            assert!(negotiate(t, VERSION_1));
            setup_queue(t, 0, 32, 0x1000, 1);
            setup_queue(t, 1, 32, 0x2000, 2);
            setup_queue(t, 2, 16, 0x3000, 3);
            driver_ok(t);
            assert!(t.device().is_active());
        }
    }
}

fn probe(t: &mut VirtioPciTransport, probe: Probe) -> u64 {
    let read = |len: usize, read: &mut dyn FnMut(&mut [u8])| {
        let mut data = vec![0xeeu8; len];
        read(&mut data);
        from_le(&data[..len.min(8)])
    };
    match probe {
        Bar(offset, len) => read(len, &mut |data| BusDevice::read(t, offset, data)),
        Cfg(offset, len) => read(len, &mut |data| t.read_config_register(offset, data)),
        Acked => t.acked_features(),
    }
}

/// The header of configuration space and BAR0's common configuration, device configuration
/// and gaps: every register's offset and width, read-only registers, reserved offsets, odd
/// widths, misaligned and out-of-range accesses, and the values each register accepts.
#[test]
fn register_table() {
    let offered = OFFERED & !UNSUPPORTED_TRANSPORT_FEATURES;
    let no_vector = u64::from(VIRTIO_MSI_NO_VECTOR);
    let cmd = u64::from(PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER);
    use Start::*;
    #[rustfmt::skip]
    let rows: &[Row] = &[
        // Configuration space header.
        ("vendor ID", Fresh, &[], Cfg(0x00, 2), 0x1af4),
        ("device ID: 0x1040 + net", Fresh, &[], Cfg(0x02, 2), 0x1041),
        ("vendor and device IDs as a dword", Fresh, &[], Cfg(0x00, 4), 0x1041_1af4),
        ("revision", Fresh, &[], Cfg(PCI_REVISION_ID as u64, 1), 1),
        ("class 02/00/00, revision 1", Fresh, &[], Cfg(0x08, 4), 0x0200_0001),
        ("header type", Fresh, &[], Cfg(PCI_HEADER_TYPE as u64, 1), 0),
        ("subsystem vendor", Fresh, &[], Cfg(PCI_SUBSYSTEM_VENDOR_ID as u64, 2), 0x1af4),
        ("subsystem: net", Fresh, &[], Cfg(PCI_SUBSYSTEM_ID as u64, 2), 1),
        ("interrupt pin: no INTx", Fresh, &[], Cfg(PCI_INTERRUPT_PIN as u64, 1), 0),
        ("status: a capability list", Fresh, &[], Cfg(PCI_STATUS as u64, 2), PCI_STATUS_CAP_LIST.into()),
        ("command as the test set it", Fresh, &[], Cfg(PCI_COMMAND as u64, 2), cmd),
        ("a dword across the end of the space", Fresh, &[], Cfg(0xfe, 4), 0),
        ("past the space", Fresh, &[], Cfg(0x1000, 4), 0),
        ("at u64::MAX", Fresh, &[], Cfg(u64::MAX, 8), 0),
        // Features.
        ("device_feature_select", Fresh, &[(DFSEL, 4, 1)], Bar(DFSEL, 4), 1),
        ("device_feature 0 (ACCESS_PLATFORM added, NOTIF_CONFIG_DATA withheld)", Fresh, &[(DFSEL, 4, 0)], Bar(DF, 4), offered & 0xffff_ffff),
        ("device_feature 1", Fresh, &[(DFSEL, 4, 1)], Bar(DF, 4), offered >> 32),
        ("device_feature 7", Fresh, &[(DFSEL, 4, 7)], Bar(DF, 4), 0),
        ("device_feature written", Fresh, &[(DF, 4, 0)], Bar(DF, 4), offered & 0xffff_ffff),
        ("driver_feature_select", Fresh, &[(GFSEL, 4, 1)], Bar(GFSEL, 4), 1),
        ("driver_feature", Driver, &[(GFSEL, 4, 0), (GF, 4, F_DEP)], Acked, F_DEP),
        ("driver_feature before DRIVER", Fresh, &[(GF, 4, 0xffff_ffff)], Acked, 0),
        ("driver_feature 1 reads back", FeaturesOk, &[(GFSEL, 4, 1)], Bar(GF, 4), 1),
        ("driver_feature 0 reads back", FeaturesOk, &[(GFSEL, 4, 0)], Bar(GF, 4), 0),
        ("driver_feature 7 reads 0", FeaturesOk, &[(GFSEL, 4, 7)], Bar(GF, 4), 0),
        // MSI-X vectors (4: 0..=3; past them NO_VECTOR).
        ("config_msix_vector", Fresh, &[], Bar(MSIX_CONFIG, 2), no_vector),
        ("config_msix_vector 3", Fresh, &[(MSIX_CONFIG, 2, 3)], Bar(MSIX_CONFIG, 2), 3),
        ("config_msix_vector 9", Fresh, &[(MSIX_CONFIG, 2, 9)], Bar(MSIX_CONFIG, 2), no_vector),
        ("queue_msix_vector", Fresh, &[], Bar(Q_MSIX, 2), no_vector),
        ("queue_msix_vector of queue 3 (none)", Fresh, &[(Q_SELECT, 2, 3)], Bar(Q_MSIX, 2), no_vector),
        ("queue_msix_vector 3", FeaturesOk, &[(Q_SELECT, 2, 0), (Q_MSIX, 2, 3)], Bar(Q_MSIX, 2), 3),
        ("queue_msix_vector 4", FeaturesOk, &[(Q_MSIX, 2, 4)], Bar(Q_MSIX, 2), no_vector),
        ("queue_msix_vector of queue 9", FeaturesOk, &[(Q_SELECT, 2, 9), (Q_MSIX, 2, 1)], Bar(Q_MSIX, 2), no_vector),
        // Status and generation: bytes.
        ("num_queues", Fresh, &[], Bar(NUM_QUEUES, 2), 3),
        ("num_queues written", Fresh, &[(NUM_QUEUES, 2, 1)], Bar(NUM_QUEUES, 2), 3),
        ("device_status", FeaturesOk, &[], Bar(STATUS, 1), (ACK | DRIVER | FEATURES_OK).into()),
        ("device_status written as a word", Fresh, &[(STATUS, 2, ACK as u64)], Bar(STATUS, 1), 0),
        ("device_status written as a dword", Fresh, &[(STATUS, 4, ACK as u64)], Bar(STATUS, 1), 0),
        ("device_status read as a dword", FeaturesOk, &[], Bar(STATUS, 4), 0),
        ("config_generation: the device's, as a byte", Fresh, &[], Bar(GENERATION, 1), 7),
        ("config_generation as a word", Fresh, &[], Bar(GENERATION, 2), 0),
        // Queues.
        ("queue_select", Fresh, &[(Q_SELECT, 2, 2)], Bar(Q_SELECT, 2), 2),
        ("queue_size 0", Fresh, &[(Q_SELECT, 2, 0)], Bar(Q_SIZE, 2), 64),
        ("queue_size 1", Fresh, &[(Q_SELECT, 2, 1)], Bar(Q_SIZE, 2), 64),
        ("queue_size 2", Fresh, &[(Q_SELECT, 2, 2)], Bar(Q_SIZE, 2), 16),
        ("queue_size 3 (none)", Fresh, &[(Q_SELECT, 2, 3)], Bar(Q_SIZE, 2), 0),
        ("queue_size 0xffff (none)", Fresh, &[(Q_SELECT, 2, 0xffff)], Bar(Q_SIZE, 2), 0),
        ("queue_notify_off 0", Fresh, &[(Q_SELECT, 2, 0)], Bar(Q_NOTIFY_OFF, 2), 0),
        ("queue_notify_off 1", Fresh, &[(Q_SELECT, 2, 1)], Bar(Q_NOTIFY_OFF, 2), 1),
        ("queue_notify_off 2", Fresh, &[(Q_SELECT, 2, 2)], Bar(Q_NOTIFY_OFF, 2), 2),
        ("queue_notify_off 3 (none)", Fresh, &[(Q_SELECT, 2, 3)], Bar(Q_NOTIFY_OFF, 2), 0),
        ("queue_notify_off 0xffff (none)", Fresh, &[(Q_SELECT, 2, 0xffff)], Bar(Q_NOTIFY_OFF, 2), 0),
        ("queue_notify_off written", Fresh, &[(Q_SELECT, 2, 1), (Q_NOTIFY_OFF, 2, 5)], Bar(Q_NOTIFY_OFF, 2), 1),
        ("queue_size before FEATURES_OK", Fresh, &[(Q_SIZE, 2, 32)], Bar(Q_SIZE, 2), 64),
        ("queue_size 0", FeaturesOk, &[(Q_SIZE, 2, 0)], Bar(Q_SIZE, 2), 64),
        ("queue_size 3 (not a power of two)", FeaturesOk, &[(Q_SIZE, 2, 3)], Bar(Q_SIZE, 2), 64),
        ("queue_size 100", FeaturesOk, &[(Q_SIZE, 2, 100)], Bar(Q_SIZE, 2), 64),
        ("queue_size 128 (past the maximum)", FeaturesOk, &[(Q_SIZE, 2, 128)], Bar(Q_SIZE, 2), 64),
        ("queue_size 0xffff", FeaturesOk, &[(Q_SIZE, 2, 0xffff)], Bar(Q_SIZE, 2), 64),
        ("queue_size 16", FeaturesOk, &[(Q_SIZE, 2, 16)], Bar(Q_SIZE, 2), 16),
        ("queue_size of the selected queue only", FeaturesOk, &[(Q_SELECT, 2, 1), (Q_SIZE, 2, 16), (Q_SELECT, 2, 0)], Bar(Q_SIZE, 2), 64),
        ("queue_size after DRIVER_OK", Running, &[(Q_SELECT, 2, 0), (Q_SIZE, 2, 64)], Bar(Q_SIZE, 2), 32),
        ("queue_desc as a qword", FeaturesOk, &[(Q_DESC, 8, 0x1_2345_6780)], Bar(Q_DESC, 8), 0x1_2345_6780),
        ("queue_desc low dword", FeaturesOk, &[(Q_DESC, 8, 0x1_2345_6780)], Bar(Q_DESC, 4), 0x2345_6780),
        ("queue_desc high dword", FeaturesOk, &[(Q_DESC, 8, 0x1_2345_6780)], Bar(Q_DESC + 4, 4), 1),
        ("queue_desc high dword written", FeaturesOk, &[(Q_DESC, 8, 0x1_2345_6780), (Q_DESC + 4, 4, 0)], Bar(Q_DESC, 8), 0x2345_6780),
        ("queue_desc not 16-byte aligned", FeaturesOk, &[(Q_DESC, 8, 0x1008)], Bar(Q_DESC, 8), 0),
        ("queue_desc after DRIVER_OK", Running, &[(Q_SELECT, 2, 0), (Q_DESC, 8, 0x5000)], Bar(Q_DESC, 8), 0x1000),
        ("queue_driver as two dwords", FeaturesOk, &[(Q_DRIVER, 4, 0x1400), (Q_DRIVER + 4, 4, 2)], Bar(Q_DRIVER, 8), 0x2_0000_1400),
        ("queue_driver high dword", FeaturesOk, &[(Q_DRIVER, 8, 0x2_0000_1400)], Bar(Q_DRIVER + 4, 4), 2),
        ("queue_device", FeaturesOk, &[(Q_DEVICE, 8, 0x1800)], Bar(Q_DEVICE, 8), 0x1800),
        ("queue_device not 4-byte aligned", FeaturesOk, &[(Q_DEVICE, 8, 0x1002)], Bar(Q_DEVICE, 8), 0),
        ("queue_device high dword", FeaturesOk, &[(Q_DEVICE + 4, 4, 3)], Bar(Q_DEVICE + 4, 4), 3),
        ("queue_enable 1", FeaturesOk, &[(Q_ENABLE, 2, 1)], Bar(Q_ENABLE, 2), 1),
        ("queue_enable 7", FeaturesOk, &[(Q_ENABLE, 2, 7)], Bar(Q_ENABLE, 2), 0),
        ("queue_enable 0", FeaturesOk, &[(Q_ENABLE, 2, 0)], Bar(Q_ENABLE, 2), 0),
        ("queue_enable of queue 9", FeaturesOk, &[(Q_SELECT, 2, 9), (Q_SIZE, 2, 16), (Q_ENABLE, 2, 1)], Bar(Q_ENABLE, 2), 0),
        ("queue_enable 1 of queue 9 leaves queue 0", FeaturesOk, &[(Q_SELECT, 2, 9), (Q_ENABLE, 2, 1), (Q_SELECT, 2, 0)], Bar(Q_ENABLE, 2), 0),
        ("queue_reset", Running, &[], Bar(0x3a, 2), 0),
        // Reserved offsets, odd widths, misaligned accesses.
        ("queue_notif_config_data", Fresh, &[], Bar(0x38, 2), 0),
        ("admin_queue_index", Fresh, &[], Bar(0x3c, 2), 0),
        ("admin_queue_num", Fresh, &[], Bar(0x3e, 2), 0),
        ("num_queues as a dword", Fresh, &[], Bar(NUM_QUEUES, 4), 0),
        ("a misaligned byte", Fresh, &[], Bar(0x13, 1), 0),
        ("queue_size as a byte", Fresh, &[], Bar(Q_SIZE, 1), 0),
        ("16 bytes", Fresh, &[], Bar(0, 16), 0),
        ("queue_select written as a dword", Fresh, &[(Q_SELECT, 4, 2)], Bar(Q_SIZE, 2), 64),
        ("queue_select written as a byte", Fresh, &[(Q_SELECT, 1, 2)], Bar(Q_SIZE, 2), 64),
        ("past the common configuration", Fresh, &[], Bar(COMMON_LEN, 4), 0),
        // Device configuration: the device's bytes, 0 past them.
        ("device config dword", Fresh, &[], Bar(DEVICE_OFFSET, 4), 0xa3a2_a1a0),
        ("device config word", Fresh, &[], Bar(DEVICE_OFFSET + 6, 2), 0xa7a6),
        ("device config across its end", Fresh, &[], Bar(DEVICE_OFFSET + 7, 2), 0x00a7),
        ("device config past its end", Fresh, &[], Bar(DEVICE_OFFSET + 0xff8, 8), 0),
        // The rest of BAR0.
        ("ISR past its first byte", Fresh, &[], Bar(ISR_OFFSET + 1, 1), 0),
        ("the notification area", Fresh, &[], Bar(NOTIFY_OFFSET, 2), 0),
        ("a gap", Fresh, &[], Bar(0x6000, 4), 0),
        ("the end of BAR0", Fresh, &[], Bar(BAR0_SIZE - 8, 8), 0),
    ];
    for &(what, from, writes, at, value) in rows {
        let (mut t, _) = transport();
        start(&mut t, from);
        for &(offset, len, value) in writes {
            bar_w(&mut t, offset, len, value);
        }
        assert_eq!(
            probe(&mut t, at),
            value,
            "{what} (from {from:?}, {writes:x?})"
        );
    }
}

/// Device configuration writes reach the device.
#[test]
fn device_config_writes_are_forwarded() {
    let (mut t, state) = transport();
    bar_w(&mut t, DEVICE_OFFSET + 2, 2, 0xbeef);
    assert_eq!(
        state.lock().unwrap().config_writes,
        [(2u64, vec![0xef, 0xbe])]
    );
}

/// The common configuration reaches the common status machine (see `virtio::common`): the
/// status byte, FEATURES_OK checked with what driver_feature acknowledged (against the
/// transport's share of the features too), activation with the queues, kicks and interrupt
/// as programmed, reset of the virtio state (not of the MSI-X table), and DEVICE_NEEDS_RESET
/// told on the configuration vector and in the ISR.
#[test]
fn registers_drive_the_common_status_machine() {
    let (mut t, state) = transport();
    set_status(&mut t, DRIVER);
    assert_eq!(status(&mut t), 0, "DRIVER before ACKNOWLEDGE");
    assert!(!negotiate(&mut t, VERSION_1 | 1 << 41), "not offered");
    assert!(
        !negotiate(&mut t, VERSION_1 | 1 << 39),
        "withheld by the transport"
    );
    assert!(
        !negotiate(&mut t, VERSION_1 | F_NEEDS),
        "dependency refused by the device"
    );
    let all = OFFERED & !UNSUPPORTED_TRANSPORT_FEATURES;
    assert!(negotiate(&mut t, all));
    assert_eq!(t.acked_features(), all);

    // Activation with the queues as programmed.
    enable_msix(&mut t);
    program_vector(&mut t, 1, 0xfee0_0000, 0x41, false);
    let features = VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX;
    assert!(negotiate(&mut t, features));
    bar_w(&mut t, MSIX_CONFIG, 2, 0);
    setup_queue(&mut t, 0, 32, 0x1000, 1);
    setup_queue(&mut t, 1, 64, 0x2000, 2);
    setup_queue(&mut t, 2, 16, 0x3000, VIRTIO_MSI_NO_VECTOR);
    driver_ok(&mut t);
    assert_eq!(status(&mut t), ACK | DRIVER | FEATURES_OK | DRIVER_OK);
    {
        let s = lock(&state);
        assert_eq!(s.activations, 1);
        let ctx = s.ctx.as_ref().expect("activated");
        assert_eq!(ctx.acked_features, features);
        // The queues as the registers programmed them (the driver ring as two dwords).
        let programmed: Vec<_> = ctx
            .queues
            .iter()
            .map(|q| (q.size(), q.desc_table(), q.avail_ring(), q.used_ring()))
            .collect();
        assert_eq!(
            programmed,
            [
                (32, 0x1000, 0x1400, 0x1800),
                (64, 0x2000, 0x2400, 0x2800),
                (16, 0x3000, 0x3400, 0x3800)
            ]
        );
        assert_eq!(ctx.kicks.len(), 3);
        assert!(ctx.queues.iter().all(|q| q.event_idx_enabled()));
        assert!(Arc::ptr_eq(&ctx.interrupt, t.interrupt()));
        // A kick on queue 1's notify address reaches the device's clone.
        bar_w(&mut t, NOTIFY_OFFSET + 4, 2, 1);
        assert_eq!(fired(&ctx.kicks[1]), 1);
    }

    // Reset: the virtio state, the vector assignments and pending interrupts; the MSI-X
    // table is PCI state and survives.
    t.interrupt().signal_queue(0).expect("irq");
    let resets = lock(&state).resets;
    set_status(&mut t, 0);
    assert!(!t.device().is_active());
    assert_eq!(lock(&state).resets, resets + 1);
    assert_eq!(status(&mut t), 0);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 0);
    assert_eq!(t.acked_features(), 0);
    let no_vector = u64::from(VIRTIO_MSI_NO_VECTOR);
    assert_eq!(bar_r(&mut t, MSIX_CONFIG, 2), no_vector);
    bar_w(&mut t, Q_SELECT, 2, 0);
    assert_eq!(bar_r(&mut t, Q_ENABLE, 2), 0);
    assert_eq!(bar_r(&mut t, Q_SIZE, 2), 64);
    assert_eq!(bar_r(&mut t, Q_MSIX, 2), no_vector);
    assert_eq!(bar_r(&mut t, MSIX_TABLE_OFFSET + 16 + 8, 4), 0x41);
    assert!(t.msix_table().enabled());

    // A failed activation (queue 2 never enabled): DEVICE_NEEDS_RESET on the config vector.
    program_vector(&mut t, 0, 0xfee0_0000, 0x40, false);
    assert!(negotiate(&mut t, VERSION_1));
    bar_w(&mut t, MSIX_CONFIG, 2, 0);
    setup_queue(&mut t, 0, 64, 0x1000, 1);
    setup_queue(&mut t, 1, 64, 0x2000, 1);
    driver_ok(&mut t);
    assert_eq!(
        status(&mut t),
        ACK | DRIVER | FEATURES_OK | DRIVER_OK | VIRTIO_CONFIG_S_NEEDS_RESET
    );
    assert!(lock(&state).ctx.is_none());
    let config_irq = t.msix_vectors().irqfd(0).expect("vector 0");
    assert_eq!(fired(config_irq), 1, "config vector told the driver");
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 2, "ISR config bit");
}

#[test]
fn notify_address_per_queue() {
    let (mut t, _) = transport();
    let listed: Vec<(u64, u32)> = t
        .ioeventfds(0xe000_0000)
        .into_iter()
        .map(|(_, addr, len)| (addr, len))
        .collect();
    assert_eq!(
        listed,
        [(0xe000_3000, 0), (0xe000_3004, 0), (0xe000_3008, 0)],
        "one address per queue, any length, no datamatch"
    );
    // Each address is queue_notify_off * multiplier past the notify cap's offset.
    let (_, _, _, notify_off, _) = virtio_cap(&mut t, VIRTIO_PCI_CAP_NOTIFY_CFG);
    for q in 0..3u64 {
        bar_w(&mut t, Q_SELECT, 2, q);
        let off = bar_r(&mut t, Q_NOTIFY_OFF, 2);
        assert_eq!(
            0xe000_0000 + notify_off + off * u64::from(NOTIFY_OFF_MULTIPLIER),
            listed[q as usize].0
        );
    }
    // The fallback path (no ioeventfd): any width, the value does not matter.
    bar_w(&mut t, NOTIFY_OFFSET + 8, 2, 0);
    bar_w(&mut t, NOTIFY_OFFSET + 8, 4, 0x1234_0002);
    bar_w(&mut t, NOTIFY_OFFSET + 12, 2, 3);
    let fds = t.ioeventfds(0);
    assert_eq!(fired(fds[2].0), 2);
    assert_eq!(fired(fds[0].0), 0);
    assert_eq!(fired(fds[1].0), 0);
    assert_eq!(bar_r(&mut t, NOTIFY_OFFSET, 2), 0);
}

#[test]
fn isr_read_to_clear() {
    let (mut t, _) = transport();
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 0);
    t.interrupt().signal_used_queue().expect("irq");
    // Reads elsewhere in the ISR structure do not clear.
    assert_eq!(bar_r(&mut t, ISR_OFFSET + 1, 1), 0);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 1);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 0, "cleared by the read");
    t.interrupt().signal_queue(1).expect("irq");
    t.interrupt().signal_config_change().expect("irq");
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 4), 3);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 4), 0);
    // Writes are ignored.
    t.interrupt().signal_queue(0).expect("irq");
    bar_w(&mut t, ISR_OFFSET, 1, 0);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 1);
}

fn enable_msix(t: &mut VirtioPciTransport) {
    let cap = msix_cap(t);
    cfg_w(t, cap + 2, 2, u64::from(msix::MSIX_CTRL_ENABLE));
}

fn program_vector(t: &mut VirtioPciTransport, v: u64, addr: u64, data: u32, masked: bool) {
    let at = MSIX_TABLE_OFFSET + 16 * v;
    bar_w(t, at, 4, addr & 0xffff_ffff);
    bar_w(t, at + 4, 4, addr >> 32);
    bar_w(t, at + 8, 4, data.into());
    bar_w(t, at + 12, 4, u64::from(masked));
}

#[test]
fn msix_masking_pending_and_unmask_delivery() {
    let (mut t, _) = transport();
    let cap = msix_cap(&mut t);
    assert!(negotiate(&mut t, VERSION_1));
    bar_w(&mut t, Q_SELECT, 2, 0);
    bar_w(&mut t, Q_MSIX, 2, 1);
    bar_w(&mut t, Q_SELECT, 2, 1);
    bar_w(&mut t, Q_MSIX, 2, 2);
    bar_w(&mut t, MSIX_CONFIG, 2, 0);
    let vectors = t.msix_vectors().clone();
    let irq = |v: u16| fired(vectors.irqfd(v).expect("vector"));
    // Entries come out of reset masked.
    for v in 0..4u64 {
        assert_eq!(bar_r(&mut t, MSIX_TABLE_OFFSET + 16 * v + 12, 4), 1);
    }
    // MSI-X disabled: nothing is delivered, the vector is pending.
    t.interrupt().signal_queue(0).expect("irq");
    assert_eq!(irq(1), 0);
    assert_eq!(bar_r(&mut t, MSIX_PBA_OFFSET, 8), 0b10);
    // Enabled, the entry still masked: still pending.
    enable_msix(&mut t);
    assert_eq!(
        cfg_r(&mut t, cap + 2, 2),
        u64::from(msix::MSIX_CTRL_ENABLE) | 3
    );
    assert_eq!(irq(1), 0);
    // Writing the message while masked delivers nothing.
    program_vector(&mut t, 1, 0xfee0_0000, 0x31, true);
    assert_eq!(irq(1), 0);
    assert!(vectors.is_pending(1));
    // Unmask: the pending interrupt goes out once, the PBA bit clears.
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 12, 4, 0);
    assert_eq!(irq(1), 1);
    assert_eq!(bar_r(&mut t, MSIX_PBA_OFFSET, 4), 0);
    // Unmasked: delivered at once, to that queue's vector only.
    t.interrupt().signal_queue(0).expect("irq");
    assert_eq!(irq(1), 1);
    assert_eq!(irq(2), 0);
    // Function mask holds every vector.
    cfg_w(
        &mut t,
        cap + 2,
        2,
        u64::from(msix::MSIX_CTRL_ENABLE | msix::MSIX_CTRL_FUNCTION_MASK),
    );
    assert!(t.msix_table().function_masked());
    t.interrupt().signal_queue(0).expect("irq");
    t.interrupt().signal_queue(0).expect("irq");
    assert_eq!(irq(1), 0);
    assert_eq!(bar_r(&mut t, MSIX_PBA_OFFSET, 4), 0b10);
    assert_eq!(
        bar_r(&mut t, MSIX_PBA_OFFSET, 1),
        0,
        "PBA: dwords and qwords only"
    );
    cfg_w(&mut t, cap + 2, 2, u64::from(msix::MSIX_CTRL_ENABLE));
    assert_eq!(irq(1), 1, "one pending interrupt, delivered once");
    // Table size bits are read-only.
    cfg_w(&mut t, cap + 2, 2, 0x07ff);
    assert_eq!(cfg_r(&mut t, cap + 2, 2), 3);
    enable_msix(&mut t);
    // The config vector; a queue without a vector signals nothing.
    program_vector(&mut t, 0, 0xfee0_0000, 0x30, false);
    t.interrupt().signal_config_change().expect("irq");
    assert_eq!(irq(0), 1);
    t.interrupt().signal_queue(2).expect("irq");
    assert_eq!((irq(0), irq(1), irq(2), irq(3)), (0, 0, 0, 0));
    // signal_used_queue (queue unknown) fires each queue vector once.
    program_vector(&mut t, 2, 0xfee0_0000, 0x32, false);
    bar_w(&mut t, Q_SELECT, 2, 2);
    bar_w(&mut t, Q_MSIX, 2, 1);
    t.interrupt().signal_used_queue().expect("irq");
    assert_eq!((irq(0), irq(1), irq(2), irq(3)), (0, 1, 1, 0));
    // Table reads: dwords and qwords, reserved address bits read 0.
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * 3, 4, 0xfee0_1003);
    assert_eq!(bar_r(&mut t, MSIX_TABLE_OFFSET + 16 * 3, 4), 0xfee0_1000);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * 3, 8, 0x0000_0001_fee0_2000);
    assert_eq!(
        bar_r(&mut t, MSIX_TABLE_OFFSET + 16 * 3, 8),
        0x0000_0001_fee0_2000
    );
    // Vector control: only the mask bit.
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * 3 + 12, 4, 0xffff_fffe);
    assert_eq!(bar_r(&mut t, MSIX_TABLE_OFFSET + 16 * 3 + 12, 4), 0);
}

#[test]
fn msix_route_changes_are_reported() {
    let (mut t, _) = transport();
    let msg = |address: u64, data: u32| MsiMessage { address, data };
    // Nothing while MSI-X is disabled or the entry masked.
    program_vector(&mut t, 1, 0xfee0_0000, 0x41, false);
    assert!(t.take_route_changes().is_empty());
    enable_msix(&mut t);
    assert_eq!(t.take_route_changes(), [(1, msg(0xfee0_0000, 0x41))]);
    assert!(t.take_route_changes().is_empty());
    // A masked entry rewritten: reported when it is unmasked, latest message once.
    program_vector(&mut t, 2, 0xfee0_0000, 0x42, true);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 32 + 8, 4, 0x52);
    assert!(t.take_route_changes().is_empty());
    bar_w(&mut t, MSIX_TABLE_OFFSET + 32 + 12, 4, 0);
    assert_eq!(t.take_route_changes(), [(2, msg(0xfee0_0000, 0x52))]);
    // Rewritten while live: each effective change reported, same message not again.
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 8, 4, 0x61);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 4, 4, 0x1);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 8, 4, 0x61);
    assert_eq!(t.take_route_changes(), [(1, msg(0x1_fee0_0000, 0x61))]);
    // Masking and unmasking with the same message: nothing new.
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 12, 4, 1);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 12, 4, 0);
    assert!(t.take_route_changes().is_empty());
    let routes = t.msix_table().routes();
    assert_eq!(
        routes,
        [(1, msg(0x1_fee0_0000, 0x61)), (2, msg(0xfee0_0000, 0x52))]
    );
}

#[test]
fn route_handler_runs_before_a_pending_interrupt_fires() {
    let (mut t, _) = transport();
    assert!(negotiate(&mut t, VERSION_1));
    bar_w(&mut t, Q_SELECT, 2, 0);
    bar_w(&mut t, Q_MSIX, 2, 3);
    enable_msix(&mut t);
    program_vector(&mut t, 3, 0xfee0_0000, 0x23, true);
    t.interrupt().signal_queue(0).expect("irq");
    let vectors = t.msix_vectors().clone();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    t.set_msix_route_handler(Box::new(move |v, m| {
        // The vector's pending interrupt must not have been fired yet.
        let early = vectors.irqfd(v).and_then(|fd| fd.read().ok()).unwrap_or(0);
        seen2.lock().unwrap().push((v, m, early));
    }));
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * 3 + 12, 4, 0);
    let msg = MsiMessage {
        address: 0xfee0_0000,
        data: 0x23,
    };
    assert_eq!(*seen.lock().unwrap(), [(3, msg, 0)]);
    assert_eq!(fired(t.msix_vectors().irqfd(3).unwrap()), 1, "then fired");
    assert!(t.take_route_changes().is_empty(), "went to the handler");
}

#[test]
fn pci_cfg_window_reaches_bar0() {
    let (mut t, _) = transport();
    let (cap, ..) = virtio_cap(&mut t, VIRTIO_PCI_CAP_PCI_CFG);
    let data = cap + 16;
    // Not set up: reads 0.
    assert_eq!(cfg_r(&mut t, data, 4), 0);
    cfg_w(&mut t, cap + 4, 1, 0);
    cfg_w(&mut t, cap + 8, 4, NUM_QUEUES);
    cfg_w(&mut t, cap + 12, 4, 2);
    assert_eq!(
        cfg_r(&mut t, cap + 8, 4),
        NUM_QUEUES,
        "offset is the driver's"
    );
    assert_eq!(cfg_r(&mut t, data, 2), 3, "num_queues through the window");
    assert_eq!(cfg_r(&mut t, data, 4), 0, "size must match length");
    // Writes: queue_select.
    cfg_w(&mut t, cap + 8, 4, Q_SELECT);
    cfg_w(&mut t, data, 2, 2);
    assert_eq!(bar_r(&mut t, Q_SELECT, 2), 2);
    assert_eq!(bar_r(&mut t, Q_SIZE, 2), 16);
    // A BAR other than 0, a misaligned or out-of-range offset: nothing.
    cfg_w(&mut t, cap + 4, 1, 1);
    assert_eq!(cfg_r(&mut t, data, 2), 0);
    cfg_w(&mut t, cap + 4, 1, 0);
    cfg_w(&mut t, cap + 8, 4, 0x13);
    assert_eq!(cfg_r(&mut t, data, 2), 0);
    cfg_w(&mut t, cap + 8, 4, BAR0_SIZE);
    assert_eq!(cfg_r(&mut t, data, 2), 0);
}

/// Hammers configuration space and BAR0 with pseudo-random accesses: nothing may panic.
#[test]
fn random_guest_accesses_never_panic() {
    let (mut t, _) = transport();
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let hot = [
        0x00u64, 0x04, 0x08, 0x0c, 0x10, 0x12, 0x14, 0x16, 0x18, 0x1a, 0x1c, 0x20, 0x24, 0x28,
        0x30, 0x3a, 0x1000, 0x2000, 0x3000, 0x3004, 0x3008, 0x4000, 0x400c, 0x401c, 0x5000, 0x7ff8,
    ];
    for _ in 0..30_000 {
        let r = next();
        let len = [1usize, 2, 4, 8][((r >> 40) & 3) as usize];
        let mut data = next().to_le_bytes();
        if r & 0x100 != 0 {
            data = (next() % 300).to_le_bytes();
        }
        let data = &mut data[..len];
        if r & 0x1000 != 0 {
            let offset = (r >> 8) % 0x110;
            if r & 0x200 != 0 {
                t.write_config_register(offset, data);
            } else {
                t.read_config_register(offset, data);
            }
        } else {
            let offset = if r & 3 == 0 {
                (r >> 8) % BAR0_SIZE
            } else {
                hot[((r >> 8) % hot.len() as u64) as usize]
            };
            let len = data.len().min((BAR0_SIZE - offset) as usize);
            if r & 0x200 != 0 {
                BusDevice::write(&mut t, offset, &data[..len]);
            } else {
                BusDevice::read(&mut t, offset, &mut data[..len]);
            }
        }
        if r & 0xff_0000 == 0 {
            let _ = t.interrupt().signal_queue((r >> 24) as usize % 5);
        }
    }
}

/// The real virtio-net device (MAC 02:01:02:03:04:05, a socket pair behind it) behind the PCI
/// transport, BAR0 at 0xe000_0000 and memory decoding on. Also returns the far end of the
/// socket pair (5-second timeouts) and the device's metrics.
fn net_over_pci(
    mem: &GuestMemoryMmap,
) -> (
    VirtioPciTransport,
    crate::backend::PairPeer,
    Arc<crate::virtio::net::NetMetrics>,
) {
    use crate::virtio::net::{MacAddr, NetDevice};

    let (backend, peer) = crate::backend::PairBackend::new().expect("socketpair");
    peer.set_timeout(std::time::Duration::from_secs(5))
        .expect("timeout");
    let device = NetDevice::with_backend(backend, MacAddr::new([2, 1, 2, 3, 4, 5]), 64);
    let metrics = device.metrics();
    let mut t = VirtioPciTransport::new(mem.clone(), Box::new(device)).expect("transport");
    t.set_bar0_address(0xe000_0000);
    enable_memory(&mut t);
    (t, peer, metrics)
}

/// A virtio-net header (all zero) and a 100-byte frame.
fn net_wire() -> Vec<u8> {
    let mut wire = vec![0u8; 12];
    wire.extend((0..100u8).map(|i| i.wrapping_mul(7)));
    wire
}

/// The real virtio-net device and its worker, unchanged, behind the PCI transport: a frame
/// each way, each queue's interrupt on its own MSI-X vector.
#[test]
fn net_device_over_pci_with_msix() {
    use std::time::Duration;

    use crate::test_utils::mmio::{wait_eventfd, wait_until};
    use crate::test_utils::queue::{guest_mem, GuestQueue};

    let mem = guest_mem();
    let (mut t, peer, _) = net_over_pci(&mem);
    assert_eq!(cfg_r(&mut t, 0x08, 4) >> 8, 0x02_0000, "network controller");
    assert_eq!(
        bar_r(&mut t, DEVICE_OFFSET, 4),
        0x0302_0102,
        "MAC in device config"
    );
    enable_msix(&mut t);
    for v in 0..3u64 {
        program_vector(&mut t, v, 0xfee0_0000, 0x40 + v as u32, false);
    }
    assert_eq!(t.take_route_changes().len(), 3);
    assert!(negotiate(&mut t, VERSION_1));
    bar_w(&mut t, MSIX_CONFIG, 2, 0);
    let mut rx = GuestQueue::at(&mem, GuestAddress(0x1_0000), 64, 0x10_0000);
    let mut tx = GuestQueue::at(&mem, GuestAddress(0x2_0000), 64, 0x40_0000);
    for (index, (desc, avail, used), vector) in
        [(0u64, rx.ring_addrs(), 1u64), (1, tx.ring_addrs(), 2)]
    {
        bar_w(&mut t, Q_SELECT, 2, index);
        bar_w(&mut t, Q_SIZE, 2, 64);
        bar_w(&mut t, Q_DESC, 8, desc);
        bar_w(&mut t, Q_DRIVER, 8, avail);
        bar_w(&mut t, Q_DEVICE, 8, used);
        bar_w(&mut t, Q_MSIX, 2, vector);
        bar_w(&mut t, Q_ENABLE, 2, 1);
    }
    driver_ok(&mut t);
    assert_eq!(status(&mut t), ACK | DRIVER | FEATURES_OK | DRIVER_OK);
    assert!(t.device().is_active());
    let vectors = t.msix_vectors().clone();
    let timeout = Duration::from_secs(5);

    let wire = net_wire();
    // rx: a buffer, a kick, a frame from the peer.
    let (head, addrs) = rx.push_rx(&[2048]);
    bar_w(&mut t, NOTIFY_OFFSET, 2, 0);
    peer.send_frame(&wire).expect("send");
    assert!(
        wait_eventfd(vectors.irqfd(1).unwrap(), timeout) > 0,
        "rx vector"
    );
    assert!(wait_until(timeout, || rx.used_idx() == 1));
    assert_eq!(rx.used(0), (u32::from(head), wire.len() as u32));
    let mut expected = wire.clone();
    expected[10] = 1; // num_buffers, the device's (always there with VERSION_1)
    assert_eq!(rx.read(addrs[0], wire.len()), expected);
    // Today's worker signals without naming the queue: every queue vector fires once.
    fired(vectors.irqfd(2).unwrap());
    // tx: a chain and a kick on queue 1's own notify address.
    tx.push_tx(&wire, &[12]);
    bar_w(&mut t, NOTIFY_OFFSET + 4, 2, 1);
    assert_eq!(peer.recv_frame().expect("frame sent"), wire);
    assert!(
        wait_eventfd(vectors.irqfd(2).unwrap(), timeout) > 0,
        "tx vector"
    );
    assert!(wait_until(timeout, || tx.used_idx() == 1));
    assert_eq!(
        fired(vectors.irqfd(0).unwrap()),
        0,
        "no configuration interrupt"
    );
    set_status(&mut t, 0);
    assert!(!t.device().is_active());
}
