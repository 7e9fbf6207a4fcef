//! The simulated engine: admission (at most `max_num_seqs` running, the rest queue FIFO), the
//! prefix KV cache, the latency model and the engine's Prometheus metrics. With
//! `kv_admission: Vllm` admission also counts the blocks of running requests and a request
//! whose answer needs a block none has free preempts the last started ([`crate::scheduler`]):
//! [`Running::prefill`] and [`Running::decode`] then grow the request's KV block by block and
//! wait out its preemptions; `vllm:num_preemptions_total`,
//! `vllm:num_requests_waiting_by_reason{reason}`, `model_sim_requests_waiting{cause}` and
//! `model_sim_admission_waits_total{cause}` are exported in that mode only.
//!
//! Latency model (defaults: a 7-8B model on one H100): `TTFT = overhead + uncached_tokens *
//! prefill_per_token`, then `(output_tokens - 1) * inter_token_latency`; both slowed by
//! `1 + running / max_num_seqs` (linear in the batch). `time_scale` divides every delay; delays
//! under 50 µs are not slept at all, so a large time scale makes the simulator instant.
//!
//! A prompt received from a prefill peer ([`crate::pd`], [`Engine::admit_received`]) is admitted
//! to the cache like any other; its tokens the cache lacked cost `kv_transfer_per_token` each
//! (divided by `time_scale`, not slowed by the batch) instead of `prefill_per_token`, and are
//! counted in the external counters, not in `prefix_cache_{queries,hits}`.
//!
//! With `kv_events` on ([`Engine::start`]) every change the cache makes is published, one batch
//! per admission or reset, in the cache's order ([`crate::kv_events`]).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, Opts, Registry};
use tokio::sync::Semaphore;

use crate::kv_cache::{Admission, KvCache};
use crate::kv_events::{KvEventPublisher, KvEventsConfig};
use crate::pd::{PdConfig, PdMetrics};
use crate::scheduler::{KvAdmission, Scheduler};
use crate::template::ChatTemplate;
use crate::tokenizer::SimTokenizer;

mod vllm;

use vllm::{AdmissionMetrics, Scheduled, VllmAdmission};

/// Which engine's metric names to expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

/// Engine parameters (the `model-sim` flags).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub kind: EngineKind,
    pub block_tokens: usize,
    pub kv_blocks: usize,
    pub max_num_seqs: usize,
    pub overhead: Duration,
    pub prefill_per_token: Duration,
    pub inter_token_latency: Duration,
    pub time_scale: f64,
    /// PD role and KV transfer ([`crate::pd`]); the default is no role.
    pub pd: PdConfig,
    /// vLLM's `--kv-events-config`; publishing needs [`Engine::start`].
    pub kv_events: KvEventsConfig,
    /// `false`: vLLM's `--no-enable-prefix-caching`.
    pub prefix_caching: bool,
    /// The built-in tokenizer (or its dense variant), or `--tokenizer-json`'s.
    pub tokenizer: SimTokenizer,
    /// `--chat-template`: how chat and Responses requests render ([`crate::template`]).
    pub chat_template: ChatTemplate,
    /// `--kv-admission`: only slots limit running requests, or vLLM's KV-capacity admission
    /// and preemption ([`crate::scheduler`]).
    pub kv_admission: KvAdmission,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kind: EngineKind::Vllm,
            block_tokens: 16,
            kv_blocks: 32_768,
            max_num_seqs: 256,
            overhead: Duration::from_millis(30),
            prefill_per_token: Duration::from_micros(200),
            inter_token_latency: Duration::from_millis(12),
            time_scale: 1.0,
            pd: PdConfig::default(),
            kv_events: KvEventsConfig::default(),
            prefix_caching: true,
            tokenizer: SimTokenizer::Builtin,
            chat_template: ChatTemplate::ChatMl,
            kv_admission: KvAdmission::Slots,
        }
    }
}

