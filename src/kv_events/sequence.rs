//! A publisher's sequence numbers as a subscriber delivers them: what the next number means
//! (the next one, a gap, a publisher that restarted, a duplicate of a catch-up) and what was
//! delivered. Used by one pod's subscriber ([`super::subscriber`]) and by the shared socket's
//! per-pod streams (`engine_events::shared`), which have no replay: a gap there resets.

use std::fmt;

/// The largest gap asked for: vLLM's default replay buffer (`buffer_steps`).
pub const MAX_REPLAY: u64 = 10_000;

/// Why a `Update::Reset` was sent. `expected..received` are the sequence numbers missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// A gap and no replay endpoint configured.
    NoReplayEndpoint { expected: u64, received: u64 },
    /// A gap larger than [`MAX_REPLAY`].
    GapTooLarge { expected: u64, received: u64 },
    /// Replay failed or did not return every missing batch (or returned one that failed to
    /// decode); `replayed` batches had arrived.
    ReplayIncomplete {
        expected: u64,
        received: u64,
        replayed: u64,
    },
    /// The first message after a reconnect was not the next one.
    Reconnected { expected: u64, received: u64 },
    /// The sequence went back: the publisher restarted.
    PublisherRestarted { last: u64, received: u64 },
}

impl ResetReason {
    /// Whether the batch after this reset may be caught up from the replay buffer: not after a
    /// replay that just failed or where there is none.
    pub(crate) fn may_catch_up(&self) -> bool {
        match self {
            ResetReason::NoReplayEndpoint { .. } | ResetReason::ReplayIncomplete { .. } => false,
            ResetReason::GapTooLarge { .. }
            | ResetReason::Reconnected { .. }
            | ResetReason::PublisherRestarted { .. } => true,
        }
    }

    /// A short stable name (a metric label).
    pub fn as_str(&self) -> &'static str {
        match self {
            ResetReason::NoReplayEndpoint { .. } => "no_replay_endpoint",
            ResetReason::GapTooLarge { .. } => "gap_too_large",
            ResetReason::ReplayIncomplete { .. } => "replay_incomplete",
            ResetReason::Reconnected { .. } => "reconnected",
            ResetReason::PublisherRestarted { .. } => "publisher_restarted",
        }
    }
}

impl fmt::Display for ResetReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ResetReason::NoReplayEndpoint { expected, received } => write!(
                f,
                "missed batches {expected}..{received} and no replay endpoint"
            ),
            ResetReason::GapTooLarge { expected, received } => write!(
                f,
                "missed batches {expected}..{received}, more than {MAX_REPLAY} to replay"
            ),
            ResetReason::ReplayIncomplete {
                expected,
                received,
                replayed,
            } => write!(
                f,
                "missed batches {expected}..{received}; replay returned {replayed} of them"
            ),
            ResetReason::Reconnected { expected, received } => {
                write!(f, "reconnected at batch {received}, expected {expected}")
            }
            ResetReason::PublisherRestarted { last, received } => write!(
                f,
                "sequence went back from {last} to {received}: the publisher restarted"
            ),
        }
    }
}

/// The sequence as delivered so far.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    /// The last sequence number delivered.
    pub(crate) last: Option<u64>,
    /// No message yet on this connection.
    fresh: bool,
    /// The newest batch the catch-up at connect delivered, until a live one passes it.
    caught_up_to: Option<u64>,
}

/// What one sequence number means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The first ever: nothing to continue.
    First,
    /// Delivered already, by the catch-up at connect.
    Duplicate,
    /// The next one.
    Next,
    /// `expected..received` are missing; replayable.
    Gap { expected: u64 },
    /// Not deliverable in sequence: reset, then take this one as the baseline.
    Reset(ResetReason),
}

impl Sequence {
    pub(crate) fn reconnected(&mut self) {
        self.fresh = true;
        self.caught_up_to = None;
    }

    /// The catch-up at connect delivered up to `newest`: the connection's live messages up to
    /// it are duplicates, the next one continues.
    pub(crate) fn caught_up(&mut self, newest: u64) {
        self.caught_up_to = Some(newest);
        self.fresh = false;
    }

    pub(crate) fn check(&self, received: u64) -> Verdict {
        if self.caught_up_to.is_some_and(|newest| received <= newest) {
            return Verdict::Duplicate;
        }
        let Some(last) = self.last else {
            return Verdict::First;
        };
        let expected = last.wrapping_add(1);
        if received == expected {
            Verdict::Next
        } else if received < expected {
            Verdict::Reset(ResetReason::PublisherRestarted { last, received })
        } else if self.fresh {
            Verdict::Reset(ResetReason::Reconnected { expected, received })
        } else {
            Verdict::Gap { expected }
        }
    }

    pub(crate) fn delivered(&mut self, seq: u64) {
        self.last = Some(seq);
        self.fresh = false;
        if self.caught_up_to.is_some_and(|newest| seq > newest) {
            self.caught_up_to = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(seqs: &[u64], fresh: bool) -> Sequence {
        let mut s = Sequence::default();
        for &q in seqs {
            s.delivered(q);
        }
        if fresh {
            s.reconnected();
        }
        s
    }

    #[test]
    fn sequence_verdicts() {
        assert_eq!(Sequence::default().check(7), Verdict::First);
        assert_eq!(after(&[3], false).check(4), Verdict::Next);
        assert_eq!(after(&[3], false).check(6), Verdict::Gap { expected: 4 });
        assert_eq!(
            after(&[3], false).check(0),
            Verdict::Reset(ResetReason::PublisherRestarted {
                last: 3,
                received: 0
            })
        );
        // The same message repeated is not the next one either.
        assert!(matches!(after(&[3], false).check(3), Verdict::Reset(_)));
        // Across a reconnect only the next one continues.
        assert_eq!(after(&[3], true).check(4), Verdict::Next);
        assert_eq!(
            after(&[3], true).check(6),
            Verdict::Reset(ResetReason::Reconnected {
                expected: 4,
                received: 6
            })
        );
        // A first connection has nothing to continue.
        assert_eq!(after(&[], true).check(9), Verdict::First);
        // Caught up at connect to 5: live batches up to it are duplicates, then the sequence
        // continues as usual.
        let mut s = after(&[], true);
        s.caught_up(5);
        for q in 3..=5 {
            s.delivered(q);
        }
        assert_eq!(s.check(3), Verdict::Duplicate);
        assert_eq!(s.check(5), Verdict::Duplicate);
        assert_eq!(s.check(6), Verdict::Next);
        assert_eq!(s.check(8), Verdict::Gap { expected: 6 });
        s.delivered(6);
        assert!(matches!(s.check(3), Verdict::Reset(_)));
        // A reconnect forgets it.
        s.caught_up(9);
        s.reconnected();
        assert!(matches!(s.check(4), Verdict::Reset(_)));
    }
}
