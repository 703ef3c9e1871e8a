//! The legacy PC platform devices the guest kernel needs to boot quickly: a 16550 UART on COM1,
//! a CMOS RTC and the i8042 controller (used only for its CPU-reset command).
//!
//! Each wraps a model that does the real work (vm-superio where one exists) and adapts it to
//! [`crate::BusDevice`].

mod i8042;
mod rtc;
mod serial;

pub use i8042::I8042;
pub use rtc::CmosRtc;
pub use serial::{EventFdTrigger, Serial};
