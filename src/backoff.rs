//! Capped exponential backoff between reconnection attempts: 100 ms doubling to 5 s, reset after
//! a success. Redis links (`sync`, `kvcache`, `kv-relay`) and the KV-event subscribers use it.

use std::time::Duration;

/// Capped exponential backoff.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// The delay before the next attempt (then doubles, up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}
