//! The affinity mode (`picker.affinity`): the pick that keeps engines' caches warm while
//! keeping pods balanced. Off (no section), the scheduler is Kthena's. This file holds the
//! mode's settings and what it keeps per pod; the pick runs as steps of the scheduler's pipeline
//! (`pipeline.rs`: match, load, gate, place, tie, fallbacks, each in its own file).
//!
//! Per request, each candidate has a longest match (blocks held in the index or tentatively,
//! [`crate::prefix_index::TentativeEntries`]) and a load. With the latency model
//! (`latencyModel`, [`super::latency`]) each candidate costs its predicted wait plus the prefill
//! of what it does not hold, that prefill counted once more per slot of queue it would delay
//! (`wait + prefill x (1 + backlog)`); a candidate is *saturated* when it costs more than the
//! least among those within their share (without the model: when its engine queue exceeds
//! `maxQueue` or its in-flight count reaches `podCapacity`), and *over-share* when its share of
//! recent picks exceeds the mean (at least `1/n`) by more than `shareHeadroom`, (`spillHotOnly`)
//! the request's prefix makes up at least half of its requests in flight and the pod is busy:
//! its requests in flight fill `shareBusy` of its engine's slots or (`sharePressure`) its recent
//! picks wrote that many times the mean of uncached prompt tokens; the others are *available*.
//! Then:
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
//! the session's last request unless that pod is saturated (`session`). A pod whose engine
//! reuses nothing (prefix caching off, as its metrics say) matches nothing, and new work goes
//! to it only when no pod that reuses is available.
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
//! prompt elsewhere), `churnSlack` 0, `shareBusy` 1 (0: every over-share pod is busy),
//! `sharePressure` 1.5 (0: off).

use std::net::SocketAddr;

use crate::decaying_sum::DecayingSum;

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
    /// The share gate acts on a pod only while its requests in flight fill at least this
    /// fraction of its engine's concurrency (learned from the engine's queue; a pod that has
    /// not queued borrows the least the pool learned; none learned: not busy). 0: always.
    pub share_busy: f64,
    /// Above 0, a pod also counts as busy for the share gate while its recent picks wrote
    /// (prefilled) more than this many times the candidates' mean of uncached prompt tokens:
    /// its cache turns over faster than the pool's. 0: off.
    pub share_pressure: f64,
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
        share_busy: 1.0,
        share_pressure: 1.5,
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
/// `keep` of the share before it and adds `1 - keep` to its pod's); and likewise the prompt
/// tokens its picks did not hold (what they made its engine prefill and write to its cache).
#[derive(Debug, Default)]
pub struct RecentPicks {
    picks: DecayingSum,
    written: DecayingSum,
}

impl RecentPicks {
    /// The share at pick number `now`, each pick keeping `keep` of the share before it.
    pub fn share(&self, now: u32, keep: f64) -> f64 {
        self.picks.value(now, keep)
    }

    /// [`RecentPicks::share`], and the moving average of uncached prompt tokens per pick, given
    /// `keep.ln()` (one logarithm for all the candidates): one `exp` for both (each pick adds to
    /// both at once).
    pub fn share_written_ln(&self, now: u32, ln_keep: f64) -> (f64, f64) {
        DecayingSum::pair_ln(&self.picks, &self.written, now, ln_keep)
    }

    /// Counts pick number `now` for this pod, which did not hold `uncached` of its prompt's
    /// tokens.
    pub fn add(&self, now: u32, keep: f64, uncached: f64) {
        self.picks.add(now, keep, 1.0 - keep);
        self.written.add(now, keep, (1.0 - keep) * uncached);
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
    /// A slot was free for a request picked now ([`super::latency::PodTiming::has_slot`]).
    pub has_slot: bool,
    /// The fraction of its engine's slots its requests in flight fill
    /// ([`super::latency::PodTiming::fill`]).
    pub fill: f64,
    /// The prompt tokens its recent picks did not hold ([`RecentPicks::share_written_ln`]).
    pub written: f64,
    /// Seconds a request picked now waits for a slot ([`super::latency::PodTiming::wait`]).
    pub wait: f64,
    /// The queue it would join, in slots (positions over concurrency; 0 with a free slot).
    pub backlog: f64,
    /// Its engine reuses its KV cache ([`crate::scheduler::Candidate::reuses_cache`]).
    pub reuses: bool,
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

#[cfg(test)]
mod tests;
