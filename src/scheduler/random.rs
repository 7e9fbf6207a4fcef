//! random: a uniform 0..=100 score per pod from the decision's seeded RNG. Kthena removes it
//! (with a warning) when other score plugins are enabled; alone, it spreads load at random.

use std::sync::Arc;

use rand::Rng;

use crate::endpoints::Endpoint;

pub fn score(candidates: &[Arc<Endpoint>], rng: &mut impl Rng) -> Vec<u32> {
    candidates
        .iter()
        .map(|_| rng.random_range(0..=100))
        .collect()
}
