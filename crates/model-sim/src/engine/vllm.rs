//! vLLM admission's side of the engine (`--kv-admission vllm`): a request's place in the
//! [`Scheduler`] (its [`Ticket`]), its task's view of it ([`Scheduled`]), the loop that takes its
//! KV blocks as its tokens are computed and waits out its preemptions, and the series.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{GaugeVec, IntCounter, IntCounterVec, Opts, Registry};

use super::{Engine, Hold, PromptTooLarge, Running};
use crate::kv_cache::{Admission, KvCache};
use crate::scheduler::{Pass, ReqId, Scheduler, Shared, TooLarge, WaitCause};

/// The series of vLLM admission (`--kv-admission vllm`): vLLM's preemption counter and
/// waiting-by-reason gauge, and the simulator's own split of waits into their causes.
#[derive(Debug, Clone)]
pub(super) struct AdmissionMetrics {
    pub(super) preemptions: IntCounter,
    /// vLLM's `reason` label: `capacity` (every wait here) or `deferred` (none: no LoRA, no
    /// KV transfer to wait for).
    pub(super) waiting_by_reason: GaugeVec,
    /// Waiting requests by what keeps the queue's head waiting ([`WaitCause`]).
    pub(super) waiting_by_cause: GaugeVec,
    /// Requests that waited at the queue's head, once per cause.
    pub(super) waits: IntCounterVec,
}

impl AdmissionMetrics {
    pub(super) fn register(registry: &Registry) -> AdmissionMetrics {
        let preemptions = IntCounter::new(
            "vllm:num_preemptions_total",
            "Cumulative number of preemption from the engine.",
        )
        .expect("metric");
        let waiting_by_reason = GaugeVec::new(
            Opts::new(
                "vllm:num_requests_waiting_by_reason",
                "Number of waiting requests by reason: 'capacity' = waiting for scheduling \
                 capacity; 'deferred' = deferred by transient constraints.",
            ),
            &["reason"],
        )
        .expect("metric");
        let waiting_by_cause = GaugeVec::new(
            Opts::new(
                "model_sim_requests_waiting",
                "Waiting requests by what keeps the queue's head from starting: max_num_seqs \
                 (every running slot taken) or kv_cache (its blocks do not fit)",
            ),
            &["cause"],
        )
        .expect("metric");
        let waits = IntCounterVec::new(
            Opts::new(
                "model_sim_admission_waits_total",
                "Requests that waited at the head of the queue, by cause (once per cause)",
            ),
            &["cause"],
        )
        .expect("metric");
        for reason in ["capacity", "deferred"] {
            waiting_by_reason.with_label_values(&[reason]).set(0.0);
        }
        for cause in WaitCause::ALL {
            waiting_by_cause
                .with_label_values(&[cause.as_str()])
                .set(0.0);
            waits.with_label_values(&[cause.as_str()]).reset();
        }
        registry
            .register(Box::new(preemptions.clone()))
            .expect("unique");
        registry
            .register(Box::new(waiting_by_reason.clone()))
            .expect("unique");
        registry
            .register(Box::new(waiting_by_cause.clone()))
            .expect("unique");
        registry.register(Box::new(waits.clone())).expect("unique");
        AdmissionMetrics {
            preemptions,
            waiting_by_reason,
            waiting_by_cause,
            waits,
        }
    }
}

/// vLLM admission's state: the scheduler (locked before the cache) and its series.
#[derive(Debug)]
pub(super) struct VllmAdmission {
    pub(super) scheduler: Mutex<Scheduler>,
    pub(super) metrics: AdmissionMetrics,
}

/// A request in the vLLM scheduler, as its task follows it.
#[derive(Debug)]
pub(super) struct Scheduled {
    pub(super) ticket: Ticket,
    pub(super) shared: Arc<Shared>,
    /// Preemptions already seen (a larger count in `shared`: preempted since).
    pub(super) seen: u32,
    /// Output tokens produced.
    pub(super) emitted: usize,
    /// Decode steps of the answer and its tokens as the cache counts them (set with the
    /// answer): the KV grows from the prompt's tokens to the prompt's and the answer's over the
    /// steps.
    pub(super) steps: usize,
    pub(super) answer_tokens: usize,
    /// Tokens the KV was last grown to.
    pub(super) covered: usize,
}

