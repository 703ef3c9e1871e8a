//! Single-producer / single-consumer rings of `Copy` values, shaped like AF_XDP's: the producer
//! fills slots privately and [`submit`](Producer::submit)s them with one Release store of its
//! index; the consumer reads slots up to the producer index it loaded with Acquire and
//! [`release`](Consumer::release)s them with one Release store of its index. Each side caches
//! the other's index and reloads it only when its cached view runs out.
//!
//! The two halves may live on different threads (both are `Send` when `T` is).

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use core::sync::atomic::{AtomicU32, Ordering};

struct Shared<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: u32,
    /// Slots `[consumer, producer)` hold submitted values.
    producer: AtomicU32,
    consumer: AtomicU32,
}

// SAFETY: a slot is written only by the one `Producer`, while it is outside the consumer's
// window, and read only by the one `Consumer`, while it is inside it; the Release/Acquire pairs
// on the two indexes order those accesses. Values of `T: Send` cross threads that way.
unsafe impl<T: Send> Sync for Shared<T> {}

/// The producing half of a ring.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Next slot to fill (ahead of the published index by the unsubmitted values).
    head: u32,
    /// Consumer index last loaded.
    cached_tail: u32,
}

/// The consuming half of a ring.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Next slot to read (ahead of the published index by the unreleased values).
    tail: u32,
    /// Producer index last loaded.
    cached_head: u32,
}

/// A ring of `capacity` slots (a power of two ≥ 2), or `None` for other sizes.
pub fn ring<T: Copy>(capacity: u32) -> Option<(Producer<T>, Consumer<T>)> {
    if capacity < 2 || !capacity.is_power_of_two() {
        return None;
    }
    let slots: Vec<_> = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let shared = Arc::new(Shared {
        slots: slots.into_boxed_slice(),
        mask: capacity - 1,
        producer: AtomicU32::new(0),
        consumer: AtomicU32::new(0),
    });
    Some((
        Producer {
            shared: shared.clone(),
            head: 0,
            cached_tail: 0,
        },
        Consumer {
            shared,
            tail: 0,
            cached_head: 0,
        },
    ))
}

impl<T: Copy> Producer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Free slots (reloads the consumer index when the cached view shows fewer than `want`).
    fn free_at_least(&mut self, want: u32) -> u32 {
        let free = self.capacity() - self.head.wrapping_sub(self.cached_tail);
        if free >= want {
            return free;
        }
        self.cached_tail = self.shared.consumer.load(Ordering::Acquire);
        self.capacity() - self.head.wrapping_sub(self.cached_tail)
    }

    /// Free slots right now.
    pub fn free(&mut self) -> u32 {
        self.free_at_least(u32::MAX)
    }

    /// Writes `value` into the next slot (not yet visible); gives it back if the ring is full.
    pub fn push(&mut self, value: T) -> Result<(), T> {
        if self.free_at_least(1) == 0 {
            return Err(value);
        }
        let slot = &self.shared.slots[(self.head & self.shared.mask) as usize];
        // SAFETY: the slot is outside the consumer's window (fewer than `capacity` values
        // between the consumer index, loaded with Acquire after the consumer released the slot,
        // and `head`), so only this producer accesses it.
        unsafe { (*slot.get()).write(value) };
        self.head = self.head.wrapping_add(1);
        Ok(())
    }

    /// Makes every pushed value visible to the consumer.
    pub fn submit(&mut self) {
        self.shared.producer.store(self.head, Ordering::Release);
    }

    /// Values pushed but not submitted.
    pub fn unsubmitted(&self) -> u32 {
        self.head
            .wrapping_sub(self.shared.producer.load(Ordering::Relaxed))
    }
}

impl<T: Copy> Consumer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Values available to read (reloads the producer index when the cached view is empty).
    pub fn available(&mut self) -> u32 {
        if self.cached_head == self.tail {
            self.cached_head = self.shared.producer.load(Ordering::Acquire);
        }
        self.cached_head.wrapping_sub(self.tail)
    }

    /// The next value, without consuming it.
    pub fn peek(&mut self) -> Option<T> {
        if self.available() == 0 {
            return None;
        }
        let slot = &self.shared.slots[(self.tail & self.shared.mask) as usize];
        // SAFETY: the slot is below the producer index loaded with Acquire, so the producer
        // initialised it before submitting, and it will not rewrite it before we release it.
        Some(unsafe { (*slot.get()).assume_init() })
    }

    /// Consumes the next value (its slot is returned to the producer on [`Self::release`]).
    pub fn pop(&mut self) -> Option<T> {
        let value = self.peek()?;
        self.tail = self.tail.wrapping_add(1);
        Some(value)
    }

    /// Returns the consumed slots to the producer.
    pub fn release(&mut self) {
        self.shared.consumer.store(self.tail, Ordering::Release);
    }

    /// Pops and releases up to `out.len()` values into `out`; returns how many.
    pub fn pop_into(&mut self, out: &mut [T]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.pop() {
                Some(v) => out[n] = v,
                None => break,
            }
            n += 1;
        }
        self.release();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_with_wraparound_and_back_pressure() {
        assert!(ring::<u32>(3).is_none() && ring::<u32>(1).is_none());
        let (mut p, mut c) = ring::<u32>(4).expect("size");
        let (mut next_in, mut next_out) = (0u32, 0u32);
        // Many more than 2^0 wraps of the slots; the u32 indexes wrap in the last test.
        for round in 0..1000u32 {
            for _ in 0..round % 6 {
                match p.push(next_in) {
                    Ok(()) => next_in += 1,
                    // Full exactly when 4 values are pushed and not yet released.
                    Err(v) => assert_eq!((v, next_in - next_out), (next_in, 4)),
                }
            }
            assert_eq!(p.free(), 4 - (next_in - next_out));
            p.submit();
            assert_eq!(p.unsubmitted(), 0);
            let mut out = [0u32; 3];
            let n = c.pop_into(&mut out[..(round % 4) as usize]);
            for v in &out[..n] {
                assert_eq!(*v, next_out);
                next_out += 1;
            }
        }
        assert!(next_out > 500);
    }

    #[test]
    fn indexes_wrap_around_u32() {
        let (mut p, mut c) = ring::<u32>(2).expect("size");
        p.head = u32::MAX - 1;
        p.cached_tail = u32::MAX - 1;
        p.shared.producer.store(u32::MAX - 1, Ordering::Relaxed);
        p.shared.consumer.store(u32::MAX - 1, Ordering::Relaxed);
        c.tail = u32::MAX - 1;
        c.cached_head = u32::MAX - 1;
        for i in 0..10 {
            p.push(2 * i).expect("room");
            p.push(2 * i + 1).expect("room");
            assert!(p.push(99).is_err());
            p.submit();
            assert_eq!(c.pop(), Some(2 * i));
            assert_eq!(c.pop(), Some(2 * i + 1));
            assert_eq!(c.pop(), None);
            c.release();
        }
    }

    #[test]
    fn threads_pass_values_in_order() {
        let (mut p, mut c) = ring::<u64>(64).expect("size");
        const N: u64 = 200_000;
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                while i < N && p.push(i).is_ok() {
                    i += 1;
                }
                p.submit();
                std::thread::yield_now();
            }
        });
        let mut expect = 0;
        while expect < N {
            while let Some(v) = c.pop() {
                assert_eq!(v, expect);
                expect += 1;
            }
            c.release();
            std::thread::yield_now();
        }
        producer.join().expect("producer");
    }
}
