//! An `EndpointPickerConfig` scheduling profile (llm-d's endpoint picker, formerly GIE's): its
//! filters, weighted scorers and picker, with llm-d's formulas, run over this project's pods,
//! engine metrics and prefix index. Parsed by the sidecar's config (`config::endpoint_picker`).
//!
//! One request: the filters in profile order (one that leaves no pod ends the decision, named
//! by its type); each scorer's score in [0, 1] per pod, clamped to [0, 1] and times its weight,
//! summed (`pkg/epp/scheduling/scheduler_profile.go`, `runScorerPlugins`, `enforceScoreRange`);
//! the picker orders the pods; the first is the pick and the next ones (up to
//! `picker.maxEndpoints`) its fallbacks. Formulas (llm-d/llm-d-router ebab6879, read, not
//! copied; paths under `pkg/epp/framework/plugins/scheduling/`):
//!
//! - `prefix-cache-scorer` (`scorer/prefix/plugin.go`): `w * min(1, m * b / S)^2 + (1 - w) *
//!   m / t`, `m` the pod's matched blocks, `t` the prompt's blocks, `b` tokens per block,
//!   `w` = `matchLengthWeight` (0..=1, default 0), `S` = `matchLengthScaleTokens` (default
//!   8192). The match is this project's prefix index (the approximate producer's role: each
//!   pod's longest chain of the prompt's 64-byte blocks, recorded when a response completes);
//!   `b` is the block's bytes / 4, the estimate token producer's 4-byte pseudo-tokens.
//! - `queue-scorer` (`scorer/queuedepth/queue.go`): `(max - q) / (max - min)` over the pods'
//!   waiting requests, 1 for all when they are equal.
//! - `running-requests-size-scorer` (`scorer/runningrequests/runningrequest.go`): the same over
//!   running requests.
//! - `kv-cache-utilization-scorer` (`scorer/kvcacheutilization/kvcache_utilization.go`): `1 -
//!   KV-cache usage`.
//! - `load-aware-scorer` (`scorer/loadaware/load_aware.go`): 0.5 with no waiting request, else
//!   `0.5 * (1 - min(q, threshold) / threshold)` (`threshold` default 128).
//! - `lora-affinity-scorer` (`scorer/loraaffinity/lora_affinity.go`): 1 when the request's
//!   model is a running adapter of the pod; else 0.8 when running + waiting adapters are fewer
//!   than `max_lora`; else 0.6 when it is waiting; else 0 (vLLM's `vllm:lora_requests_info`,
//!   read by the engine scrape; a pod that exports none scores 0, as in llm-d).
//! - `label-selector-filter` (`filter/bylabel/selector.go`): a Kubernetes label selector over the
//!   pod's labels (`matchLabels`; `matchExpressions` In, NotIn, Exists, DoesNotExist).
//! - `no-hit-lru-scorer` (`scorer/nohitlru/no_hit_lru.go`): a request no pod holds any of (no
//!   prefix match anywhere) is cold; a warm one scores 0.5 everywhere; a cold one ranks the pods
//!   that never took a cold request first (in candidate order), then those that did, least
//!   recently first, and scores rank `r` of `n` pods `max(0, 1 - r / (n - 1))` (1 for a lone
//!   pod). The pod a cold request is routed to becomes the most recent (the LRU keeps
//!   `lruSize` pods, across reloads; an explained request changes nothing).
//! - `decode-filter` / `prefill-filter` (`filter/bylabel/roles.go`, `filter.go`): the pod label
//!   `llm-d.ai/role`; decode keeps `decode`, `prefill-decode`, `both`, `encode-prefill-decode`
//!   and pods without the label; prefill keeps `prefill`, `encode-prefill`, `prefill-decode`,
//!   `both`, `encode-prefill-decode`.
//! - `token-load-scorer`, `prefix-cache-affinity-filter`, `session-affinity-scorer`: their
//!   own files ([`token_load`], [`prefix_affinity`], [`session_affinity`]).
//! - `max-score-picker` (`picker/maxscore/picker.go`): shuffle, then a stable sort by total,
//!   highest first (equal totals in random order); `random-picker` (`picker/random/picker.go`):
//!   a shuffle; `weighted-random-picker` (`picker/weightedrandom/picker.go`): A-Res keys
//!   `U^(1 / total)` (0 for a total <= 0), highest first, and a shuffle when no total is > 0.
//!
//! The RNG is the decision's seeded one (`picker.seed`), not llm-d's clock-seeded one.

