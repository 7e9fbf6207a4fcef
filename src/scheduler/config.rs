//! The scheduler's configuration, validated: which filters and score plugins run, with what
//! weights and arguments, the affinity mode and load shedding. Parsed from Kthena's YAML by the sidecar's config;
//! every value here is already in range.

use super::affinity::AffinityConfig;
use super::kvcache_aware::KvCacheAwareArgs;
use super::pd::PdGroup;
use super::prefix_cache::PrefixCacheArgs;
use super::saturation::SaturationLimits;
use crate::hashing::ChainScheme;
use crate::prompt::Rendering;

/// How prompts are cut into hashed blocks ([`SchedulerConfig::block_layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    pub block_size: usize,
    pub scheme: ChainScheme,
    /// What of a request is rendered into the hashed prompt.
    pub rendering: Rendering,
}

impl std::fmt::Display for BlockLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} blocks of {} bytes, {} rendering",
            self.scheme.as_str(),
            self.block_size,
            self.rendering.as_str()
        )
    }
}

/// Plugins prefix-picker implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScorerKind {
    PrefixCache,
    LeastRequest,
    GpuUsage,
    LeastLatency,
    Random,
    KvCacheAware,
}

impl ScorerKind {
    pub fn from_name(name: &str) -> Option<ScorerKind> {
        Some(match name {
            "prefix-cache" => ScorerKind::PrefixCache,
            "least-request" => ScorerKind::LeastRequest,
            "gpu-usage" => ScorerKind::GpuUsage,
            "least-latency" => ScorerKind::LeastLatency,
            "random" => ScorerKind::Random,
            "kvcache-aware" => ScorerKind::KvCacheAware,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ScorerKind::PrefixCache => "prefix-cache",
            ScorerKind::LeastRequest => "least-request",
            ScorerKind::GpuUsage => "gpu-usage",
            ScorerKind::LeastLatency => "least-latency",
            ScorerKind::Random => "random",
            ScorerKind::KvCacheAware => "kvcache-aware",
        }
    }
}

/// Filter plugins prefix-picker implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FilterKind {
    LeastRequest,
    /// Kthena's lora-affinity: pods whose engine lists the request's model.
    LoraAffinity,
}

impl FilterKind {
    pub fn from_name(name: &str) -> Option<FilterKind> {
        Some(match name {
            "least-request" => FilterKind::LeastRequest,
            "lora-affinity" => FilterKind::LoraAffinity,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FilterKind::LeastRequest => "least-request",
            FilterKind::LoraAffinity => "lora-affinity",
        }
    }

    /// Whether the filter reads load (the affinity mode's latency model routes around load
    /// itself and runs none of these); lora-affinity is a constraint and always runs.
    pub fn reads_load(self) -> bool {
        match self {
            FilterKind::LeastRequest => true,
            FilterKind::LoraAffinity => false,
        }
    }
}

/// The scheduler's plugins and their settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub filters: Vec<FilterKind>,
    pub scorers: Vec<(ScorerKind, u32)>,
    pub prefix_cache: PrefixCacheArgs,
    /// kvcache-aware's arguments (used when it is enabled).
    pub kvcache_aware: KvCacheAwareArgs,
    /// least-request filter: keep a pod iff engine `waiting < max_waiting_requests`.
    pub max_waiting_requests: u64,
    /// least-latency: weight of TTFT against TPOT, in [0, 1].
    pub ttft_tpot_weight_factor: f64,
    /// The affinity mode (`picker.affinity`); `None` is Kthena's scheduler.
    pub affinity: Option<AffinityConfig>,
    /// Prefill/decode disaggregation (top-level `pdGroup:`); `None`: every pod serves whole
    /// requests.
    pub pd: Option<PdGroup>,
    /// Load shedding (`picker.loadShedding`); `None`: never shed.
    pub load_shedding: Option<SaturationLimits>,
    /// An `EndpointPickerConfig`'s scheduling profile (llm-d's plugins); `Some`: it replaces
    /// Kthena's filters and scores.
    pub epp: Option<super::epp::EppProfile>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            filters: vec![FilterKind::LeastRequest],
            scorers: vec![
                (ScorerKind::LeastRequest, 1),
                (ScorerKind::GpuUsage, 1),
                (ScorerKind::LeastLatency, 1),
                (ScorerKind::PrefixCache, 1),
            ],
            prefix_cache: PrefixCacheArgs::default(),
            kvcache_aware: KvCacheAwareArgs::default(),
            max_waiting_requests: 10,
            ttft_tpot_weight_factor: 0.5,
            affinity: None,
            pd: None,
            load_shedding: None,
            epp: None,
        }
    }
}

impl SchedulerConfig {
    /// Turns the affinity mode on (or leaves Kthena's scheduler): with `longPrompts` the block
    /// chain becomes `blockBytes` x `maxPromptBytes / blockBytes`; with `engineTokens` the
    /// default per-pod budget is sized from it.
    pub fn apply_affinity(&mut self, mode: Option<AffinityConfig>) {
        self.affinity = mode;
        let Some(a) = mode else { return };
        if a.long_prompts {
            self.prefix_cache.block_size_to_hash = a.block_bytes;
            self.prefix_cache.max_blocks_to_match = a.max_prompt_bytes / a.block_bytes;
        }
        if a.engine_budget && a.engine_tokens > 0 {
            self.prefix_cache.max_hash_cache_size = a
                .budget_entries(a.engine_tokens, self.prefix_cache.block_size_to_hash)
                .min(u32::MAX as usize - 1);
        }
    }

