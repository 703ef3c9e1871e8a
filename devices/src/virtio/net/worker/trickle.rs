//! The adapter's kick coalescing, watched look by look for a trickle.
//!
//! A driver with one frame in flight (a request/response trickle between two floods) gains
//! nothing from kick coalescing: each look finds the one frame the driver queued since the
//! last, and the frame waits for the look where a kick would have brought it at once (on this
//! project's host a trickle's round trip took a median 50 µs with the 20 µs look against 25 µs
//! with kicks). The adapter sees that only at the end of its intervals, one or two
//! milliseconds into the trickle, so the worker watches the looks: after [`TRICKLE_LOOKS`]
//! looks in a row that sent one frame each, the driver is asked to kick its next buffer, and
//! goes on kicking while each kick brings one frame. A kick that brings several (the flood is
//! back), or an adaptation interval the adapter still calls a flood, ends the watch, and the
//! next drain coalesces again. The operator's fixed kick coalescing is left as set: a look
//! shorter than this host's kick may serve a trickle faster than the kick would.

/// Looks in a row that sent one frame each before the driver kicks again.
pub(super) const TRICKLE_LOOKS: u8 = 2;

/// Consecutive single-frame looks of the adapter's kick coalescing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TrickleWatch {
    single: u8,
}

impl TrickleWatch {
    /// A look found frames: true if its own drain should already ask for a kick at the next
    /// buffer (it would be the last of the looks in a row that make a trickle, if it sends one
    /// frame; if it sends more, the kick that follows brings coalescing back).
    pub(super) fn quiet_for_look(&self) -> bool {
        self.single.saturating_add(1) >= TRICKLE_LOOKS
    }

    /// A look sent `sent` frames: true if the driver's next buffer should kick (a trickle).
    pub(super) fn looked(&mut self, sent: u64) -> bool {
        self.single = if sent <= 1 {
            self.single.saturating_add(1)
        } else {
            0
        };
        self.trickles()
    }

    /// The looks found a trickle: the driver kicks each buffer.
    pub(super) fn trickles(&self) -> bool {
        self.single >= TRICKLE_LOOKS
    }

    /// A kick sent `sent` frames while the driver was trickling: true if it still is (one
    /// frame); several are a flood, which the next drain coalesces again.
    pub(super) fn kicked(&mut self, sent: u64) -> bool {
        if sent > 1 {
            self.single = 0;
        }
        self.trickles()
    }

    /// Forgets the looks (kick coalescing off or no longer the adapter's, or the adapter
    /// judged the last interval a flood).
    pub(super) fn reset(&mut self) {
        self.single = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_single_frame_looks_in_a_row_make_a_trickle() {
        let mut w = TrickleWatch::default();
        assert!(!w.quiet_for_look(), "the first look coalesces on");
        assert!(!w.looked(1));
        // The second look's drain already asks for a kick.
        assert!(w.quiet_for_look());
        assert!(w.looked(1));
        assert!(w.trickles());
        // A look that found nothing sends nothing: still a trickle.
        assert!(w.looked(0));
    }

    #[test]
    fn a_look_that_sends_several_frames_is_no_trickle() {
        let mut w = TrickleWatch::default();
        assert!(!w.looked(1));
        assert!(
            !w.looked(2),
            "several frames: a flood, the count starts again"
        );
        assert!(!w.quiet_for_look());
        assert!(!w.looked(1));
        assert!(w.looked(1));
        assert!(!w.looked(40));
        assert!(!w.trickles());
    }

    #[test]
    fn kicks_of_one_frame_keep_the_trickle_and_a_kick_of_several_ends_it() {
        let mut w = TrickleWatch::default();
        w.looked(1);
        w.looked(1);
        for _ in 0..1000 {
            assert!(w.kicked(1));
        }
        assert!(!w.kicked(2));
        assert!(!w.trickles());
        assert!(!w.quiet_for_look());
    }

    #[test]
    fn reset_forgets_the_looks() {
        let mut w = TrickleWatch::default();
        w.looked(1);
        w.looked(1);
        w.reset();
        assert_eq!(w, TrickleWatch::default());
        assert!(!w.looked(1));
    }
}