use rand::Rng;
use rand::seq::SliceRandom;

pub mod disagg;
pub mod prefix_affinity;
pub mod session_affinity;
pub mod token_load;

pub use disagg::{PdDecider, PrefillStage};
pub use prefix_affinity::{AffinityOutcome, PrefixAffinity};
pub use session_affinity::{SessionBindings, SessionStrategy};

/// llm-d's role label (`filter/bylabel/roles.go`).
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// A filter of the profile.
#[derive(Debug, Clone, PartialEq)]
pub enum EppFilter {
    Decode,
    Prefill,
    /// `label-selector-filter`: a Kubernetes label selector.
    Labels(LabelSelector),
    /// `prefix-cache-affinity-filter`: by the prefix match and in-flight tokens, not labels.
    PrefixAffinity(PrefixAffinity),
}

/// A Kubernetes `LabelSelector` (`matchLabels`, `matchExpressions`), validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    pub match_labels: Vec<(String, String)>,
    pub match_expressions: Vec<LabelRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl LabelSelector {
    /// Kubernetes' semantics: every `matchLabels` pair equal and every expression true (an
    /// empty selector matches every pod); `NotIn` holds for a pod without the label.
    pub fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| label(k) == Some(v.as_str()))
            && self.match_expressions.iter().all(|r| match r {
                LabelRequirement::In(k, vs) => label(k).is_some_and(|v| vs.iter().any(|x| x == v)),
                LabelRequirement::NotIn(k, vs) => {
                    label(k).is_none_or(|v| !vs.iter().any(|x| x == v))
                }
                LabelRequirement::Exists(k) => label(k).is_some(),
                LabelRequirement::DoesNotExist(k) => label(k).is_none(),
            })
    }
}

impl EppFilter {
    pub fn as_str(&self) -> &'static str {
        match self {
            EppFilter::Decode => "decode-filter",
            EppFilter::Prefill => "prefill-filter",
            EppFilter::Labels(_) => "label-selector-filter",
            EppFilter::PrefixAffinity(_) => "prefix-cache-affinity-filter",
        }
    }

    /// Whether a pod with these labels passes (prefix-cache-affinity-filter decides over all
    /// the pods at once: every pod passes here).
    pub fn keeps_pod<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        match self {
            EppFilter::Labels(s) => s.matches(label),
            EppFilter::PrefixAffinity(_) => true,
            _ => self.keeps(label(ROLE_LABEL)),
        }
    }

    /// Whether a pod whose `llm-d.ai/role` label is `role` passes a role filter (a label
    /// selector keeps it only when it selects nothing).
    pub fn keeps(&self, role: Option<&str>) -> bool {
        match (self, role) {
            (EppFilter::Labels(s), _) => s.matches(|_| None),
            (EppFilter::PrefixAffinity(_), _) => true,
            (EppFilter::Decode, None) => true,
            (EppFilter::Decode, Some(r)) => {
                matches!(
                    r,
                    "decode" | "prefill-decode" | "both" | "encode-prefill-decode"
                )
            }
            (EppFilter::Prefill, None) => false,
            (EppFilter::Prefill, Some(r)) => matches!(
                r,
                "prefill" | "encode-prefill" | "prefill-decode" | "both" | "encode-prefill-decode"
            ),
        }
    }
}

