//! The affinity mode's latency model: each candidate's expected time to first token, so a
//! prefix keeps its pod while the pod has room and moves the moment a queue would cost more
//! than the prefill it saves.
//!
//! `predicted TTFT = wait + prefill`, per candidate:
//! - `wait = k x pace`: the request needs `k` completions before a slot frees and its blocks
//!   fit, with `k = max(inflight + 1 - concurrency, engine queue left + 1, completions to fit)`;
//!   `inflight` is the picker's own count (instant), the engine queue is the last scrape's
//!   `waiting` drained at the pod's pace over the scrape's age (so a stale scrape fades instead
//!   of steering), the completions to fit those that free the blocks the request would add
//!   beyond the pod's KV room ([`super::kv_room`]: its prompt's blocks less those requests in
//!   flight there pin; 0 on an engine that has not shown a wait for KV space). A pod that has
//!   not shown a queue yet borrows the least concurrency learned among the candidates
//!   ([`Pool`]); none anywhere: no slot wait predicted, and a wait for KV over the requests in
//!   flight.
//! - `prefill = uncached tokens x seconds per token`, the uncached tokens being the prompt's
//!   blocks the pod does not hold (index and holds), converted with `bytesPerToken`.
//!
//! The affinity pick's gate (`pipeline/gate.rs`) weighs a candidate at `wait + prefill x (1 +
//! backlog)`, `backlog` being the queue it would join in slots (`k / concurrency`): a prefill on
//! a queueing pod also delays every request queued behind it by its time over the slots, so
//! under load a match is worth more than one request's prefill.
//!
//! Learned, per pod ([`PodTiming`]):
//! - `concurrency`: the engine's `running` in every scrape that shows a queue for a slot
//!   (`waiting` > 0 while its head would fit in the KV cache, [`KvRoom::observe`]), averaged
//!   (half weight to each new sample); raised at once to `running` when more run without a
//!   queue. A queue for KV space is no slot count: under KV pressure `running` is how many
//!   requests happened to fit. vLLM and SGLang export the gauges.
//! - `interval`: the mean gap between two completions of this picker's while every slot stayed
//!   busy (more in flight than the concurrency at both): the queue's pace under load, a moving
//!   average over about [`SERVICE_WINDOW`] gaps.
//! - `service`: the mean time from the pick to the completion of requests picked while the pod
//!   had a free slot (same average); `service / concurrency` stands in for the pace until a
//!   busy gap was seen.
//!
//! Learned over all pods ([`PrefillRate`]): seconds per uncached token and the base, by a
//! least-squares fit of those completions' durations on their uncached tokens and the requests
//! already running on the pod at the pick (so a fuller batch does not pass for prefill), weighted
//! towards the last [`PREFILL_WINDOW`] completions; until the fit has [`PREFILL_MIN_SAMPLES`]
//! with spread in their uncached tokens, [`PRIOR_SECONDS_PER_TOKEN`] (a 7-8B model on one H100
//! prefills ~10,000 tokens/s).
//!
//! Reads are atomic loads (the request path takes no lock); learning happens on completion and
//! scrape.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::kv_room::{KvRoom, Queue};

/// Completions the per-pod service time averages over.
pub const SERVICE_WINDOW: f64 = 32.0;
/// Completions the prefill fit is weighted towards.
pub const PREFILL_WINDOW: f64 = 512.0;
/// Completions the prefill fit needs before it replaces the prior.
pub const PREFILL_MIN_SAMPLES: f64 = 32.0;
/// Seconds per prefilled token until learned (10,000 tokens/s).
pub const PRIOR_SECONDS_PER_TOKEN: f64 = 1e-4;
/// Seconds one completion frees a slot after, when a pod has shown a queue but no completion
/// has been timed yet on any pod.
pub const UNKNOWN_SERVICE_SECONDS: f64 = 1.0;

/// One signal of the latency model; `latencySignals` lists those it uses (all by default:
/// leaving one out is the model's ablation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencySignal {
    /// The picker's own in-flight count against the concurrency.
    Inflight,
    /// The engine's scraped queue, drained by its age.
    EngineQueue,
    /// The busy pace learned from completions (off: service time over concurrency).
    Pace,
    /// The fitted seconds per token (off: the prior).
    PrefillFit,
}

impl LatencySignal {
    /// Every signal, in the order the config names them.
    pub const ALL: [LatencySignal; 4] = [
        LatencySignal::Inflight,
        LatencySignal::EngineQueue,
        LatencySignal::Pace,
        LatencySignal::PrefillFit,
    ];