impl Scheduled {
    /// Tokens the KV must hold to produce the next token after `emitted`.
    fn kv_tokens(&self, prompt: usize, emitted: usize) -> usize {
        if self.steps == 0 {
            return prompt;
        }
        prompt + emitted.min(self.steps) * self.answer_tokens / self.steps
    }
}

/// A request's place in the vLLM scheduler: leaves it when dropped (answered, or the client
/// left while it waited or ran).
#[derive(Debug)]
pub(super) struct Ticket {
    pub(super) engine: Arc<Engine>,
    pub(super) id: ReqId,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.engine.finish(self.id);
    }
}

impl Running {
    /// Produces `tokens` output tokens under vLLM admission.
    pub(super) async fn run_vllm(&mut self, mut tokens: usize) {
        let prompt = self.admission.prompt_tokens;
        let block = self.engine.config.block_tokens.max(1);
        while tokens > 0 {
            let Hold::Vllm(v) = &self.hold else {
                return;
            };
            if v.shared.preemptions() != v.seen {
                self.resume().await;
                tokens -= 1;
                continue;
            }
            if v.emitted == 0 {
                let ttft = self.ttft();
                let Hold::Vllm(v) = &mut self.hold else {
                    return;
                };
                if sleep_unless_preempted(&v.shared, v.seen, ttft)
                    .await
                    .is_ok()
                {
                    v.emitted = 1;
                    tokens -= 1;
                }
                continue;
            }
            let need = v.kv_tokens(prompt, v.emitted);
            if need.div_ceil(block) > v.covered.div_ceil(block) {
                let id = v.ticket.id;
                let grown = self.engine.grow(id, need);
                let Hold::Vllm(v) = &mut self.hold else {
                    return;
                };
                v.covered = need;
                if !grown {
                    continue;
                }
            }
            let Hold::Vllm(v) = &self.hold else {
                return;
            };
            // The tokens up to the next block: one sleep.
            let mut run = 1;
            while run < tokens
                && v.kv_tokens(prompt, v.emitted + run).div_ceil(block) <= v.covered.div_ceil(block)
            {
                run += 1;
            }
            let itl = self.inter_token();
            let Hold::Vllm(v) = &mut self.hold else {
                return;
            };
            let done = match sleep_unless_preempted(&v.shared, v.seen, itl * run as u32).await {
                Ok(()) => run,
                Err(elapsed) => {
                    (elapsed.as_secs_f64() / itl.as_secs_f64().max(1e-12)).floor() as usize
                }
            }
            .min(run);
            v.emitted += done;
            tokens -= done;
        }
    }

    /// A preempted request: waits to run again, then recomputes its prompt and the answer so
    /// far (less what the prefix cache still holds), which produces its next token.
    async fn resume(&mut self) {
        let prompt = self.admission.prompt_tokens;
        loop {
            let Hold::Vllm(v) = &mut self.hold else {
                return;
            };
            loop {
                v.seen = v.shared.preemptions();
                if v.shared.running() {
                    break;
                }
                v.shared.wake.notified().await;
            }
            let uncached = v
                .kv_tokens(prompt, v.emitted)
                .saturating_sub(v.shared.cached_tokens());
            let c = &self.engine.config;
            let recompute = self
                .engine
                .scaled(c.overhead + c.prefill_per_token * uncached as u32);
            let Hold::Vllm(v) = &mut self.hold else {
                return;
            };
            if sleep_unless_preempted(&v.shared, v.seen, recompute)
                .await
                .is_ok()
            {
                v.emitted += 1;
                return;
            }
        }
    }
}

