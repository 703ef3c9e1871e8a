//! A fake virtio device for the transport tests: it records what it is asked to do and answers
//! as its [`FakeState`] says.

use std::sync::{Arc, Mutex, MutexGuard};

use virtio_queue::Queue;

use crate::virtio::{
    ActivateError, ActivationContext, FeatureDependencyError, QueueResetState, VirtioDevice,
};

/// A feature the fake device accepts only with its prerequisite `F_DEP`.
pub(crate) const F_NEEDS: u64 = 1 << 5;
pub(crate) const F_DEP: u64 = 1 << 6;
/// With it, the driver may leave any queue disabled at DRIVER_OK.
pub(crate) const F_OPTIONAL: u64 = 1 << 7;

/// What the fake device was asked to do, and how it answers.
#[derive(Default)]
pub(crate) struct FakeState {
    pub(crate) ctx: Option<ActivationContext>,
    pub(crate) activations: usize,
    pub(crate) resets: usize,
    pub(crate) config_writes: Vec<(u64, Vec<u8>)>,
    /// Queues `reset_queue` was called for.
    pub(crate) queue_resets: Vec<usize>,
    /// What `reset_queue` answers (None: Done).
    pub(crate) reset_answer: Option<QueueResetState>,
    /// What `poll_queue_reset` answers (None: Done).
    pub(crate) poll_answer: Option<QueueResetState>,
    /// Queues handed back by `enable_queue`.
    pub(crate) queue_enables: Vec<(usize, Queue)>,
    /// Refuse activation.
    pub(crate) refuse_activation: bool,
}

/// A device of type 1 with the given queues and features; `F_NEEDS` needs `F_DEP`, and with
/// `F_OPTIONAL` any queue may be left disabled. Its configuration space is 8 bytes, 0xa0 +
/// offset, and its generation 0x1_0007.
pub(crate) struct FakeDevice {
    pub(crate) state: Arc<Mutex<FakeState>>,
    pub(crate) sizes: Vec<u16>,
    pub(crate) features: u64,
    /// Implements per-queue reset.
    pub(crate) resettable: bool,
}

impl VirtioDevice for FakeDevice {
    fn device_type(&self) -> u32 {
        1
    }
    fn queue_max_sizes(&self) -> &[u16] {
        &self.sizes
    }
    fn features(&self) -> u64 {
        self.features
    }
    fn queue_optional(&self, _index: usize, acked: u64) -> bool {
        acked & F_OPTIONAL != 0
    }
    fn validate_features(&self, acked: u64) -> Result<(), FeatureDependencyError> {
        if acked & F_NEEDS != 0 && acked & F_DEP == 0 {
            return Err(FeatureDependencyError {
                feature: "F_NEEDS",
                requires: "F_DEP",
            });
        }
        Ok(())
    }
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            let o = offset + i as u64;
            *b = if o < 8 { 0xa0 + o as u8 } else { 0 };
        }
    }
    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let mut s = lock(&self.state);
        s.config_writes.push((offset, data.to_vec()));
    }
    fn config_generation(&self) -> u32 {
        0x1_0007
    }
    fn activate(&mut self, ctx: ActivationContext) -> Result<(), ActivateError> {
        let mut s = lock(&self.state);
        s.activations += 1;
        if s.refuse_activation {
            return Err(ActivateError::BackendUnavailable);
        }
        s.ctx = Some(ctx);
        Ok(())
    }
    fn reset(&mut self) {
        let mut s = lock(&self.state);
        s.resets += 1;
        s.ctx = None;
    }
    fn is_active(&self) -> bool {
        lock(&self.state).ctx.is_some()
    }
    fn supports_queue_reset(&self) -> bool {
        self.resettable
    }
    fn reset_queue(&mut self, index: usize) -> QueueResetState {
        let mut s = lock(&self.state);
        s.queue_resets.push(index);
        s.reset_answer.unwrap_or(QueueResetState::Done)
    }
    fn poll_queue_reset(&mut self, _index: usize) -> QueueResetState {
        lock(&self.state)
            .poll_answer
            .unwrap_or(QueueResetState::Done)
    }
    fn enable_queue(&mut self, index: usize, queue: Queue) -> Result<(), ActivateError> {
        lock(&self.state).queue_enables.push((index, queue));
        Ok(())
    }
}

/// The fake's state, even after a failed assertion poisoned it (the transport's drop resets).
pub(crate) fn lock(state: &Mutex<FakeState>) -> MutexGuard<'_, FakeState> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}