/// A scorer type with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum EppScorerKind {
    PrefixCache {
        match_length_weight: f64,
        match_length_scale_tokens: u32,
    },
    Queue,
    RunningRequestsSize,
    KvCacheUtilization,
    LoadAware {
        threshold: f64,
    },
    LoraAffinity,
    /// `no-hit-lru-scorer` with its LRU's size (`lruSize`, default 1024).
    NoHitLru {
        lru_size: usize,
    },
    /// `token-load-scorer` with `queueThresholdTokens`.
    TokenLoad {
        queue_threshold_tokens: f64,
    },
    /// `session-affinity-scorer` with its strategy.
    SessionAffinity(SessionStrategy),
}

impl EppScorerKind {
    /// llm-d's plugin type.
    pub fn as_str(&self) -> &'static str {
        match self {
            EppScorerKind::PrefixCache { .. } => "prefix-cache-scorer",
            EppScorerKind::Queue => "queue-scorer",
            EppScorerKind::RunningRequestsSize => "running-requests-size-scorer",
            EppScorerKind::KvCacheUtilization => "kv-cache-utilization-scorer",
            EppScorerKind::LoadAware { .. } => "load-aware-scorer",
            EppScorerKind::LoraAffinity => "lora-affinity-scorer",
            EppScorerKind::NoHitLru { .. } => "no-hit-lru-scorer",
            EppScorerKind::TokenLoad { .. } => "token-load-scorer",
            EppScorerKind::SessionAffinity(_) => "session-affinity-scorer",
        }
    }
}

/// A scorer of the profile: its instance name, type and weight.
#[derive(Debug, Clone, PartialEq)]
pub struct EppScorer {
    pub name: String,
    pub kind: EppScorerKind,
    pub weight: f64,
}

/// The profile's picker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EppPicker {
    MaxScore,
    Random,
    WeightedRandom,
}

impl EppPicker {
    pub fn as_str(self) -> &'static str {
        match self {
            EppPicker::MaxScore => "max-score-picker",
            EppPicker::Random => "random-picker",
            EppPicker::WeightedRandom => "weighted-random-picker",
        }
    }

    /// Candidate positions in pick order, from their weighted totals.
    pub fn order<R: Rng>(self, totals: &[f64], rng: &mut R) -> Vec<usize> {
        let mut order: Vec<usize> = (0..totals.len()).collect();
        match self {
            EppPicker::Random => order.shuffle(rng),
            EppPicker::MaxScore => {
                order.shuffle(rng);
                order.sort_by(|&a, &b| totals[b].total_cmp(&totals[a]));
            }
            EppPicker::WeightedRandom if totals.iter().all(|&t| t <= 0.0) => order.shuffle(rng),
            EppPicker::WeightedRandom => {
                let keys: Vec<f64> = totals
                    .iter()
                    .map(|&t| {
                        if t <= 0.0 {
                            return 0.0;
                        }
                        let u: f64 = rng.random();
                        u.max(1e-10).powf(1.0 / t)
                    })
                    .collect();
                order.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]));
            }
        }
        order
    }
}

/// One scheduling profile: what an `EndpointPickerConfig` asks of the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct EppProfile {
    /// The profile's name (`schedulingProfiles[].name`).
    pub name: String,
    pub filters: Vec<EppFilter>,
    pub scorers: Vec<EppScorer>,
    pub picker: EppPicker,
    /// `disagg-profile-handler` with a prefill decider: this profile is the decode one, and
    /// this is the prefill stage ([`disagg`]).
    pub prefill: Option<Box<PrefillStage>>,
    /// The prefix match is engine truth where a pod's engine view is live (a
    /// `precise-prefix-cache-producer` that the prefix consumers name), the estimate elsewhere.
    pub precise: bool,
}