    /// The config's name (`latencySignals` entries).
    pub fn as_str(self) -> &'static str {
        match self {
            LatencySignal::Inflight => "inflight",
            LatencySignal::EngineQueue => "engineQueue",
            LatencySignal::Pace => "pace",
            LatencySignal::PrefillFit => "prefillFit",
        }
    }

    /// The signal named `name`, if any.
    pub fn parse(name: &str) -> Option<LatencySignal> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// The signals the model uses (a set of [`LatencySignal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signals(u8);

impl Signals {
    pub const ALL: Signals = Signals(0b1111);

    pub fn of(signals: impl IntoIterator<Item = LatencySignal>) -> Signals {
        Signals(signals.into_iter().fold(0, |bits, s| bits | 1 << s as u8))
    }

    pub fn has(self, signal: LatencySignal) -> bool {
        self.0 & (1 << signal as u8) != 0
    }
}

impl Default for Signals {
    fn default() -> Self {
        Signals::ALL
    }
}

/// The latency model's prediction for one candidate (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prediction {
    /// Waiting for a slot ([`PodTiming::wait`]).
    pub wait: f64,
    /// The queue it would join, in slots ([`PodTiming::queue`]).
    pub backlog: f64,
    /// Prefilling the prompt tokens the pod does not hold.
    pub prefill: f64,
    /// Those tokens.
    pub uncached_tokens: f64,
    /// A slot was free for this request (its completion then times the pod's service).
    pub has_slot: bool,
    /// Requests this picker had on the pod at the pick.
    pub running: f64,
}

impl Prediction {
    /// The time to first token the pick controls: the wait and the prefill (the engine's fixed
    /// per-request overhead left out).
    pub fn ttft(&self) -> f64 {
        self.wait + self.prefill
    }
}

