//! The affinity mode (`picker.affinity`): the pick that keeps engines' caches warm while
//! keeping pods balanced. Off (no section), the scheduler is Kthena's.
//!
//! Per request, each candidate has a longest match (blocks held in the index or tentatively,
//! [`crate::prefix_index::TentativeEntries`]) and a load. With the latency model
//! (`latencyModel`, [`super::latency`]) each candidate costs its predicted wait plus the prefill
//! of what it does not hold, that prefill counted once more per slot of queue it would delay
//! (`wait + prefill x (1 + backlog)`); a candidate is *saturated* when it costs more than the
//! least among those within their share (without the model: when its engine queue exceeds
//! `maxQueue` or its in-flight count reaches `podCapacity`), and *over-share* when its share of recent picks exceeds the mean (at least `1/n`) by more than
//! `shareHeadroom` and (`spillHotOnly`) the request's prefix makes up at least half of its
//! requests in flight; the others are *available*. Then:
//! - the longest match overall is on an available pod: pick it (`affinity_hit`);
//! - nobody holds any block: among the available pods within the share headroom, those whose
//!   index evicts least (`placeByChurn`, within `churnSlack`), then the least recent share among
//!   the least loaded (`balanceNew`; else the tie rule) (`affinity_miss`);
//! - the longest match is only on unavailable pods: spill to the available pod with the longest
//!   match, or the least-loaded available pod when none holds any block (`affinity_spill`); that
//!   pod then holds the prefix too, so a hot prefix replicates over as many pods as its load
//!   needs and a cold one stays on one;
//! - with the latency model, a pick that waits because every pod queues is
//!   `affinity_saturated`; without it, nothing available: the least-loaded pod that is not
//!   saturated, else the least-loaded pod (`affinity_saturated`).
//!
//! Before all of these, a request of a session (`picker.sessions`) goes to the pod that served
//! the session's last request unless that pod is saturated (`session`).
//!
//! Ties (equal longest match) go to the least-loaded tied pods (in-flight plus engine queue,
//! within `tieLoadSlack` requests of the least), then by rendezvous hashing of the deepest
//! block the tied pods hold (the first block when none holds any) over their addresses
//! (`consolidateTies`): at equal load every request with that prefix, on every replica, picks
//! the same pod, so a prefix that spilled to a second pod returns to one when the load drops,
//! while new work that only shares a head every pod holds (agent sessions after a common tool
//! preamble) spreads by load. Without it, a seeded random pick.
//! Scraped gauges never outweigh a match while the pod is available.
//!
//! Knobs (defaults): `latencyModel` on (`podCapacity` 64 and `maxQueue` 0 without it),
//! `shareHeadroom` 0.25, `shareWindow` 16
//! (picks per candidate that the share remembers, an exponential moving average),
//! `tieLoadSlack` 0, `spillLoss` 0.25 (an over-share pod keeps a burst in progress: requests
//! whose match there is held by requests in flight and would lose more than a quarter of the
//! prompt elsewhere), `churnSlack` 0.

use std::net::SocketAddr;

use rand::Rng;

use crate::decaying_sum::DecayingSum;
use crate::hashing::BlockHash;

