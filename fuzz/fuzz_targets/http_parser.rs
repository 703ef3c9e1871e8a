//! The HTTP request parser, fed arbitrary bytes in arbitrary chunks.
//!
//! Invariants: the parser never holds more than its bounds (measured by a counting allocator
//! as well as by `buffered`); no request has a body over the limit or more header fields than
//! allowed; feeding in chunks gives the same requests and error as feeding at once; and every
//! request parsed, written back out, parses to itself.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use libfuzzer_sys::fuzz_target;
use vmm::api::http::{Event, HttpError, Parser, Request, MAX_HEADERS, MAX_HEAD_BYTES};
use vmm::api::MAX_BODY_BYTES;

/// Counts the bytes live on the heap and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator with the same arguments; the
// counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most the parser may hold for one request: the head while it is read, then the parsed
/// head (no larger than its text, plus the bookkeeping of at most MAX_HEADERS fields) and the
/// body. Generous, but far below what a peer could declare.
const HEAP_BOUND: usize = 4 * MAX_HEAD_BYTES + 2 * MAX_BODY_BYTES + MAX_HEADERS * 128;

/// Feeds `input` in the chunk sizes `sizes` (cycled); returns the requests and the error.
fn run(input: &[u8], sizes: &[usize]) -> (Vec<Request>, Option<HttpError>) {
    let mut parser = Parser::new();
    let mut requests = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let size = sizes[i % sizes.len()].clamp(1, rest.len());
        i += 1;
        let mut chunk = &rest[..size];
        rest = &rest[size..];
        while !chunk.is_empty() {
            match parser.feed(chunk) {
                Ok(step) => {
                    assert!(step.consumed <= chunk.len());
                    assert!(step.consumed > 0 || step.event.is_some(), "no progress");
                    chunk = &chunk[step.consumed..];
                    if let Some(Event::Request(r)) = step.event {
                        assert!(r.body.len() <= MAX_BODY_BYTES);
                        assert!(r.headers.len() <= MAX_HEADERS);
                        requests.push(r);
                    }
                }
                Err(e) => return (requests, Some(e)),
            }
            assert!(parser.buffered() <= MAX_HEAD_BYTES.max(MAX_BODY_BYTES));
        }
    }
    (requests, None)
}

fuzz_target!(|data: &[u8]| {
    // The first bytes choose the chunk sizes, the rest is what the peer sends.
    let (sizes, input) = data.split_at(data.len().min(4));
    let sizes: Vec<usize> = if sizes.is_empty() {
        vec![1]
    } else {
        sizes.iter().map(|&b| usize::from(b) * 17 + 1).collect()
    };
    let start = LIVE.load(Ordering::Relaxed);
    PEAK.store(start, Ordering::Relaxed);
    let (whole, whole_error) = run(input, &[input.len().max(1)]);
    // The requests themselves are returned to us: count what the parser held beyond them.
    let returned: usize = whole
        .iter()
        .map(|r| r.body.capacity() + 2 * MAX_HEAD_BYTES)
        .sum::<usize>()
        + 3 * whole.capacity() * std::mem::size_of::<Request>();
    let peak = PEAK.load(Ordering::Relaxed) - start;
    assert!(
        peak <= HEAP_BOUND + returned,
        "the parser held {peak} bytes for {} of input",
        input.len()
    );
    let (chunked, chunked_error) = run(input, &sizes);
    assert_eq!(whole, chunked);
    assert_eq!(whole_error, chunked_error);
    for request in &whole {
        let (again, error) = run(&request.to_bytes(), &[usize::MAX]);
        assert_eq!(error, None, "{request:?}");
        assert_eq!(again.as_slice(), std::slice::from_ref(request));
    }
});