/// An `f64` in an atomic (0 = unknown).
#[derive(Debug, Default)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    /// `Some` when set to a positive value.
    fn known(&self) -> Option<f64> {
        Some(self.get()).filter(|v| *v > 0.0)
    }

    /// Moves the value towards `sample` by `weight` (to `sample` when unknown).
    fn average(&self, sample: f64, weight: f64) {
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let old = f64::from_bits(current);
            let new = if old > 0.0 {
                old + weight * (sample - old)
            } else {
                sample
            };
            match self.0.compare_exchange_weak(
                current,
                new.to_bits(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }
}

/// What the latency model has learned of one pod.
#[derive(Debug, Default)]
pub struct PodTiming {
    concurrency: AtomicF64,
    service: AtomicF64,
    /// Mean seconds between completions while every slot is busy (the queue's pace).
    interval: AtomicF64,
    /// The last completion that left the pod busy (more in flight than it runs).
    busy_since: Mutex<Option<Instant>>,
    /// Its room in the engine's KV cache, in prompt blocks.
    kv: KvRoom,
    /// The concurrency was learned from a queue the KV room told apart as a wait for a slot.
    slots_confirmed: AtomicBool,
}

impl PodTiming {
    /// Learns from one engine scrape: `running` requests while `waiting` queue, the KV cache
    /// `kv_usage` (0..1) full. A queue whose head would not fit in the KV cache waits for KV
    /// space, not for a slot: it teaches no concurrency ([`KvRoom::observe`]); the first such
    /// queue forgets a concurrency learned before the pod's KV capacity was, unless a queue
    /// with KV room to spare confirmed it.
    pub fn observe_engine(&self, running: f64, waiting: f64, kv_usage: f64) {
        let queue = self.kv.observe(kv_usage, running, waiting);
        if !(running.is_finite() && waiting.is_finite()) || running < 1.0 {
            return;
        }
        match queue {
            Queue::Kv { first } => {
                if first && !self.slots_confirmed.load(Ordering::Relaxed) {
                    self.concurrency.set(0.0);
                }
            }
            Queue::Slot => {
                if self.kv.capacity().is_some() {
                    self.slots_confirmed.store(true, Ordering::Relaxed);
                }
                self.concurrency.average(running, 0.5);
            }
            // A queue the KV room could not read (no usage gauge): a slot count, as always.
            Queue::None if waiting >= 1.0 => self.concurrency.average(running, 0.5),
            Queue::None => {
                if self.concurrency.known().is_some_and(|c| running > c) {
                    self.concurrency.set(running);
                }
            }
        }
    }

    /// The pod's room in its engine's KV cache.
    pub fn kv(&self) -> &KvRoom {
        &self.kv
    }

    /// Learns from one completion picked while the pod had a free slot: `seconds` from the
    /// pick to the completion.
    pub fn observe_service(&self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.service.average(seconds, 1.0 / SERVICE_WINDOW);
        }
    }

    /// Learns from one completion of this picker's at `at`, with `inflight` requests on the pod
    /// (this one included): the gap since the previous completion, when both left every slot
    /// busy, is one step of the queue.
    pub fn observe_completion(&self, at: Instant, inflight: i64) {
        let busy = self.concurrency().is_some_and(|c| inflight as f64 > c);
        let mut since = self.busy_since.lock();
        if busy {
            if let Some(previous) = since.replace(at) {
                let gap = at.saturating_duration_since(previous).as_secs_f64();
                if gap > 0.0 {
                    self.interval.average(gap, 1.0 / SERVICE_WINDOW);
                }
            }
        } else {
            *since = None;
        }
    }

    /// Mean seconds between completions while every slot is busy; `None` until seen.
    pub fn interval(&self) -> Option<f64> {
        self.interval.known()
    }

    /// Requests the engine runs at once; `None` until a scrape showed a queue.
    pub fn concurrency(&self) -> Option<f64> {
        self.concurrency.known()
    }

    /// Mean seconds from pick to completion without a queue; `None` until timed.
    pub fn service(&self) -> Option<f64> {
        self.service.known()
    }

    /// Requests the engine runs at once: its own, else the least `pool` learned.
    fn slots(&self, pool: Pool) -> Option<f64> {
        self.concurrency().or(pool.concurrency)
    }

    /// Whether a request picked now, with `inflight` requests of this picker on the pod, finds
    /// a free slot (unknown concurrency here and in `pool`: yes).
    pub fn has_slot(&self, inflight: i64, pool: Pool) -> bool {
        self.slots(pool).is_none_or(|c| (inflight as f64) < c)
    }

    /// The fraction of the engine's slots `inflight` requests of this picker fill (0 when no
    /// concurrency is known here or in `pool`).
    pub fn fill(&self, inflight: i64, pool: Pool) -> f64 {
        self.slots(pool).map_or(0.0, |c| inflight as f64 / c)
    }

    /// The expected seconds a request picked now waits for a slot: `inflight` this picker has
    /// on the pod, the engine's scraped queue `waiting` and that scrape's `age` (`None`: never
    /// scraped); `pool` stands in for what this pod has not learned yet.
    pub fn wait(&self, inflight: i64, waiting: f64, age: Option<Duration>, pool: Pool) -> f64 {
        self.queue(inflight, waiting, age, pool, 0.0).0
    }

    /// The completions a request that adds `blocks` to the pod's KV cache waits for before
    /// they fit ([`KvRoom::completions_to_fit`]; 0 without the `inflight` signal).
    pub fn kv_wait(&self, inflight: i64, blocks: f64, signals: Signals) -> f64 {
        if signals.has(LatencySignal::Inflight) {
            self.kv.completions_to_fit(blocks, inflight)
        } else {
            0.0
        }
    }

    /// [`PodTiming::wait`] of a request that adds `blocks` to the pod's KV cache (its prompt's
    /// blocks less those requests in flight there pin), its wait for KV space counted
    /// ([`PodTiming::kv_wait`]), and the queue it would join in slots (the completions it
    /// waits for over the concurrency; over the requests in flight while no concurrency is
    /// known).
    pub fn queue(
        &self,
        inflight: i64,
        waiting: f64,
        age: Option<Duration>,
        pool: Pool,
        blocks: f64,
    ) -> (f64, f64) {
        let signals = pool.signals;
        let kv = self.kv_wait(inflight, blocks, signals);
        let slots = self.slots(pool);
        let Some(concurrency) = slots.or((kv > 0.0).then(|| (inflight as f64).max(1.0))) else {
            return (0.0, 0.0);
        };
        // Completions per second while the queue lasts: the busy pace seen, else the service
        // time over the slots.
        let rate = match self.interval().filter(|_| signals.has(LatencySignal::Pace)) {
            Some(interval) => 1.0 / interval,
            None => {
                let service = self
                    .service()
                    .or(pool.service)
                    .unwrap_or(UNKNOWN_SERVICE_SECONDS);
                concurrency / service
            }
        };
        let own = match slots {
            Some(slots) if signals.has(LatencySignal::Inflight) => inflight as f64 + 1.0 - slots,
            _ => 0.0,
        };
        let engine = match age {
            Some(age)
                if slots.is_some() && waiting > 0.0 && signals.has(LatencySignal::EngineQueue) =>
            {
                let left = waiting - age.as_secs_f64() * rate;
                if left > 0.0 { left + 1.0 } else { 0.0 }
            }
            _ => 0.0,
        };
        let k = own.max(engine).max(kv).max(0.0);
        (k / rate, k / concurrency)
    }
}