    /// Whether engines' served models are needed (lora-affinity filters by them).
    pub fn needs_served_models(&self) -> bool {
        self.filters.contains(&FilterKind::LoraAffinity)
    }

    /// Whether `kvcache-aware` scores (Kthena's mode with it in `Score.enabled`): requests then
    /// look their blocks up before they are routed.
    pub fn kvcache_aware(&self) -> Option<&KvCacheAwareArgs> {
        let on = self.affinity.is_none()
            && self
                .scorers
                .iter()
                .any(|(k, _)| *k == ScorerKind::KvCacheAware);
        on.then_some(&self.kvcache_aware)
    }

    /// How prompts are rendered: the affinity mode's sees tools, tool calls and non-text parts
    /// too ([`crate::prompt::Rendering::Engine`]); Kthena's mode keeps Kthena's rendering.
    pub fn rendering(&self) -> Rendering {
        match self.affinity {
            Some(_) => Rendering::Engine,
            None => Rendering::Kthena,
        }
    }

    /// How prompts are chained: seeded XXH3 for the affinity mode's long prompts, else Kthena's.
    pub fn chain_scheme(&self) -> ChainScheme {
        match self.affinity {
            Some(a) if a.long_prompts => ChainScheme::Seeded,
            _ => ChainScheme::Kthena,
        }
    }

    /// What the block hashes depend on besides the request: the block size, the chain scheme
    /// and the rendering. Hashes made under one layout never match a prompt hashed under another
    /// (a text-only chat renders alike in both renderings; a request with tools does not).
    pub fn block_layout(&self) -> BlockLayout {
        BlockLayout {
            block_size: self.prefix_cache.block_size_to_hash,
            scheme: self.chain_scheme(),
            rendering: self.rendering(),
        }
    }

    /// One line naming the effective routing mode (for `validate` and the start-up log): the
    /// mode and its switches, the block chain, then what else is on.
    pub fn mode_summary(&self) -> String {
        let mode = match (&self.affinity, &self.epp) {
            (_, Some(p)) => p.summary(),
            (None, None) => "kthena (weighted plugin scores)".to_string(),
            (Some(a), None) => affinity_summary(a),
        };
        let mut line = format!("routing mode: {mode}; {}", self.chain_summary());
        if let Some(k) = self.kvcache_aware() {
            line.push_str(&format!(
                "; kvcache-aware on (blocks of {} tokens, up to {} blocks, tokenizer port vllm {} / sglang {}; Redis from REDIS_HOST/REDIS_PORT/REDIS_PASSWORD)",
                k.block_size_to_hash,
                k.max_blocks_to_match,
                k.vllm_tokenizer_port,
                k.sglang_tokenizer_port
            ));
        }
        if let Some(l) = &self.load_shedding {
            line.push_str(&format!(
                "; load shedding on (queueDepth {}, kvCacheUtilization {}, maxInFlightPerPod {}, metrics stale after {} s)",
                l.queue_depth,
                l.kv_cache_utilization,
                l.max_inflight
                    .map_or_else(|| "unset".to_string(), |m| m.to_string()),
                l.staleness.as_secs_f64()
            ));
        }
        line
    }

    /// The block chain and, with a `pdGroup`, how pods pair.
    fn chain_summary(&self) -> String {
        let p = &self.prefix_cache;
        let chain = format!(
            "{} chain of {} blocks of {} bytes ({} KiB), {} entries per pod",
            self.chain_scheme().as_str(),
            p.max_blocks_to_match,
            p.block_size_to_hash,
            p.max_blocks_to_match * p.block_size_to_hash / 1024,
            p.max_hash_cache_size
        );
        match &self.pd {
            None => chain,
            Some(g) => format!(
                "{chain}; prefill/decode pairs by label {} (prefill {:?}, decode {:?})",
                g.group_key(),
                g.prefill_labels(),
                g.decode_labels()
            ),
        }
    }
}

/// The affinity mode and every switch and number of it.
fn affinity_summary(a: &AffinityConfig) -> String {
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "affinity (tentative {} [tentativeMinRatio {}], consolidateTies {}, balanceNew {} [placeByChurn {}, churnSlack {}], loadGate {} [latencyModel {}, spillHotOnly {}, shareBusy {}, sharePressure {}, podCapacity {}, maxQueue {}, shareHeadroom {}, shareWindow {}, tieLoadSlack {}, spillLoss {}], longPrompts {}, engineBudget {} [bytesPerToken {}, engineTokens {}])",
        on(a.tentative),
        a.tentative_min_ratio,
        on(a.consolidate_ties),
        on(a.balance_new),
        on(a.place_by_churn),
        a.churn_slack,
        on(a.load_gate),
        on(a.latency_model),
        on(a.spill_hot_only),
        a.share_busy,
        a.share_pressure,
        a.pod_capacity,
        a.max_queue,
        a.share_headroom,
        a.share_window,
        a.tie_load_slack,
        a.spill_loss,
        on(a.long_prompts),
        on(a.engine_budget),
        a.bytes_per_token,
        a.engine_tokens
    )
}
