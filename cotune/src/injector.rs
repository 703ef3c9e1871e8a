//! The host injector: test frames into a tap from its host side, as fast as the kernel takes
//! them, for receive measurements on a real tap.
//!
//! One thread sends batches of [`BATCH`] frames with one `sendmmsg` on a packet socket bound
//! to the tap (`PACKET_QDISC_BYPASS`: no qdisc between the socket and the tap's queue). The tap
//! hands them to whoever reads its fd (the device, or a bare read loop); what that reader does
//! not take in time the tap drops. The frames are the driver guest's test frames (its `rx=`
//! checks every byte and the sequence number), numbered from 0, so a guest sees the tap's drops
//! as sequence gaps. The injector reports what it sent and how fast, to put beside the guest's
//! figure: a receive point is only a measurement of the guest when the injector outran it.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use devices::backend::{test_frame_header, SOURCE_HEADER_LEN as HEADER_LEN};
use devices::test_utils::link::PacketSocket;

/// Frames per `sendmmsg`.
pub const BATCH: usize = 32;
/// The source MAC of injected frames (locally administered).
pub const INJECTOR_MAC: [u8; 6] = [0x02, 0x1e, 0x5e, 0x00, 0x00, 0x01];

/// Writes the driver guest's test frame `seq` (its `frames` module's layout) into `out`: `dst`,
/// [`INJECTOR_MAC`], EtherType 0x88b5, `seq` (u32 LE), the length (u16 LE), then byte `i` =
/// `(seq + i) as u8`. `out` is 20..=65535 bytes.
pub fn guest_test_frame(out: &mut [u8], dst: [u8; 6], seq: u32) {
    let len = out.len().clamp(HEADER_LEN, usize::from(u16::MAX)) as u16;
    out[..HEADER_LEN].copy_from_slice(&test_frame_header(dst, INJECTOR_MAC, seq, len));
    for (i, b) in out.iter_mut().enumerate().skip(HEADER_LEN) {
        *b = (seq as usize).wrapping_add(i) as u8;
    }
}

/// What an injector did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InjectorStats {
    /// Frames the kernel accepted from the injector.
    pub frames: u64,
    /// Seconds it ran.
    pub secs: f64,
}

impl InjectorStats {
    /// Frames per second it sent.
    pub fn pps(&self) -> f64 {
        self.frames as f64 / self.secs.max(1e-9)
    }
}

/// A running injector; [`Injector::stop`] ends it.
pub struct Injector {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    started: Instant,
    handle: Option<JoinHandle<()>>,
}

impl Injector {
    /// Starts injecting `frame_size`-byte test frames addressed to `dst` through `sock` (a
    /// packet socket bound to the tap, opened in the tap's namespace).
    pub fn start(sock: PacketSocket, dst: [u8; 6], frame_size: usize) -> io::Result<Injector> {
        sock.bypass_qdisc()?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), sent.clone());
        let handle = thread::Builder::new()
            .name("cotune-inject".into())
            .spawn(move || inject(&sock, dst, frame_size.max(HEADER_LEN), &s, &n))?;
        Ok(Injector {
            stop,
            sent,
            started: Instant::now(),
            handle: Some(handle),
        })
    }

    /// Frames sent so far.
    pub fn frames(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops the thread and reports.
    pub fn stop(mut self) -> InjectorStats {
        self.halt();
        InjectorStats {
            frames: self.frames(),
            secs: self.started.elapsed().as_secs_f64(),
        }
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The injector thread: batches of numbered frames until `stop`.
fn inject(sock: &PacketSocket, dst: [u8; 6], size: usize, stop: &AtomicBool, sent: &AtomicU64) {
    let mut frames = vec![vec![0u8; size]; BATCH];
    let mut iovs: Vec<libc::iovec> = frames
        .iter_mut()
        .map(|f| libc::iovec {
            iov_base: f.as_mut_ptr().cast(),
            iov_len: f.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value (no address, no control).
    let mut msgs: Vec<libc::mmsghdr> = (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let mut seq = 0u32;
    let mut total = 0u64;
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        for (i, f) in frames.iter_mut().enumerate() {
            guest_test_frame(f, dst, seq.wrapping_add(i as u32));
        }
        // SAFETY: each mmsghdr points to one iovec of `iovs`, each covering one buffer of
        // `frames`; all outlive the call, and sendmmsg only reads them (the socket is bound,
        // so no address is needed).
        let n = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            seq = seq.wrapping_add(n as u32);
            total += n as u64;
            sent.store(total, Ordering::Relaxed);
            idle = 0;
        } else {
            // The socket's buffer is full (or the link went away): back off a little.
            idle = (idle + 1).min(10);
            thread::sleep(Duration::from_micros(u64::from(idle) * 10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::backend::TEST_ETHERTYPE as ETHERTYPE;

    /// Through a real tap (root): what its fd reads are the injector's frames, numbered in
    /// order (gaps only where the tap dropped), every byte as generated.
    #[test]
    fn injected_frames_reach_the_taps_reader_in_order() {
        let ns = crate::env::trial_netns().expect("namespace");
        let mut tap = ns.tap("itap0").expect("tap");
        devices::backend::NetBackend::set_vnet_hdr_size(&mut tap, 12).expect("vnet header");
        let sock = ns
            .run(|| PacketSocket::open("itap0", ETHERTYPE))
            .expect("run in namespace")
            .expect("packet socket");
        let dst = [2, 0, 0, 0, 0, 0x42];
        let injector = Injector::start(sock, dst, 64).expect("injector");
        let fd = tap.as_raw_fd();
        let mut buf = [0u8; 2048];
        let (mut got, mut last) = (0u64, None::<u32>);
        let deadline = Instant::now() + Duration::from_secs(5);
        while got < 2000 && Instant::now() < deadline {
            // SAFETY: read writes at most buf.len() bytes into buf, which lives for the call.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                crate::env::wait_readable(fd, 10);
                continue;
            }
            // The tap was opened with a 12-byte virtio-net header in front of each frame.
            let f = &buf[12..n as usize];
            if f.len() < 14 || f[12..14] != ETHERTYPE.to_be_bytes() {
                continue;
            }
            let seq = u32::from_le_bytes([f[14], f[15], f[16], f[17]]);
            let mut want = vec![0u8; 64];
            guest_test_frame(&mut want, dst, seq);
            assert_eq!(f, &want[..], "frame {seq}");
            assert!(last.is_none_or(|l| seq > l), "{seq} after {last:?}");
            last = Some(seq);
            got += 1;
        }
        let stats = injector.stop();
        assert!(got >= 2000, "read {got} frames");
        assert!(stats.frames >= got && stats.pps() > 0.0, "{stats:?}");
    }

    #[test]
    fn frames_have_the_driver_guests_layout() {
        let mut f = vec![0u8; 64];
        guest_test_frame(&mut f, [2, 0, 0, 0, 0, 9], 300);
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 9]);
        assert_eq!(&f[6..12], &INJECTOR_MAC);
        assert_eq!(&f[12..14], &[0x88, 0xb5]);
        assert_eq!(&f[14..18], &300u32.to_le_bytes());
        assert_eq!(&f[18..20], &64u16.to_le_bytes());
        for (i, &b) in f.iter().enumerate().skip(20) {
            assert_eq!(b, (300 + i) as u8);
        }
    }
}