/// Sleeps `d` unless the request is preempted meanwhile (its preemption count passes
/// `seen`); then the time slept. Delays too short to sleep ([`pause`]) only check.
async fn sleep_unless_preempted(shared: &Shared, seen: u32, d: Duration) -> Result<(), Duration> {
    if d < Duration::from_micros(50) {
        return if shared.preemptions() == seen {
            Ok(())
        } else {
            Err(Duration::ZERO)
        };
    }
    let start = tokio::time::Instant::now();
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return Ok(()),
            _ = shared.wake.notified() => {
                if shared.preemptions() != seen {
                    return Err(start.elapsed());
                }
            }
        }
    }
}

impl Engine {
    /// Queues the prompt in vLLM's scheduler and waits until it starts.
    pub(super) async fn schedule(
        self: &Arc<Self>,
        model: &str,
        prompt: &[u8],
    ) -> Result<(Admission, Hold), PromptTooLarge> {
        let a = self.vllm.as_ref().expect("vLLM admission");
        let blocks = self.kv.lock().prompt_blocks(model, prompt);
        let prompt_tokens = blocks.tokens;
        let (id, shared) = {
            let mut scheduler = a.scheduler.lock();
            let mut kv = self.kv.lock();
            let (id, shared, pass) = scheduler.submit(&mut kv, blocks).map_err(|e| {
                let TooLarge { capacity, .. } = e;
                PromptTooLarge {
                    prompt_tokens,
                    capacity_tokens: capacity * kv.block_tokens(),
                }
            })?;
            self.after(&scheduler, &mut kv, &pass);
            (id, shared)
        };
        // From here on, dropping the ticket (the client left) takes the request out.
        let ticket = Ticket {
            engine: self.clone(),
            id,
        };
        let seen = loop {
            let seen = shared.preemptions();
            if shared.running() {
                break seen;
            }
            shared.wake.notified().await;
        };
        let admission = Admission {
            prompt_tokens,
            cached_tokens: shared.cached_tokens(),
            pinned: Vec::new(),
            tail: 0,
        };
        let scheduled = Scheduled {
            ticket,
            shared,
            seen,
            emitted: 0,
            steps: 0,
            answer_tokens: 0,
            covered: prompt_tokens,
        };
        Ok((admission, Hold::Vllm(scheduled)))
    }

    /// A running request's KV must hold `tokens` tokens (vLLM admission); `false` when it was
    /// preempted instead.
    fn grow(&self, id: ReqId, tokens: usize) -> bool {
        let Some(a) = &self.vllm else {
            return true;
        };
        let mut scheduler = a.scheduler.lock();
        let mut kv = self.kv.lock();
        let (grown, pass) = scheduler.grow(&mut kv, id, tokens);
        self.after(&scheduler, &mut kv, &pass);
        grown
    }

    /// A request left vLLM's scheduler (answered or abandoned).
    fn finish(&self, id: ReqId) {
        let Some(a) = &self.vllm else {
            return;
        };
        let mut scheduler = a.scheduler.lock();
        let mut kv = self.kv.lock();
        let pass = scheduler.finish(&mut kv, id);
        self.after(&scheduler, &mut kv, &pass);
    }

    /// The series after a scheduling pass, and the cache's events; under both locks.
    fn after(&self, scheduler: &Scheduler, kv: &mut KvCache, pass: &Pass) {
        let Some(a) = &self.vllm else {
            return;
        };
        let m = &a.metrics;
        self.metrics.running.set(scheduler.running() as f64);
        let waiting = scheduler.waiting() as f64;
        self.metrics.waiting.set(waiting);
        m.waiting_by_reason
            .with_label_values(&["capacity"])
            .set(waiting);
        let blocked = scheduler.blocked();
        for cause in WaitCause::ALL {
            let n = if blocked == Some(cause) { waiting } else { 0.0 };
            m.waiting_by_cause
                .with_label_values(&[cause.as_str()])
                .set(n);
            let waits = pass.waits[cause as usize];
            if waits > 0 {
                m.waits.with_label_values(&[cause.as_str()]).inc_by(waits);
            }
        }
        m.preemptions.inc_by(pass.preempted);
        self.metrics.kv_usage.set(kv.usage());
        self.publish(kv);
    }
}