#[derive(Debug, Clone)]
struct EngineMetrics {
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge,
    queries: IntCounter,
    hits: IntCounter,
    /// `/tokenize` requests served, and the tokens they returned (what a router's tokenizer
    /// calls cost the engine; tests check that a router did not ask).
    tokenize_requests: IntCounter,
    tokenize_tokens: IntCounter,
    ttft: Histogram,
    itl: Histogram,
}

impl EngineMetrics {
    fn register(registry: &Registry, c: &EngineConfig) -> EngineMetrics {
        let vllm = c.kind == EngineKind::Vllm;
        let name = |v: &str, s: &str| if vllm { v.to_string() } else { s.to_string() };
        let gauge = |n: String, help: &str| {
            let g = Gauge::new(n, help).expect("metric");
            registry.register(Box::new(g.clone())).expect("unique");
            g
        };
        let counter = |n: &str, help: &str| {
            let g = IntCounter::new(n, help).expect("metric");
            registry.register(Box::new(g.clone())).expect("unique");
            g
        };
        let histogram = |n: String, help: &str, buckets: Vec<f64>| {
            let h =
                Histogram::with_opts(HistogramOpts::new(n, help).buckets(buckets)).expect("metric");
            registry.register(Box::new(h.clone())).expect("unique");
            h
        };
        let ttft_buckets = vec![
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0,
        ];
        let itl_buckets = vec![
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
        ];
        // vLLM's `cache_config_info` (a subset of its labels); SGLang's token capacity.
        let info = GaugeVec::new(
            Opts::new(
                name("vllm:cache_config_info", "sglang:cache_config_info"),
                "KV cache configuration",
            ),
            &[
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "gpu_memory_utilization",
                "num_cpu_blocks",
                "num_gpu_blocks",
            ],
        )
        .expect("metric");
        registry.register(Box::new(info.clone())).expect("unique");
        info.with_label_values(&[
            c.block_tokens.to_string().as_str(),
            "auto",
            if c.prefix_caching { "True" } else { "False" },
            "0.9",
            "0",
            c.kv_blocks.to_string().as_str(),
        ])
        .set(1.0);
        // The process collector's start time, as vLLM and SGLang export it (Python's
        // prometheus_client): the engine's, so an engine restarted in-process shows a new one.
        // Routers tell an engine's lives apart by it.
        gauge(
            "process_start_time_seconds".into(),
            "Start time of the process since unix epoch in seconds",
        )
        .set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        if !vllm {
            gauge(
                "sglang:max_total_num_tokens".into(),
                "Maximum total tokens in the KV cache",
            )
            .set(c.kv_blocks.saturating_mul(c.block_tokens) as f64);
        }
        EngineMetrics {
            running: gauge(
                name("vllm:num_requests_running", "sglang:num_running_reqs"),
                "Requests running",
            ),
            waiting: gauge(
                name("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
                "Requests waiting",
            ),
            kv_usage: gauge(
                name("vllm:kv_cache_usage_perc", "sglang:token_usage"),
                "KV cache usage (1 = full)",
            ),
            queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache",
            ),
            hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache",
            ),
            tokenize_requests: counter(
                "model_sim_tokenize_requests_total",
                "/tokenize requests served",
            ),
            tokenize_tokens: counter(
                "model_sim_tokenize_tokens_total",
                "Tokens returned by /tokenize",
            ),
            ttft: histogram(
                name(
                    "vllm:time_to_first_token_seconds",
                    "sglang:time_to_first_token_seconds",
                ),
                "Time to first token",
                ttft_buckets,
            ),
            itl: histogram(
                name(
                    "vllm:inter_token_latency_seconds",
                    "sglang:inter_token_latency_seconds",
                ),
                "Inter-token latency",
                itl_buckets,
            ),
        }
    }
}

/// One simulated engine (one pod).
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    kv: Mutex<KvCache>,
    slots: Arc<Semaphore>,
    /// `--kv-admission vllm` only.
    vllm: Option<VllmAdmission>,
    metrics: EngineMetrics,
    pd: Option<PdMetrics>,
    events: Option<KvEventPublisher>,
    pub registry: Registry,
}

