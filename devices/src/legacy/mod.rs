//! The legacy PC platform devices the guest kernel needs to boot quickly: a 16550 UART on COM1,
//! a CMOS RTC and the i8042 controller (CPU reset, and Ctrl+Alt+Del injection).
//!
//! Each wraps a model that does the real work (vm-superio where one exists) and adapts it to
//! [`crate::BusDevice`].

mod i8042;
mod rtc;
mod serial;

pub use i8042::{I8042Error, I8042};
pub use rtc::CmosRtc;
pub use serial::{EventFdTrigger, Serial};
