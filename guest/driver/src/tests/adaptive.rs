//! Adaptation through the driver.
