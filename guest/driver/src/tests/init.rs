//! Bring-up, feature negotiation, teardown and the interrupt entry.

use super::{assert_drop_resets_and_frees, harness, harness_with, ARENA};
use crate::features::*;
use crate::net::{RX_QUEUE, TX_QUEUE};
use crate::testing::{Regs, TestHal, TestTransport};
use crate::transport::{status, INT_CONFIG_CHANGE, INT_USED_BUFFER};
use crate::{Config, InitError, IrqStatus, TxCompletion, VirtioNet};

#[test]
fn negotiates_sets_up_queues_and_posts_rx_buffers() {
    let h = harness(Config::default());
    {
        let regs = h.transport.regs();
        assert_eq!(
            regs.driver_features,
            F_VERSION_1 | NET_F_MAC | NET_F_STATUS | RING_F_EVENT_IDX | NET_F_MRG_RXBUF,
            "CSUM offered but off by default"
        );
        assert_eq!(
            regs.status,
            status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK
        );
        assert_eq!((regs.queues[0].num, regs.queues[1].num), (256, 256));
        assert!(regs.queues[..2]
            .iter()
            .all(|q| q.avail != 0 && q.desc % 16 == 0 && q.used % 4 == 0));
        assert_eq!(
            regs.queues[2].ready, 0,
            "no control queue offered, none set up"
        );
        assert_eq!(
            regs.notifies,
            [RX_QUEUE],
            "one rx kick after posting, none before DRIVER_OK"
        );
        assert!(regs.bad_writes.is_empty());
    }
    assert_eq!(h.net.mac(), Some([0x02, 0, 0, 0, 0, 0x01]));
    assert!(h.net.link_up());
    assert_eq!(h.dev.rx.pending(), 256, "the whole rx ring is posted");
    assert_eq!(h.dev.tx.used_event(), 0, "TxInterrupt: tx interrupts on");
    assert_eq!(h.net.queue_sizes(), (256, 256));
}

#[test]
fn feature_knobs_change_what_is_acknowledged() {
    let config = Config {
        event_idx: false,
        mrg_rxbuf: false,
        csum: true,
        ..Config::default()
    };
    let h = harness(config);
    assert_eq!(
        h.transport.regs().driver_features,
        F_VERSION_1 | NET_F_MAC | NET_F_STATUS | NET_F_CSUM
    );
    // A device offering less: only the intersection is acknowledged.
    let h = harness_with(Config::default(), |r| r.device_features = F_VERSION_1);
    assert_eq!(h.net.features(), F_VERSION_1);
    assert_eq!(h.net.mac(), None);
    assert!(h.net.link_up(), "no STATUS: assumed up");
}

fn init_error(config: Config, edit: impl FnOnce(&mut Regs)) -> (InitError, u32, TestHal) {
    let hal = TestHal::new(ARENA);
    let mut regs = Regs::default();
    edit(&mut regs);
    let transport = TestTransport::new(regs);
    let result = VirtioNet::new(hal.clone(), transport.clone(), config);
    let status = transport.regs().status;
    (result.err().expect("init must fail"), status, hal)
}