/// A request admitted to run; dropping it frees its slot and unpins its blocks.
#[derive(Debug)]
pub struct Running {
    engine: Arc<Engine>,
    /// Under vLLM admission the scheduler holds the blocks (`pinned` is empty here).
    admission: Admission,
    /// Prompt tokens received from a prefill peer (the ones the local cache lacked).
    received_tokens: usize,
    hold: Hold,
}

/// What a running request holds.
#[derive(Debug)]
enum Hold {
    /// A running slot (`--kv-admission slots`); its blocks are `Running::admission`'s.
    Slot {
        _permit: tokio::sync::OwnedSemaphorePermit,
    },
    /// A place in vLLM's scheduler.
    Vllm(Scheduled),
}

/// A prompt that could never start: its blocks exceed the KV cache (vLLM admission).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTooLarge {
    pub prompt_tokens: usize,
    pub capacity_tokens: usize,
}

impl std::fmt::Display for PromptTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the prompt's {} tokens exceed the KV cache's capacity of {} tokens",
            self.prompt_tokens, self.capacity_tokens
        )
    }
}

impl std::error::Error for PromptTooLarge {}

impl Running {
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Prompt tokens not prefilled here: found in the local cache or received from a prefill
    /// peer (vLLM's `num_cached_tokens`, the response's `cached_tokens`).
    pub fn cached_tokens(&self) -> usize {
        self.admission.cached_tokens + self.received_tokens
    }

    pub fn received_tokens(&self) -> usize {
        self.received_tokens
    }

    /// Time to the first token, given the current batch: the local prefill (slowed by the
    /// batch) plus the KV transfer of received tokens (not slowed by it).
    pub fn ttft(&self) -> Duration {
        let c = &self.engine.config;
        let uncached = self
            .admission
            .prompt_tokens
            .saturating_sub(self.cached_tokens());
        let compute = self
            .engine
            .scaled(c.overhead + c.prefill_per_token * uncached as u32);
        let transfer = (c.pd.kv_transfer_per_token * self.received_tokens as u32)
            .div_f64(c.time_scale.max(1e-9));
        compute + transfer
    }

    /// Time between output tokens, given the current batch.
    pub fn inter_token(&self) -> Duration {
        self.engine.scaled(self.engine.config.inter_token_latency)
    }

    /// Waits out the prefill (the time to the first token). Under vLLM admission a preemption
    /// meanwhile sends the request back to the queue; it prefills again once resumed.
    pub async fn prefill(&mut self) {
        match &self.hold {
            Hold::Slot { .. } => pause(self.ttft()).await,
            Hold::Vllm(_) => self.run_vllm(1).await,
        }
    }

    /// Waits out `tokens` more output tokens. Under vLLM admission the request's KV grows as
    /// they are computed, which may preempt it or others ([`crate::scheduler`]); a preempted
    /// request waits to resume, recomputes, and goes on.
    pub async fn decode(&mut self, tokens: usize) {
        match &self.hold {
            Hold::Slot { .. } => pause(self.inter_token() * tokens as u32).await,
            Hold::Vllm(_) => self.run_vllm(tokens).await,
        }
    }

    /// Caches the blocks `output` fills after `prompt` ([`KvCache::admit_output`]), held until
    /// the request ends. Under vLLM admission they are taken as the answer's `steps` decode
    /// steps compute them ([`Running::decode`]).
    pub fn hold_output(&mut self, model: &str, prompt: &str, output: &str, steps: usize) {
        if let Hold::Vllm(v) = &mut self.hold {
            let blocks =
                self.engine
                    .kv
                    .lock()
                    .answer_blocks(model, prompt.as_bytes(), output.as_bytes());
            v.steps = steps;
            v.answer_tokens = blocks.tokens.saturating_sub(self.admission.prompt_tokens);
            if let Some(a) = &self.engine.vllm {
                a.scheduler.lock().set_blocks(v.ticket.id, blocks);
            }
            return;
        }
        let mut kv = self.engine.kv.lock();
        kv.admit_output(
            model,
            prompt.as_bytes(),
            output.as_bytes(),
            &mut self.admission,
        );
        self.engine.metrics.kv_usage.set(kv.usage());
        self.engine.publish(&mut kv);
    }