impl EppProfile {
    /// llm-d's profile when no config is given (`pkg/epp/config/loader/defaults.go`): queue 2,
    /// KV-cache utilization 2, prefix cache 3, max-score picker.
    pub fn llm_d_default() -> EppProfile {
        let scorer = |name: &str, kind, weight| EppScorer {
            name: name.to_string(),
            kind,
            weight,
        };
        EppProfile {
            name: "default".into(),
            filters: Vec::new(),
            scorers: vec![
                scorer("queue-scorer", EppScorerKind::Queue, 2.0),
                scorer(
                    "kv-cache-utilization-scorer",
                    EppScorerKind::KvCacheUtilization,
                    2.0,
                ),
                scorer("prefix-cache-scorer", PREFIX_DEFAULT, 3.0),
            ],
            picker: EppPicker::MaxScore,
            prefill: None,
            precise: false,
        }
    }

    /// Whether a prefix-cache scorer or prefix-cache-affinity-filter runs (prompts are then
    /// hashed, matched and recorded).
    pub fn scores_prefix(&self) -> bool {
        self.scorers
            .iter()
            .any(|s| matches!(s.kind, EppScorerKind::PrefixCache { .. }))
            || self
                .filters
                .iter()
                .any(|f| matches!(f, EppFilter::PrefixAffinity(_)))
    }