/// The affinity mode's settings (validated: every number in range).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffinityConfig {
    /// Decision-time records: the pick holds the prompt for its pod until completion.
    pub tentative: bool,
    /// Ties broken by rendezvous hashing instead of at random.
    pub consolidate_ties: bool,
    /// Saturated and over-share pods lose affinity.
    pub load_gate: bool,
    pub pod_capacity: u32,
    pub max_queue: u32,
    pub share_headroom: f64,
    pub share_window: u32,
    /// Ties go to the least-loaded tied pods, within this many requests of the least load,
    /// before the rendezvous rule picks among them.
    pub tie_load_slack: u32,
    /// An over-share pod keeps requests whose match there is held by requests in flight (a
    /// burst in progress) when they would lose more than this fraction of their prompt's
    /// blocks on any other available pod (1 or more: never).
    pub spill_loss: f64,
    /// A match held only by requests in flight counts when it covers at least this fraction
    /// of the prompt.
    pub tentative_min_ratio: f64,
    /// Hash prompts past Kthena's 8 KiB, in `block_bytes` blocks up to `max_prompt_bytes`.
    pub long_prompts: bool,
    pub block_bytes: usize,
    pub max_prompt_bytes: usize,
    /// Size each pod's index budget from its engine's KV capacity when it exports it.
    pub engine_budget: bool,
    pub bytes_per_token: u32,
    /// Engine tokens assumed for pods whose engine does not export its capacity (0: use
    /// `maxHashCacheSize`).
    pub engine_tokens: u64,
    /// New prefixes (no available pod holds any block) go to the pod with the least recent
    /// share among the least loaded, instead of by the tie rule.
    pub balance_new: bool,
    /// An over-share pod spills only requests whose head makes up at least half of its
    /// requests in flight (the prefix that drives its load), not its cold prefixes.
    pub spill_hot_only: bool,
    /// New prefixes go, among the available pods within the share headroom, to those whose
    /// index evicts least ([`crate::prefix_index::PrefixIndex::churn`]), within `churnSlack`.
    pub place_by_churn: bool,
    pub churn_slack: f64,
    /// Gate affinity by each candidate's predicted time to first token ([`super::latency`])
    /// instead of `podCapacity` and `maxQueue`.
    pub latency_model: bool,
    /// The signals the latency model uses (`latencySignals`; all by default).
    pub latency_signals: super::latency::Signals,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        AffinityConfig::DEFAULT
    }
}

impl AffinityConfig {
    /// Every key at its default.
    pub const DEFAULT: AffinityConfig = AffinityConfig {
        tentative: true,
        consolidate_ties: true,
        load_gate: true,
        pod_capacity: 64,
        max_queue: 0,
        share_headroom: 0.25,
        share_window: 16,
        tie_load_slack: 0,
        spill_loss: 0.25,
        tentative_min_ratio: 0.9,
        long_prompts: true,
        block_bytes: 128,
        max_prompt_bytes: 256 << 10,
        engine_budget: true,
        bytes_per_token: 4,
        engine_tokens: 0,
        balance_new: true,
        spill_hot_only: true,
        place_by_churn: true,
        churn_slack: 0.0,
        latency_model: true,
        latency_signals: super::latency::Signals::ALL,
    };

    /// Index entries for a pod whose engine holds `tokens` tokens of KV cache.
    pub fn budget_entries(&self, tokens: u64, block_bytes: usize) -> usize {
        let bytes = tokens.saturating_mul(u64::from(self.bytes_per_token));
        usize::try_from(bytes / block_bytes.max(1) as u64)
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

/// Why the affinity pick is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AffinityReason {
    Hit,
    Miss,
    Spill,
    Saturated,
    /// The session's pod (session affinity), not saturated.
    Session,
}

/// A pod's share of recent picks: an exponential moving average over picks (each pick keeps
/// `keep` of the share before it and adds `1 - keep` to its pod's).
#[derive(Debug, Default)]
pub struct RecentPicks(DecayingSum);

impl RecentPicks {
    /// The share at pick number `now`, each pick keeping `keep` of the share before it.
    pub fn share(&self, now: u32, keep: f64) -> f64 {
        self.0.value(now, keep)
    }

    /// [`RecentPicks::share`] given `keep.ln()` (one logarithm for all the candidates).
    pub fn share_ln(&self, now: u32, ln_keep: f64) -> f64 {
        self.0.value_ln(now, ln_keep)
    }

    /// Counts pick number `now` for this pod.
    pub fn add(&self, now: u32, keep: f64) {
        self.0.add(now, keep, 1.0 - keep);
    }
}

/// What the affinity pick knows of a candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodLoad {
    /// A stable identity shared by every replica ([`rendezvous_key`] of the pod's address).
    pub key: u64,
    pub inflight: i64,
    /// The engine's queue (scraped).
    pub waiting: f64,
    /// Share of recent picks ([`RecentPicks::share`]).
    pub share: f64,
    /// Requests in flight on this pod that share the prompt's first block.
    pub head_inflight: u32,
    /// Seconds a request picked now waits for a slot ([`super::latency::PodTiming::wait`]).
    pub wait: f64,
    /// The queue it would join, in slots (positions over concurrency; 0 with a free slot).
    pub backlog: f64,
}