    pub fn observe_ttft(&self, d: Duration) {
        self.engine.metrics.ttft.observe(d.as_secs_f64());
    }

    pub fn observe_itl(&self, d: Duration) {
        self.engine.metrics.itl.observe(d.as_secs_f64());
    }
}

/// A request in the queue: counted in `waiting` until dropped.
struct Queued<'a>(&'a Gauge);

impl<'a> Queued<'a> {
    fn new(waiting: &'a Gauge) -> Queued<'a> {
        waiting.inc();
        Queued(waiting)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.hold, Hold::Vllm(_)) {
            // The ticket leaves the scheduler.
            return;
        }
        let mut kv = self.engine.kv.lock();
        kv.release(&self.admission.pinned);
        self.engine.metrics.kv_usage.set(kv.usage());
        self.engine.publish(&mut kv);
        self.engine.metrics.running.dec();
    }
}

impl Engine {
    /// An engine that publishes no KV events (panics if `config.kv_events` asks for them: use
    /// [`Engine::start`]).
    pub fn new(config: EngineConfig) -> Engine {
        assert!(
            !config.kv_events.publishes(),
            "an engine publishing KV events is built by Engine::start"
        );
        Engine::with_publisher(config, None)
    }

    /// An engine, with its KV event publisher bound when `config.kv_events` enables one.
    pub async fn start(config: EngineConfig) -> anyhow::Result<Engine> {
        let publisher = if config.kv_events.publishes() {
            Some(KvEventPublisher::start(&config.kv_events, config.block_tokens).await?)
        } else {
            None
        };
        Ok(Engine::with_publisher(config, publisher))
    }