/// What the candidates' pool has learned, for a pod that has not learned it yet (pods of one
/// pool usually run one engine configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pool {
    /// The least concurrency learned among the candidates.
    pub concurrency: Option<f64>,
    /// The mean service time over every pod ([`PrefillRate::service`]).
    pub service: Option<f64>,
    /// The signals the model uses.
    pub signals: Signals,
}

/// The prefill fit's weighted sums (decaying).
#[derive(Debug, Default, Clone, Copy)]
struct Fit {
    n: f64,
    /// Uncached tokens.
    x: f64,
    /// Requests already running on the pod at the pick.
    r: f64,
    y: f64,
    xx: f64,
    rr: f64,
    xr: f64,
    xy: f64,
    ry: f64,
}

/// Seconds per uncached prompt token and the base of every request, fitted over all pods.
#[derive(Debug, Default)]
pub struct PrefillRate {
    fit: Mutex<Fit>,
    per_token: AtomicF64,
    base: AtomicF64,
    fitted: AtomicBool,
    /// The mean service time over all pods (the fallback of pods not timed yet).
    service: AtomicF64,
}

impl PrefillRate {
    /// Learns from one completion picked with a free slot: `uncached` prompt tokens predicted
    /// at the pick, `running` requests already on the pod then, `seconds` from the pick to the
    /// completion.
    pub fn observe(&self, uncached: f64, running: f64, seconds: f64) {
        let valid = [uncached, running, seconds]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0);
        if !valid || seconds == 0.0 {
            return;
        }
        self.service.average(seconds, 1.0 / SERVICE_WINDOW);
        let keep = 1.0 - 1.0 / PREFILL_WINDOW;
        let mut f = self.fit.lock();
        let (x, r, y) = (uncached, running, seconds);
        f.n = f.n * keep + 1.0;
        f.x = f.x * keep + x;
        f.r = f.r * keep + r;
        f.y = f.y * keep + y;
        f.xx = f.xx * keep + x * x;
        f.rr = f.rr * keep + r * r;
        f.xr = f.xr * keep + x * r;
        f.xy = f.xy * keep + x * y;
        f.ry = f.ry * keep + r * y;
        if f.n < PREFILL_MIN_SAMPLES {
            return;
        }
        let n = f.n;
        let (mx, mr, my) = (f.x / n, f.r / n, f.y / n);
        let (sxx, srr, sxr) = (f.xx / n - mx * mx, f.rr / n - mr * mr, f.xr / n - mx * mr);
        let (sxy, sry) = (f.xy / n - mx * my, f.ry / n - mr * my);
        // Less than a 64-token spread in the uncached tokens: nothing to fit a slope on.
        if sxx < 64.0 * 64.0 {
            return;
        }
        // Durations grow with the batch a request runs in, and misses often run in fuller
        // batches: the batch is fitted beside the tokens so it does not pass for prefill.
        let det = sxx * srr - sxr * sxr;
        let slope = if srr > 1e-3 && det > 1e-9 * sxx * srr {
            (sxy * srr - sry * sxr) / det
        } else {
            sxy / sxx
        }
        .max(0.0);
        self.per_token.set(slope);
        self.base.set((my - slope * mx).max(0.0));
        self.fitted.store(true, Ordering::Relaxed);
    }

    /// Whether the fit replaced the prior.
    pub fn is_fitted(&self) -> bool {
        self.fitted.load(Ordering::Relaxed)
    }

    /// Seconds per uncached token: learned, else [`PRIOR_SECONDS_PER_TOKEN`].
    pub fn seconds_per_token(&self) -> f64 {
        if self.fitted.load(Ordering::Relaxed) {
            self.per_token.get()
        } else {
            PRIOR_SECONDS_PER_TOKEN
        }
    }

    /// The fitted seconds from pick to completion of a request that prefills nothing (its
    /// decode included; 0 until fitted).
    pub fn base(&self) -> f64 {
        self.base.get()
    }

    /// The mean service time over all pods; `None` until a completion was timed.
    pub fn service(&self) -> Option<f64> {
        self.service.known()
    }
}

#[cfg(test)]
mod tests;