/// The rendezvous identity of a pod: its address, hashed.
pub fn rendezvous_key(address: &SocketAddr) -> u64 {
    let mut bytes = [0u8; 18];
    match address.ip() {
        std::net::IpAddr::V4(ip) => bytes[..4].copy_from_slice(&ip.octets()),
        std::net::IpAddr::V6(ip) => bytes[..16].copy_from_slice(&ip.octets()),
    }
    bytes[16..].copy_from_slice(&address.port().to_le_bytes());
    xxhash_rust::xxh64::xxh64(&bytes, 0x7265_6e64_657a_766f)
}

/// The keep factor of a moving average over `window` picks per candidate.
pub fn keep_factor(window: u32, candidates: usize) -> f64 {
    1.0 - 1.0 / (f64::from(window.max(1)) * candidates.max(1) as f64)
}

fn mix(x: u64) -> u64 {
    let p = u128::from(x) * 0x9E37_79B9_7F4A_7C15_u128;
    (p as u64) ^ ((p >> 64) as u64)
}

/// The pick: the chosen candidate's position and why. `churn(i)` is candidate `i`'s churn,
/// read only for new work; `prefill_per_block` the seconds one uncached block of the prompt
/// costs (the latency model's; unused without it).
#[expect(
    clippy::too_many_arguments,
    reason = "the pick's inputs, each used once; a struct would only rename them"
)]
pub fn pick<R: Rng>(
    config: &AffinityConfig,
    matched: &[usize],
    held: &[usize],
    loads: &[PodLoad],
    hashes: &[BlockHash],
    session: Option<usize>,
    churn: &dyn Fn(usize) -> f64,
    prefill_per_block: f64,
    rng: &mut R,
) -> (usize, AffinityReason) {
    let n = matched.len();
    debug_assert_eq!(n, loads.len());
    // A match held only by requests in flight counts when it covers `tentativeMinRatio` of the
    // prompt, or all of it but one block (the same prompt sent again: a burst); a request that
    // adds more than that to a held head is new work and goes by what completed requests left.
    let total = hashes.len() as f64;
    let allowed_rest = ((1.0 - config.tentative_min_ratio) * total).max(1.0);
    let effective: Vec<usize> = matched
        .iter()
        .zip(held)
        .map(|(&m, &h)| {
            if m > h && total - m as f64 > allowed_rest {
                h
            } else {
                m
            }
        })
        .collect();
    let matched = &effective[..];
    let latency = config.load_gate && config.latency_model;
    // Without the latency model: in flight at `podCapacity` or an engine queue over `maxQueue`.
    let queued = |i: usize| {
        if latency {
            loads[i].wait > 0.0
        } else {
            config.load_gate
                && (loads[i].waiting > f64::from(config.max_queue)
                    || loads[i].inflight >= i64::from(config.pod_capacity))
        }
    };
    let mean = loads.iter().map(|l| l.share).sum::<f64>() / n as f64;
    let limit = (1.0 + config.share_headroom) * mean.max(1.0 / n as f64);
    // Holds are what show a prefix in flight: without `tentative` every prefix counts as hot.
    let hot = |i: usize| {
        !(config.spill_hot_only && config.tentative)
            || i64::from(loads[i].head_inflight) * 2 >= loads[i].inflight.max(1)
    };
    let over = |i: usize| config.load_gate && n > 1 && loads[i].share > limit && hot(i);
    // Each gate is evaluated once per candidate into `gates` (the placement reads them several
    // times per candidate; as closures they cost a third of the pick at 1,024 pods).
    let mut gates: Vec<Gates> = (0..n)
        .map(|i| Gates {
            queued: queued(i),
            over: over(i),
            ..Gates::default()
        })
        .collect();
    // An over-share pod keeps a request whose match there is held by requests in flight (a
    // burst in progress) and would lose more than `spillLoss` of its prompt elsewhere.
    let elsewhere = (0..n)
        .filter(|&i| !gates[i].queued && !gates[i].over)
        .map(|i| matched[i])
        .max()
        .unwrap_or(0);
    let keeps = |i: usize| {
        matched[i] > held[i]
            && (matched[i].saturating_sub(elsewhere)) as f64
                > config.spill_loss * hashes.len() as f64
    };
    // The latency model: a pod whose predicted wait plus prefill exceeds the least among the
    // pods within their share counts as saturated (the match it holds is not worth its queue).
    let cost = |i: usize| {
        loads[i].wait + (total - matched[i] as f64) * prefill_per_block * (1.0 + loads[i].backlog)
    };
    let (mut least_within, mut least_all) = (f64::INFINITY, f64::INFINITY);
    for (i, g) in gates.iter_mut().enumerate() {
        g.share_ok = !g.over || keeps(i);
        if latency {
            g.cost = cost(i);
            least_all = least_all.min(g.cost);
            if g.share_ok {
                least_within = least_within.min(g.cost);
            }
        }
    }
    let least_cost = if least_within.is_finite() {
        least_within
    } else {
        least_all
    };
    for g in &mut gates {
        g.saturated = if latency {
            g.cost > least_cost + 1e-9 * least_cost.abs()
        } else {
            g.queued
        };
    }
    let saturated = |i: usize| gates[i].saturated;
    let available = |i: usize| !gates[i].saturated && gates[i].share_ok;
    // A session stays on its pod while the pod is not saturated (over its share or not).
    if let Some(i) = session.filter(|&i| i < n && !saturated(i)) {
        return (i, AffinityReason::Session);
    }
    let (i, why) = place(
        config, matched, loads, hashes, &available, &saturated, churn, limit, rng,
    );
    // The latency model's pick waits in a queue only when every pod would.
    if latency && loads[i].wait > 0.0 && loads.iter().all(|l| l.wait > 0.0) {
        return (i, AffinityReason::Saturated);
    }
    (i, why)
}

