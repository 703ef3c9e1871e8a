//! The packed virtqueue's device side (`devices::fuzzing::run_packed`): a ring of arbitrary
//! descriptors and indirect tables, arbitrary event suppression areas and features, and a
//! sequence of pops, walks, completions, unpops, decisions, notification changes and driver
//! writes racing them.
//!
//! Invariants:
//! - every call is bounded: the whole run returns within 100 ms; no panic;
//! - positions advance only by what was taken: a pop moves `next_avail` by the chain's
//!   descriptors (1..=min(size, MAX_CHAIN_DESCRIPTORS); a run of lone descriptors, by one per
//!   chain, no more chains than asked for) and a completion moves `next_used` by
//!   the descriptors of the chains it returned, never more; at every step the ring descriptors
//!   between `next_used` and `next_avail` are exactly the ones in flight, at most the size;
//! - a popped chain's id is below the size;
//! - every iovec lies inside guest memory's host mapping; a successful walk's iovecs add up to
//!   its length, within its limit; a walk charges 1..=MAX_CHAIN_DESCRIPTORS+1 descriptors.

#![no_main]

mod common;

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use devices::fuzzing::{run_packed, PackedLayout, PackedOp, Position, MAX_CHAIN_DESCRIPTORS};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};

use common::*;

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Desc {
    addr: u32,
    far: bool,
    len: u32,
    id: u16,
    flags: u16,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Pop { writes: bool, limit: Option<u32> },
    PopSplit,
    PopLone(u8),
    Complete(u16),
    CompleteBatch(u8, u16),
    Unpop,
    Publish,
    Decide,
    Enable(u16),
    Disable,
    Driver(u8),
}

#[derive(Arbitrary, Debug)]
struct Input {
    layout: Layout,
    size: u16,
    event_idx: bool,
    in_order: bool,
    desc: u16,
    driver_event: (u16, u16),
    descs: Vec<Desc>,
    tables: Vec<(u16, Vec<Desc>)>,
    ops: Vec<Op>,
    patches: Vec<Patch>,
}

fn raw(d: &Desc) -> [u8; 16] {
    let addr = if d.far {
        u64::from(d.addr) << 20
    } else {
        u64::from(d.addr) % (3 * REGION_A)
    };
    // Mostly the meaningful flags (NEXT, WRITE, INDIRECT, AVAIL, USED), sometimes anything.
    let flags = if d.flags & 0x4000 != 0 {
        d.flags
    } else {
        d.flags & 0x8087
    };
    let mut r = [0u8; 16];
    r[..8].copy_from_slice(&addr.to_le_bytes());
    r[8..12].copy_from_slice(&d.len.to_le_bytes());
    r[12..14].copy_from_slice(&d.id.to_le_bytes());
    r[14..].copy_from_slice(&flags.to_le_bytes());
    r
}

/// Ring descriptors from `from` forward to `to`.
fn distance(from: Position, to: Position, size: u16) -> u32 {
    common::distance((from.offset, from.wrap), (to.offset, to.wrap), size)
}