#[test]
fn refusals_are_reported_and_leave_the_device_failed_or_reset() {
    let d = Config::default();
    type Case = (Config, fn(&mut Regs), InitError);
    let cases: [Case; 7] = [
        (d, |r| r.magic = 0x1234, InitError::BadMagic(0x1234)),
        (d, |r| r.version = 1, InitError::UnsupportedVersion(1)),
        (d, |r| r.device_id = 2, InitError::NotNet(2)),
        (
            d,
            |r| r.device_features &= !F_VERSION_1,
            InitError::NoVersion1,
        ),
        (d, |r| r.refuse_features = true, InitError::FeaturesRejected),
        (
            d,
            |r| r.queues[1].num_max = 0,
            InitError::QueueUnavailable(TX_QUEUE),
        ),
        (
            Config {
                mrg_rxbuf: false,
                rx_buf_size: 1024,
                ..d
            },
            |_| {},
            InitError::RxBufTooSmall {
                size: 1024,
                min: 1530,
            },
        ),
    ];
    for (config, edit, expected) in cases {
        let (error, status, hal) = init_error(config, edit);
        assert_eq!(error, expected);
        if !matches!(
            expected,
            InitError::BadMagic(_) | InitError::UnsupportedVersion(_) | InitError::NotNet(_)
        ) {
            assert_ne!(status & status::FAILED, 0, "{expected:?}: FAILED set");
        }
        assert_eq!(hal.live_allocations(), 0);
    }
    // The same device without MRG_RXBUF offered: the small buffers are refused too.
    let (error, _, _) = init_error(
        Config {
            rx_buf_size: 1024,
            ..d
        },
        |r| r.device_features &= !NET_F_MRG_RXBUF,
    );
    assert!(matches!(error, InitError::RxBufTooSmall { .. }));
    let (error, _, _) = init_error(
        Config {
            kick_threshold: 0,
            ..d
        },
        |_| {},
    );
    assert!(matches!(error, InitError::Config(_)));
}

#[test]
fn activation_failure_and_dma_failure_free_everything() {
    let (error, status, hal) = init_error(Config::default(), |r| r.fail_activation = true);
    assert_eq!(error, InitError::DeviceNeedsReset);
    assert_eq!(status, 0, "device reset by the driver's teardown");
    assert_eq!(hal.live_allocations(), 0);

    let hal = TestHal::new(ARENA);
    hal.fail_after(2);
    let transport = TestTransport::new(Regs::default());
    let result = VirtioNet::new(hal.clone(), transport.clone(), Config::default());
    assert_eq!(result.err(), Some(InitError::DmaAlloc));
    assert_eq!(hal.live_allocations(), 0);
    assert_ne!(transport.regs().status & status::FAILED, 0);
}

#[test]
fn queue_sizes_are_lowered_to_the_device_maximum() {
    let h = harness_with(Config::default(), |r| {
        r.queues[0].num_max = 100;
        r.queues[1].num_max = 64;
    });
    assert_eq!(h.net.queue_sizes(), (64, 64), "largest power of two ≤ max");
    assert_eq!(h.dev.rx.pending(), 64);
}

#[test]
fn drop_resets_the_device_then_frees_memory() {
    let h = harness(Config::default());
    assert_eq!(h.hal.live_allocations(), 4);
    assert_drop_resets_and_frees(h);
}

#[test]
fn handle_interrupt_reads_and_acks_interrupt_status() {
    let mut h = harness(Config {
        tx_completion: TxCompletion::Lazy,
        ..Config::default()
    });
    assert_eq!(h.net.handle_interrupt(), IrqStatus::default());
    assert_eq!(
        h.net.counters().interrupts,
        0,
        "nothing pending: not counted"
    );

    h.transport.raise(INT_USED_BUFFER);
    let irq = h.net.handle_interrupt();
    assert!(irq.used_buffers && !irq.config_changed && irq.any());
    assert_eq!(h.transport.regs().interrupt_status, 0, "acknowledged");
    assert_eq!(h.net.counters().interrupts, 1);

    {
        let mut regs = h.transport.regs();
        regs.config[6] = 0; // link down
        regs.config_generation += 1;
    }
    h.transport.raise(INT_CONFIG_CHANGE | INT_USED_BUFFER);
    let irq = h.net.handle_interrupt();
    assert!(irq.used_buffers && irq.config_changed && !irq.needs_reset);
    assert!(!h.net.link_up());

    h.transport.regs().status |= status::DEVICE_NEEDS_RESET;
    h.transport.raise(INT_CONFIG_CHANGE);
    assert!(h.net.handle_interrupt().needs_reset);
    assert!(h.net.is_broken());
    assert_eq!(h.net.counters().interrupts, 3);
}