/// One candidate's gates in [`pick`], each computed once.
#[derive(Debug, Clone, Copy, Default)]
struct Gates {
    queued: bool,
    over: bool,
    share_ok: bool,
    cost: f64,
    saturated: bool,
}

/// The pick once each pod's availability is known: the longest match on an available pod, new
/// work by share (and churn), a spill, or the least-loaded pod when nothing is available.
#[expect(
    clippy::too_many_arguments,
    reason = "the placement's inputs, each used once; a struct would only rename them"
)]
fn place<R: Rng>(
    config: &AffinityConfig,
    matched: &[usize],
    loads: &[PodLoad],
    hashes: &[BlockHash],
    available: &dyn Fn(usize) -> bool,
    saturated: &dyn Fn(usize) -> bool,
    churn: &dyn Fn(usize) -> f64,
    limit: f64,
    rng: &mut R,
) -> (usize, AffinityReason) {
    let n = matched.len();
    let best_all = matched.iter().copied().max().unwrap_or(0);
    let best_available = (0..n).filter(|&i| available(i)).map(|i| matched[i]).max();
    // The tie key: the deepest block the tied pods hold (the first block without a match).
    let tie_key = |m: usize| hashes.get(m.saturating_sub(1)).map(|h| h.0);
    let load = |i: usize| loads[i].inflight as f64 + loads[i].waiting;
    match best_available {
        // No available pod holds any block: new work for this pod set, by share.
        Some(0) if config.balance_new => {
            let pool = (0..n).filter(|&i| available(i));
            let i = if config.place_by_churn {
                let quiet = quietest(config, pool, loads, limit, churn);
                balance(
                    config,
                    quiet.iter().map(|&(i, _)| i),
                    loads,
                    tie_key(0),
                    rng,
                )
            } else {
                balance(config, pool, loads, tie_key(0), rng)
            };
            (
                i,
                if best_all == 0 {
                    AffinityReason::Miss
                } else {
                    AffinityReason::Spill
                },
            )
        }
        Some(best) if best == best_all => {
            let i = tie_break(
                config,
                (0..n).filter(|&i| available(i) && matched[i] == best),
                loads,
                tie_key(best),
                rng,
            );
            (
                i,
                if best > 0 {
                    AffinityReason::Hit
                } else {
                    AffinityReason::Miss
                },
            )
        }
        Some(best) if best > 0 => {
            let i = tie_break(
                config,
                (0..n).filter(|&i| available(i) && matched[i] == best),
                loads,
                tie_key(best),
                rng,
            );
            (i, AffinityReason::Spill)
        }
        Some(_) => {
            let least = (0..n)
                .filter(|&i| available(i))
                .map(load)
                .fold(f64::INFINITY, f64::min);
            let i = tie_break(
                config,
                (0..n).filter(|&i| available(i) && load(i) == least),
                loads,
                tie_key(0),
                rng,
            );
            (i, AffinityReason::Spill)
        }
        None => {
            // Nothing available: the best match among pods with room, else the least loaded.
            let roomy = (0..n).filter(|&i| !saturated(i)).map(|i| matched[i]).max();
            let i = match roomy {
                Some(best) => tie_break(
                    config,
                    (0..n).filter(|&i| !saturated(i) && matched[i] == best),
                    loads,
                    tie_key(best),
                    rng,
                ),
                None => {
                    let least = (0..n).map(load).fold(f64::INFINITY, f64::min);
                    tie_break(
                        config,
                        (0..n).filter(|&i| load(i) == least),
                        loads,
                        tie_key(0),
                        rng,
                    )
                }
            };
            (i, AffinityReason::Saturated)
        }
    }
}

