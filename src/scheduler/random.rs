//! random: a uniform 0..=100 score per pod from the decision's seeded RNG. Kthena removes it
//! (with a warning) when other score plugins are enabled; alone, it spreads load at random.

use rand::Rng;

use super::Candidate;

pub fn score<C: Candidate>(candidates: &[C], rng: &mut impl Rng) -> Vec<u32> {
    candidates
        .iter()
        .map(|_| rng.random_range(0..=100))
        .collect()
}