    fn with_publisher(config: EngineConfig, events: Option<KvEventPublisher>) -> Engine {
        let registry = Registry::new();
        let metrics = EngineMetrics::register(&registry, &config);
        let pd = PdMetrics::register(&registry, &config.pd);
        let vllm = (config.kv_admission == KvAdmission::Vllm).then(|| VllmAdmission {
            scheduler: Mutex::new(Scheduler::new(config.max_num_seqs)),
            metrics: AdmissionMetrics::register(&registry),
        });
        let mut kv = KvCache::new(config.block_tokens, config.kv_blocks)
            .with_tokenizer(config.tokenizer.clone());
        if events.is_some() {
            kv = kv.record_events();
        }
        if !config.prefix_caching {
            kv = kv.without_prefix_caching();
        }
        Engine {
            pd,
            events,
            kv: Mutex::new(kv),
            slots: Arc::new(Semaphore::new(config.max_num_seqs.max(1))),
            vllm,
            metrics,
            registry,
            config,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &SimTokenizer {
        &self.config.tokenizer
    }

    /// Counts a `/tokenize` request.
    pub fn count_tokenize(&self) {
        self.metrics.tokenize_requests.inc();
    }

    /// Counts the tokens a `/tokenize` request returned.
    pub fn count_tokenized(&self, tokens: usize) {
        self.metrics.tokenize_tokens.inc_by(tokens as u64);
    }

    /// `/tokenize` requests served so far.
    pub fn tokenize_requests(&self) -> u64 {
        self.metrics.tokenize_requests.get()
    }

    /// The running KV event publisher, if any (its bound endpoints).
    pub fn kv_events(&self) -> Option<&KvEventPublisher> {
        self.events.as_ref()
    }

    /// vLLM's `reset_prefix_cache`: drops every cached block, unless a request is running
    /// (then `false`, nothing changes).
    pub fn reset_prefix_cache(&self) -> bool {
        let mut kv = self.kv.lock();
        let done = kv.reset();
        self.publish(&mut kv);
        done
    }

    /// Publishes what the cache logged; called under its lock, so batches keep its order.
    fn publish(&self, kv: &mut KvCache) {
        if let Some(p) = &self.events {
            p.publish(kv.take_events());
        }
    }

    /// A decode sim's PD metrics (`None` for any other sim).
    pub fn pd_metrics(&self) -> Option<&PdMetrics> {
        self.pd.as_ref()
    }

    /// Waits for a slot (queueing beyond `max_num_seqs`), then admits the prompt. Panics when
    /// vLLM admission could never start it ([`Engine::request`] answers instead).
    pub async fn admit(self: &Arc<Self>, model: &str, prompt: &[u8]) -> Running {
        self.request(model, prompt, false)
            .await
            .expect("the prompt fits the KV cache")
    }

    /// [`Engine::admit`] for a prompt a prefill peer computed: its blocks enter the cache as
    /// usual; the tokens the cache lacked are received (counted in the external counters, not
    /// as prefix cache queries: they are not prefilled here).
    pub async fn admit_received(self: &Arc<Self>, model: &str, prompt: &[u8]) -> Running {
        self.request(model, prompt, true)
            .await
            .expect("the prompt fits the KV cache")
    }

    /// Queues a prompt (`received`: computed by a prefill peer, [`Engine::admit_received`])
    /// until it may run: a slot is free, and under vLLM admission its blocks fit
    /// ([`crate::scheduler`]), which refuses a prompt larger than the cache.
    pub async fn request(
        self: &Arc<Self>,
        model: &str,
        prompt: &[u8],
        received: bool,
    ) -> Result<Running, PromptTooLarge> {
        let (admission, hold) = match &self.vllm {
            Some(_) => self.schedule(model, prompt).await?,
            None => self.take_slot(model, prompt).await,
        };
        let cached = admission.cached_tokens as u64;
        let received_tokens = match (received, &self.pd) {
            (true, Some(pd)) => {
                let lacked = admission
                    .prompt_tokens
                    .saturating_sub(admission.cached_tokens);
                self.metrics.queries.inc_by(cached);
                pd.external_queries.inc_by(lacked as u64);
                pd.external_hits.inc_by(lacked as u64);
                lacked
            }
            _ => {
                self.metrics.queries.inc_by(admission.prompt_tokens as u64);
                0
            }
        };
        self.metrics.hits.inc_by(cached);
        Ok(Running {
            engine: self.clone(),
            admission,
            received_tokens,
            hold,
        })
    }

    /// Waits for a slot, then admits the prompt to the cache (`--kv-admission slots`).
    async fn take_slot(self: &Arc<Self>, model: &str, prompt: &[u8]) -> (Admission, Hold) {
        // Counted while queued, also when the client hangs up and this future is dropped.
        let queued = Queued::new(&self.metrics.waiting);
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        drop(queued);
        self.metrics.running.inc();
        let mut kv = self.kv.lock();
        let a = kv.admit(model, prompt);
        self.metrics.kv_usage.set(kv.usage());
        self.publish(&mut kv);
        (a, Hold::Slot { _permit: slot })
    }

    /// Preemptions so far (vLLM admission; 0 otherwise).
    pub fn preemptions(&self) -> u64 {
        self.vllm
            .as_ref()
            .map_or(0, |a| a.metrics.preemptions.get())
    }

    pub fn running(&self) -> usize {
        self.metrics.running.get() as usize
    }

    pub fn waiting(&self) -> usize {
        self.metrics.waiting.get() as usize
    }

    /// `base * (1 + running / max_num_seqs) / time_scale`.
    fn scaled(&self, base: Duration) -> Duration {
        let batch = 1.0 + self.running() as f64 / self.config.max_num_seqs.max(1) as f64;
        base.mul_f64(batch / self.config.time_scale.max(1e-9))
    }
}

/// Sleeps `d`, unless it is too short to matter (under 50 µs).
pub async fn pause(d: Duration) {
    if d >= Duration::from_micros(50) {
        tokio::time::sleep(d).await;
    }
}