/// The pods of `pool` (non-empty) that new work evicts least from, with their churn: those
/// within the share `limit` (all of them when none is), then those whose churn is within
/// `churnSlack` of the least. One allocation; `churn` is read once per pod.
fn quietest(
    config: &AffinityConfig,
    pool: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    limit: f64,
    churn: &dyn Fn(usize) -> f64,
) -> Vec<(usize, f64)> {
    let mut within = pool.clone().filter(|&i| loads[i].share <= limit).peekable();
    let mut quiet: Vec<(usize, f64)> = if within.peek().is_some() {
        within.map(|i| (i, churn(i))).collect()
    } else {
        pool.map(|i| (i, churn(i))).collect()
    };
    let least = quiet.iter().map(|&(_, c)| c).fold(f64::INFINITY, f64::min);
    quiet.retain(|&(_, c)| c <= least + config.churn_slack);
    quiet
}

/// One of `pods` (non-empty) for new work: the least recent share among the pods within
/// `tieLoadSlack` of the least loaded; pods within one pick's weight of that share go by the
/// tie rule ([`tie_break`]: rendezvous on `key`, or random without `consolidateTies`).
fn balance<R: Rng>(
    config: &AffinityConfig,
    pods: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let near = near_least_loaded(config, pods, loads);
    let least_share = near
        .clone()
        .map(|i| loads[i].share)
        .fold(f64::INFINITY, f64::min);
    let step = 1.0 / (f64::from(config.share_window.max(1)) * loads.len().max(1) as f64);
    tie_break(
        config,
        near.filter(move |&i| loads[i].share <= least_share + step),
        loads,
        Some(key.unwrap_or(0)),
        rng,
    )
}

/// The pods of `pods` within `tieLoadSlack` requests (in flight plus engine queue) of the
/// least loaded of them.
fn near_least_loaded<'a>(
    config: &AffinityConfig,
    pods: impl Iterator<Item = usize> + Clone + 'a,
    loads: &'a [PodLoad],
) -> impl Iterator<Item = usize> + Clone + 'a {
    let load = |i: usize| loads[i].inflight as f64 + loads[i].waiting;
    let least = pods.clone().map(load).fold(f64::INFINITY, f64::min);
    let limit = least + f64::from(config.tie_load_slack);
    pods.filter(move |&i| load(i) <= limit)
}

/// One of `tied` (non-empty), among those within `tieLoadSlack` of the least loaded: the
/// highest rendezvous weight for `key`, or a random one.
fn tie_break<R: Rng>(
    config: &AffinityConfig,
    tied: impl Iterator<Item = usize> + Clone,
    loads: &[PodLoad],
    key: Option<u64>,
    rng: &mut R,
) -> usize {
    let tied = near_least_loaded(config, tied, loads);
    match key {
        Some(key) if config.consolidate_ties => tied
            .max_by_key(|&i| mix(key ^ loads[i].key))
            .expect("a tie has a member"),
        _ => {
            let count = tied.clone().count();
            tied.clone()
                .nth(rng.random_range(0..count))
                .expect("a tie has a member")
        }
    }
}

#[cfg(test)]
mod tests;