    /// The pod label keys its filters read (its prefill stage's too): discovery keeps them.
    pub fn label_keys(&self) -> Vec<String> {
        let mut out = Vec::new();
        let stages = std::iter::once(self).chain(self.prefill.as_ref().map(|s| &s.profile));
        for f in stages.flat_map(|p| &p.filters) {
            match f {
                EppFilter::Decode | EppFilter::Prefill => out.push(ROLE_LABEL.to_string()),
                EppFilter::Labels(s) => {
                    out.extend(s.match_labels.iter().map(|(k, _)| k.clone()));
                    out.extend(s.match_expressions.iter().map(|r| match r {
                        LabelRequirement::In(k, _)
                        | LabelRequirement::NotIn(k, _)
                        | LabelRequirement::Exists(k)
                        | LabelRequirement::DoesNotExist(k) => k.clone(),
                    }));
                }
                EppFilter::PrefixAffinity(_) => {}
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The request headers its session-affinity scorers read (lowercase).
    pub fn request_headers(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.scorers {
            if let EppScorerKind::SessionAffinity(strategy) = &s.kind {
                out.extend(strategy.headers());
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The response headers its `encoded_endpoint_header` session scorers set: each header
    /// with the token naming `pod` (`namespace/name`).
    pub fn response_headers(&self, pod: &str) -> Vec<(String, String)> {
        self.scorers
            .iter()
            .filter_map(|s| match &s.kind {
                EppScorerKind::SessionAffinity(SessionStrategy::EncodedEndpointHeader {
                    header,
                }) => Some((header.clone(), session_affinity::encode_pod(pod))),
                _ => None,
            })
            .collect()
    }

    /// One line for `validate` and the start-up log.
    pub fn summary(&self) -> String {
        let filters: Vec<&str> = self.filters.iter().map(EppFilter::as_str).collect();
        let scorers: Vec<String> = self
            .scorers
            .iter()
            .map(|s| format!("{} ({}) x {}", s.name, s.kind.as_str(), s.weight))
            .collect();
        let mut out = format!(
            "endpoint-picker-config (profile {:?}: filters [{}], scorers [{}], {})",
            self.name,
            filters.join(", "),
            scorers.join(", "),
            self.picker.as_str()
        );
        if self.precise {
            out.push_str(", prefix match: engine views where live (precise-prefix-cache-producer)");
        }
        if let Some(stage) = &self.prefill {
            out.push_str(&format!(
                ", prefill by {}: {}",
                stage.decider.as_str(),
                stage.profile.summary()
            ));
        }
        out
    }
}

/// prefix-cache-scorer's defaults (`matchLengthWeight` 0, `matchLengthScaleTokens` 8192).
pub const PREFIX_DEFAULT: EppScorerKind = EppScorerKind::PrefixCache {
    match_length_weight: 0.0,
    match_length_scale_tokens: 8192,
};

/// prefix-cache-scorer: per pod, from its matched blocks, the prompt's `total` blocks and the
/// tokens in a block (0 for every pod when `total` is 0).
pub fn prefix_scores(
    matched: &[usize],
    total: usize,
    block_tokens: f64,
    match_length_weight: f64,
    scale_tokens: u32,
) -> Vec<f64> {
    matched
        .iter()
        .map(|&m| {
            if total == 0 {
                return 0.0;
            }
            let ratio = m as f64 / total as f64;
            let length = if match_length_weight > 0.0 && block_tokens > 0.0 {
                let n = (m as f64 * block_tokens / f64::from(scale_tokens)).min(1.0);
                n * n
            } else {
                0.0
            };
            match_length_weight * length + (1.0 - match_length_weight) * ratio
        })
        .collect()
}

/// queue-scorer and running-requests-size-scorer: `(max - v) / (max - min)`, 1 when all equal.
pub fn min_max_scores(values: &[f64]) -> Vec<f64> {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|&v| {
            if max == min {
                1.0
            } else {
                (max - v) / (max - min)
            }
        })
        .collect()
}

/// kv-cache-utilization-scorer: `1 - usage`.
pub fn kv_utilization_scores(usage: &[f64]) -> Vec<f64> {
    usage.iter().map(|&u| 1.0 - u).collect()
}

/// load-aware-scorer: 0.5 for an empty queue, else `0.5 * (1 - min(q, threshold) / threshold)`.
pub fn load_aware_scores(waiting: &[f64], threshold: f64) -> Vec<f64> {
    waiting
        .iter()
        .map(|&q| {
            if q == 0.0 {
                0.5
            } else {
                0.5 * (1.0 - q.min(threshold) / threshold)
            }
        })
        .collect()
}

/// A decision's totals are integers of this many parts per unit of llm-d's float total.
pub const TOTAL_SCALE: f64 = 1e6;

/// A decision's total (`Decision::totals`) as llm-d's float.
pub fn epp_total(total: u64) -> f64 {
    total as f64 / TOTAL_SCALE
}

/// lora-affinity-scorer: a pod's score for the request's adapter.
pub fn lora_affinity_score(s: super::LoraState) -> f64 {
    if s.active {
        1.0
    } else if s.loaded < s.max {
        0.8
    } else if s.waiting {
        0.6
    } else {
        0.0
    }
}

/// The pods that took cold requests, least recent first (no-hit-lru-scorer's LRU).
#[derive(Debug, Default)]
pub struct NoHitLru(parking_lot::Mutex<std::collections::VecDeque<String>>);

impl NoHitLru {
    /// no-hit-lru-scorer's scores of `pods` (labels) for a request; `cold`: no pod holds any of
    /// its prompt.
    pub fn scores(&self, pods: &[&str], cold: bool) -> Vec<f64> {
        let n = pods.len();
        if !cold {
            return vec![0.5; n];
        }
        if n == 1 {
            return vec![1.0];
        }
        let lru = self.0.lock();
        let never = pods.iter().filter(|p| !lru.iter().any(|l| l == *p)).count();
        let mut next_never = 0;
        pods.iter()
            .map(|p| {
                let rank = match lru.iter().position(|l| l == p) {
                    Some(at) => never + at,
                    None => {
                        next_never += 1;
                        next_never - 1
                    }
                };
                (1.0 - rank as f64 / (n - 1) as f64).max(0.0)
            })
            .collect()
    }

    /// A cold request went to `pod`: it becomes the most recent; the least recent leave past
    /// `size`.
    pub fn touch(&self, pod: &str, size: usize) {
        let mut lru = self.0.lock();
        lru.retain(|l| l != pod);
        lru.push_back(pod.to_string());
        while lru.len() > size.max(1) {
            lru.pop_front();
        }
    }
}

/// llm-d's `enforceScoreRange`: a score outside [0, 1] is clamped into it.
pub fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        return 0.0;
    }
    score.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests;
