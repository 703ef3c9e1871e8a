//! A CMOS real-time clock on ports 0x70 (index) / 0x71 (data).
//!
//! Without it Linux probes the RTC for seconds (tens of thousands of port exits) and has no
//! wall-clock time. The clock reads the host's UTC time in BCD, 24-hour mode; the update-in-
//! progress bit is never set, so the guest reads it in one pass. The other bytes are plain RAM.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::BusDevice;

const REG_SECONDS: u8 = 0x00;
const REG_MINUTES: u8 = 0x02;
const REG_HOURS: u8 = 0x04;
const REG_WEEKDAY: u8 = 0x06;
const REG_DAY: u8 = 0x07;
const REG_MONTH: u8 = 0x08;
const REG_YEAR: u8 = 0x09;
const REG_STATUS_A: u8 = 0x0a;
const REG_STATUS_B: u8 = 0x0b;
const REG_STATUS_C: u8 = 0x0c;
const REG_STATUS_D: u8 = 0x0d;
const REG_CENTURY: u8 = 0x32;

/// Status A: 32.768 kHz time base, 1024 Hz rate; UIP (bit 7) clear.
const STATUS_A: u8 = 0x26;
/// Status B: 24-hour mode, BCD, no interrupts enabled.
const STATUS_B: u8 = 0x02;
/// Status D: valid RAM and time.
const STATUS_D: u8 = 0x80;

/// The CMOS RTC and its 128 bytes of RAM.
pub struct CmosRtc {
    index: u8,
    ram: [u8; 128],
    now: fn() -> u64,
}

impl Default for CmosRtc {
    fn default() -> Self {
        Self::new()
    }
}

impl CmosRtc {
    /// An RTC that reads the host clock.
    pub fn new() -> Self {
        Self::with_clock(host_unix_time)
    }

    /// An RTC that reads `now` (seconds since the Unix epoch, UTC).
    pub fn with_clock(now: fn() -> u64) -> Self {
        CmosRtc {
            index: 0,
            ram: [0; 128],
            now,
        }
    }

    fn read_register(&self, reg: u8) -> u8 {
        let t = CivilTime::from_unix((self.now)());
        match reg {
            REG_SECONDS => bcd(t.second),
            REG_MINUTES => bcd(t.minute),
            REG_HOURS => bcd(t.hour),
            REG_WEEKDAY => bcd(t.weekday),
            REG_DAY => bcd(t.day),
            REG_MONTH => bcd(t.month),
            REG_YEAR => bcd((t.year % 100) as u8),
            REG_CENTURY => bcd((t.year / 100) as u8),
            REG_STATUS_A => STATUS_A,
            REG_STATUS_B => STATUS_B,
            REG_STATUS_C => 0,
            REG_STATUS_D => STATUS_D,
            other => self.ram[usize::from(other & 0x7f)],
        }
    }
}

impl BusDevice for CmosRtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = data.first_mut() else {
            return;
        };
        *first = match offset {
            0 => self.index,
            1 => self.read_register(self.index),
            _ => 0xff,
        };
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        match offset {
            // Bit 7 of the index port is the NMI mask; the index is the low 7 bits.
            0 => self.index = value & 0x7f,
            1 => match self.index {
                // The clock and status registers are not settable: the guest's clock follows
                // the host's.
                REG_SECONDS..=REG_STATUS_D | REG_CENTURY => {}
                i => self.ram[usize::from(i)] = value,
            },
            _ => {}
        }
    }
}

fn host_unix_time() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn bcd(v: u8) -> u8 {
    ((v / 10) << 4) | (v % 10)
}

/// A UTC calendar time.
#[derive(Debug, PartialEq, Eq)]
struct CivilTime {
    year: u32,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
    /// 1 = Sunday … 7 = Saturday, as the CMOS counts.
    weekday: u8,
}

impl CivilTime {
    /// Converts Unix seconds to a calendar date (Howard Hinnant's days-to-civil algorithm).
    fn from_unix(secs: u64) -> Self {
        let days = secs / 86_400;
        let rem = secs % 86_400;
        // 1970-01-01 was a Thursday (5 in 1..=7 from Sunday).
        let weekday = ((days + 4) % 7) as u8 + 1;
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let year = (yoe + era * 400 + i64::from(month <= 2)) as u32;
        CivilTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u8,
            minute: (rem / 60 % 60) as u8,
            second: (rem % 60) as u8,
            weekday,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(rtc: &mut CmosRtc, reg: u8) -> u8 {
        rtc.write(0, &[reg | 0x80]);
        let mut v = [0u8];
        rtc.read(1, &mut v);
        v[0]
    }

    #[test]
    fn civil_time_conversion() {
        // 2026-11-29 21:58:14 UTC, a Sunday.
        let t = CivilTime::from_unix(1_795_989_494);
        assert_eq!(
            t,
            CivilTime {
                year: 2026,
                month: 11,
                day: 29,
                hour: 21,
                minute: 58,
                second: 14,
                weekday: 1
            }
        );
        // Leap day.
        let t = CivilTime::from_unix(951_782_400); // 2000-02-29 00:00:00
        assert_eq!((t.year, t.month, t.day), (2000, 2, 29));
    }

    #[test]
    fn registers_read_bcd_time_and_status() {
        let mut rtc = CmosRtc::with_clock(|| 1_795_989_494);
        assert_eq!(read(&mut rtc, REG_SECONDS), 0x14);
        assert_eq!(read(&mut rtc, REG_MINUTES), 0x58);
        assert_eq!(read(&mut rtc, REG_HOURS), 0x21);
        assert_eq!(read(&mut rtc, REG_DAY), 0x29);
        assert_eq!(read(&mut rtc, REG_MONTH), 0x11);
        assert_eq!(read(&mut rtc, REG_YEAR), 0x26);
        assert_eq!(read(&mut rtc, REG_CENTURY), 0x20);
        assert_eq!(
            read(&mut rtc, REG_STATUS_A) & 0x80,
            0,
            "never update-in-progress"
        );
        assert_eq!(read(&mut rtc, REG_STATUS_B), STATUS_B);
        assert_eq!(read(&mut rtc, REG_STATUS_D), STATUS_D);
    }

    #[test]
    fn cmos_ram_is_writable_but_clock_is_not() {
        let mut rtc = CmosRtc::with_clock(|| 0);
        rtc.write(0, &[0x40]);
        rtc.write(1, &[0x5a]);
        assert_eq!(read(&mut rtc, 0x40), 0x5a);
        rtc.write(0, &[REG_SECONDS]);
        rtc.write(1, &[0x33]);
        assert_eq!(read(&mut rtc, REG_SECONDS), 0);
    }
}
