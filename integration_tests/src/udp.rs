//! UDP through the Linux guest's `nettest` echo server: its datagram pattern and a windowed
//! echo exchange.

use std::net::UdpSocket;
use std::time::Duration;

/// Datagram `seq` of `size` bytes in nettest's pattern (it drops others as bad): seq and size
/// (u32 LE each), then byte i = seq·31 + i.
pub fn pattern(seq: u32, size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v[0..4].copy_from_slice(&seq.to_le_bytes());
    v[4..8].copy_from_slice(&(size as u32).to_le_bytes());
    for (i, b) in v.iter_mut().enumerate().skip(8) {
        *b = (seq.wrapping_mul(31).wrapping_add(i as u32)) as u8;
    }
    v
}

/// Sends `count` datagrams from `host_ip` to `guest_ip:port` (sizes cycling through `sizes`)
/// with at most `window` in flight, and checks that each echo comes back intact and in order.
/// Returns (datagrams echoed, payload bytes each way).
pub fn echo(
    (host_ip, guest_ip, port): (&str, &str, u16),
    count: usize,
    window: usize,
    sizes: &[usize],
) -> Result<(usize, usize), String> {
    let sock = UdpSocket::bind((host_ip, 0)).map_err(|e| format!("bind: {e}"))?;
    sock.connect((guest_ip, port))
        .map_err(|e| format!("connect: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    let (mut next, mut received, mut bytes) = (0usize, 0usize, 0usize);
    let mut buf = vec![0u8; 65536];
    while received < count {
        while next < count && next - received < window {
            sock.send(&pattern(next as u32, sizes[next % sizes.len()]))
                .map_err(|e| format!("send #{next}: {e}"))?;
            next += 1;
        }
        let n = sock
            .recv(&mut buf)
            .map_err(|e| format!("no echo after {received} of {count} datagrams: {e}"))?;
        let seq = u32::from_le_bytes(buf[0..4].try_into().unwrap_or_default());
        if seq as usize != received {
            return Err(format!(
                "echo #{received} came back as #{seq} (lost or reordered)"
            ));
        }
        if buf[..n] != pattern(seq, sizes[received % sizes.len()])[..] {
            return Err(format!(
                "echo #{seq} ({n} bytes) differs from what was sent"
            ));
        }
        received += 1;
        bytes += n;
    }
    Ok((received, bytes))
}