fuzz_target!(|input: Input| {
    let mem = input.layout.memory();
    // Mostly small rings (wraps happen), sometimes up to 2048 descriptors (more than a chain
    // may link).
    let size = if input.size & 0x8000 != 0 {
        input.size % 2048 + 1
    } else {
        input.size % 64 + 1
    };
    let ring_len = 16 * u64::from(size);
    let desc = ((u64::from(input.desc) % 0x1000) & !15).min(REGION_A - ring_len - 16) & !15;
    let layout = PackedLayout {
        size,
        desc,
        driver_event: desc + ring_len,
        device_event: desc + ring_len + 4,
    };
    for (i, d) in input.descs.iter().take(usize::from(size)).enumerate() {
        let _ = mem.write_slice(&raw(d), GuestAddress(desc + 16 * i as u64));
    }
    for (addr, table) in input.tables.iter().take(8) {
        let base = u64::from(*addr) % (3 * REGION_A);
        for (i, d) in table.iter().take(256).enumerate() {
            let _ = mem.write_slice(&raw(d), GuestAddress(base + 16 * i as u64));
        }
    }
    let _ = mem.write_obj(input.driver_event.0, GuestAddress(layout.driver_event));
    let _ = mem.write_obj(input.driver_event.1, GuestAddress(layout.driver_event + 2));
    let features = (u64::from(input.event_idx) << 29) | (u64::from(input.in_order) << 35);
    let ops: Vec<PackedOp> = input
        .ops
        .iter()
        .take(512)
        .map(|op| match *op {
            Op::Pop { writes, limit } => PackedOp::Pop {
                writes,
                limit: limit.unwrap_or(u32::MAX),
            },
            Op::PopSplit => PackedOp::PopSplit,
            Op::PopLone(n) => PackedOp::PopLone(n),
            Op::Complete(len) => PackedOp::Complete(u32::from(len)),
            Op::CompleteBatch(n, len) => PackedOp::CompleteBatch(n, u32::from(len)),
            Op::Unpop => PackedOp::Unpop,
            Op::Publish => PackedOp::Publish,
            Op::Decide => PackedOp::Decide,
            Op::Enable(ahead) => PackedOp::Enable(ahead),
            Op::Disable => PackedOp::Disable,
            Op::Driver(n) => PackedOp::Driver(n),
        })
        .collect();

    let start = Instant::now();
    let result = run_packed(&mem, &layout, features, &ops, |n| {
        if let Some(p) = input.patches.get(usize::from(n)) {
            p.apply(&mem);
        }
    });
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(100), "run took {elapsed:?}");
    let Ok((steps, _ring_error)) = result else {
        return;
    };

    let hosts = host_ranges(&mem);
    let mut avail = Position {
        offset: 0,
        wrap: true,
    };
    let mut used = Position {
        offset: 0,
        wrap: true,
    };
    let mut in_flight = 0u32;
    for step in &steps {
        if let PackedOp::PopLone(n) = step.op {
            assert!(step.popped.len() <= usize::from(n), "more than asked for");
        }
        let mut taken = 0u32;
        for chain in &step.popped {
            let descs = u32::from(chain.descriptors);
            assert!((1..=u32::from(size).min(MAX_CHAIN_DESCRIPTORS)).contains(&descs));
            assert!(chain.id < size, "id {} of a ring of {size}", chain.id);
            assert_eq!(
                distance(avail, chain.start, size),
                taken,
                "a pop starts where the last one ended"
            );
            taken += descs;
            if let PackedOp::PopLone(_) = step.op {
                assert_eq!(
                    (descs, chain.charged),
                    (1, 1),
                    "a lone descriptor: {chain:?}"
                );
            }
            check_walk(chain.charged, &chain.iovecs, &hosts);
            match &chain.result {
                Ok(total) => {
                    let sum: usize = chain.iovecs.iter().map(|&(_, l)| l).sum();
                    assert_eq!(sum, *total as usize);
                    if let PackedOp::Pop { limit, .. } = step.op {
                        assert!(*total <= limit);
                    }
                }
                Err(_) => assert!(chain.iovecs.is_empty()),
            }
        }
        if taken > 0 {
            assert_eq!(
                distance(avail, step.next_avail, size),
                taken % (2 * u32::from(size))
            );
            assert_eq!(step.in_flight, in_flight + taken, "{step:?}");
        }
        if step.completed > 0 {
            assert!(step.completed <= in_flight, "used more than was taken");
            assert_eq!(
                distance(used, step.next_used, size),
                step.completed % (2 * u32::from(size))
            );
            assert_eq!(step.in_flight, in_flight - step.completed);
        } else if step.popped.is_empty() && !matches!(step.op, PackedOp::Unpop) {
            assert_eq!((step.next_used, step.in_flight), (used, in_flight));
        }
        assert!(step.in_flight <= u32::from(size));
        assert_eq!(
            distance(step.next_used, step.next_avail, size),
            step.in_flight % (2 * u32::from(size)),
            "{step:?}"
        );
        avail = step.next_avail;
        used = step.next_used;
        in_flight = step.in_flight;
    }
});
