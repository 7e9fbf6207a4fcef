//! A sum that decays by a constant factor per step of an outside clock (a count of picks or of
//! records), kept in one atomic word and updated without a lock. The affinity mode's pick
//! shares ([`crate::scheduler::affinity::RecentPicks`]) and the prefix index's per-pod eviction
//! rate ([`crate::prefix_index::PrefixIndex::churn`]) are such sums.

use std::sync::atomic::{AtomicU64, Ordering};

/// `value` as of clock step `at`, packed as `at << 32 | value.to_bits()`.
#[derive(Debug, Default)]
pub struct DecayingSum(AtomicU64);

impl DecayingSum {
    fn unpack(v: u64) -> (u32, f32) {
        ((v >> 32) as u32, f32::from_bits(v as u32))
    }

    fn pack(at: u32, value: f32) -> u64 {
        (u64::from(at) << 32) | u64::from(value.to_bits())
    }

    fn decayed(v: u64, now: u32, keep: f64) -> f64 {
        Self::decayed_ln(v, now, keep.ln())
    }

    fn decayed_ln(v: u64, now: u32, ln_keep: f64) -> f64 {
        let (at, value) = Self::unpack(v);
        let steps = now.wrapping_sub(at);
        if steps == 0 || value == 0.0 {
            return f64::from(value);
        }
        if steps > 1 << 20 {
            return 0.0;
        }
        // keep^steps, as one exp (a powi is a libcall loop).
        f64::from(value) * (ln_keep * f64::from(steps)).exp()
    }

    /// The sum at clock step `now`, each step keeping `keep` of the sum before it.
    pub fn value(&self, now: u32, keep: f64) -> f64 {
        Self::decayed(self.0.load(Ordering::Relaxed), now, keep)
    }

    /// [`DecayingSum::value`] given `keep.ln()`, for a caller that reads many sums with one
    /// `keep` (the same number, without a logarithm per sum).
    pub fn value_ln(&self, now: u32, ln_keep: f64) -> f64 {
        Self::decayed_ln(self.0.load(Ordering::Relaxed), now, ln_keep)
    }

    /// The values of two sums at clock step `now`, given `keep.ln()`: one `exp` when both were
    /// last added at the same step (sums that every step adds to together).
    pub fn pair_ln(a: &DecayingSum, b: &DecayingSum, now: u32, ln_keep: f64) -> (f64, f64) {
        let (va, vb) = (a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed));
        let (at_a, value_a) = Self::unpack(va);
        let (at_b, value_b) = Self::unpack(vb);
        if at_a != at_b || value_a == 0.0 {
            return (
                Self::decayed_ln(va, now, ln_keep),
                Self::decayed_ln(vb, now, ln_keep),
            );
        }
        let a = Self::decayed_ln(va, now, ln_keep);
        let factor = a / f64::from(value_a);
        (a, f64::from(value_b) * factor)
    }

    /// Adds `amount` at step `now`, after the step's decay: the sum as of step `now + 1`.
    pub fn add(&self, now: u32, keep: f64, amount: f64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let value = Self::decayed(v, now, keep) * keep + amount;
                Some(Self::pack(now.wrapping_add(1), value as f32))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decays_by_keep_per_step_and_adds() {
        let sum = DecayingSum::default();
        assert_eq!(sum.value(0, 0.5), 0.0);
        sum.add(0, 0.5, 1.0);
        assert!((sum.value(1, 0.5) - 1.0).abs() < 1e-6);
        assert!((sum.value(3, 0.5) - 0.25).abs() < 1e-6);
        sum.add(3, 0.5, 1.0);
        assert!((sum.value(4, 0.5) - 1.125).abs() < 1e-6);
        // Far in the future: nothing left.
        assert_eq!(sum.value(4 + (1 << 21), 0.5), 0.0);
    }

    #[test]
    fn a_pair_reads_as_each_alone() {
        let ln = 0.5f64.ln();
        let (a, b) = (DecayingSum::default(), DecayingSum::default());
        assert_eq!(DecayingSum::pair_ln(&a, &b, 3, ln), (0.0, 0.0));
        // Added together (one exp for both), then apart (one each).
        a.add(0, 0.5, 1.0);
        b.add(0, 0.5, 3.0);
        let both = |now| (a.value_ln(now, ln), b.value_ln(now, ln));
        for now in [1, 4, 4 + (1 << 21)] {
            let (x, y) = DecayingSum::pair_ln(&a, &b, now, ln);
            let (ex, ey) = both(now);
            assert!(
                (x - ex).abs() < 1e-9 && (y - ey).abs() < 1e-9,
                "{now}: {x} {y}"
            );
        }
        b.add(4, 0.5, 1.0);
        let (x, y) = DecayingSum::pair_ln(&a, &b, 6, ln);
        let (ex, ey) = both(6);
        assert!((x - ex).abs() < 1e-9 && (y - ey).abs() < 1e-9, "{x} {y}");
    }
}
