//! An `EndpointPickerConfig` profile's steps 2-4 ([`crate::scheduler::epp`]: the formulas):
//! the prefix match (chain matches without a top-k limit, when a prefix-cache scorer or the
//! prefix-cache-affinity-filter needs it), its filters (each timed; one that leaves no pod ends
//! the decision, named by its type; the affinity filter reads the match and the pods' in-flight
//! tokens), its scorers (each timed), the weighted sum, the picker's order; the session's pod,
//! when it passed the filters, leads (`picker.sessions`). The reason is read from the prefix
//! match: a hit when the pick holds some of the prompt, overruled when only another pod does.
//! With a `disagg-profile-handler`'s prefill stage, the decision's pick is the decode pod and,
//! when the decider says so, the prefill profile's pick is its pair (`Decision::pd`). What a
//! commit needs (the pick's uncached prompt tokens, `session_id` sessions) rides in
//! `Decision::epp`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;

use super::candidates::session_position;
use crate::hashing::BlockHash;
use crate::prefix_index::ModelKey;
use rand::Rng;

use crate::scheduler::decision::EppCommit;
use crate::scheduler::engine_match::{self, EngineMatched};
use crate::scheduler::epp::session_affinity::session_scores;
use crate::scheduler::epp::{
    EppFilter, EppProfile, EppScorer, EppScorerKind, SessionStrategy, TOTAL_SCALE, clamp_score,
    kv_utilization_scores, load_aware_scores, lora_affinity_score, min_max_scores, prefix_scores,
    token_load,
};
use crate::scheduler::pd::{PdPairing, PrefillPass};
use crate::scheduler::{
    Candidate, Decision, DecisionReason, Fractional, Observation, PluginScores, PluginType,
    RouteRequest, Scheduler, Unscored,
};

/// A profile's prefix match: the prompt's hashes, each candidate's matched blocks (or why
/// none), and its engine match where a precise producer read one (empty when none did).
struct EppMatch {
    hashes: Vec<BlockHash>,
    matched: Option<Vec<usize>>,
    unscored: Option<Unscored>,
    engine: Vec<Option<EngineMatched>>,
}

impl Scheduler {
    /// The profile's decision, and with a `disagg-profile-handler`'s prefill stage whose
    /// decider says yes, the prefill profile's pick as the decode pick's pair
    /// ([`crate::scheduler::epp::disagg`]); `Err(filter type)` when a decode filter left no pod.
    pub(super) fn epp_disagg_decision<C: Candidate + Clone>(
        &self,
        profile: &EppProfile,
        request: &RouteRequest<'_>,
        candidates: Arc<[C]>,
        rng: &mut SmallRng,
        keep: usize,
        observations: &mut Vec<Observation>,
    ) -> Result<Decision<C>, &'static str> {
        let all = candidates.clone();
        let mut decision =
            self.epp_decision(profile, request, candidates, rng, keep, observations)?;
        let Some(stage) = &profile.prefill else {
            return Ok(decision);
        };
        let input = token_load::input_tokens(request.prompt.map_or(0, str::len));
        // The decode pick's cached tokens: the prompt's tokens it does not have to compute
        // subtracted from the prompt's (known only with a prefix match).
        let cached = decision
            .unscored
            .is_none()
            .then(|| input.saturating_sub(decision.epp.inflight_tokens));
        if !stage.decider.disaggregate(input, cached) {
            tracing::debug!(
                target: "scores",
                "disagg-profile-handler: {} says decode only (prompt {input} tokens, cached on the decode pod {cached:?})",
                stage.decider.as_str()
            );
            return Ok(decision);
        }
        let prefill_request = RouteRequest {
            hashes: Some(&decision.hashes),
            ..*request
        };
        match self.epp_decision(&stage.profile, &prefill_request, all, rng, 1, observations) {
            Err(filter) => {
                tracing::debug!(
                    target: "scores",
                    "disagg-profile-handler: the prefill profile's {filter} left no pod: decode only"
                );
            }
            Ok(mut p) => {
                p.hashes = Vec::new();
                decision.epp.prefill_tokens = p.epp.inflight_tokens;
                decision.pd = Some(PdPairing {
                    prefill: p.primary().clone(),
                    prefill_reason: p.reason,
                    prefill_candidates: p.candidates.len(),
                    prefill_uncached: p.epp.inflight_tokens as f64,
                    passes: vec![PrefillPass::Scored {
                        decode: decision.primary().clone(),
                        decision: Box::new(p),
                    }],
                });
            }
        }
        Ok(decision)
    }

    /// The profile's decision over `candidates`; `Err(filter type)` when a filter left no pod.
    pub(super) fn epp_decision<C: Candidate + Clone>(
        &self,
        profile: &EppProfile,
        request: &RouteRequest<'_>,
        mut candidates: Arc<[C]>,
        rng: &mut SmallRng,
        keep: usize,
        observations: &mut Vec<Observation>,
    ) -> Result<Decision<C>, &'static str> {
        // The match comes first: prefix-cache-affinity-filter reads it, and the scorers read
        // it over the pods the filters kept.
        let EppMatch {
            hashes,
            mut matched,
            unscored,
            mut engine,
        } = self.epp_match(profile, request, &candidates);
        for filter in &profile.filters {
            let t = Instant::now();
            let kept: Vec<bool> = match filter {
                EppFilter::PrefixAffinity(f) => {
                    let tokens: Vec<u64> = candidates.iter().map(|c| c.inflight_tokens()).collect();
                    let u = if f.exploration_probability > 0.0 {
                        rng.random()
                    } else {
                        1.0
                    };
                    let (kept, outcome) = f.keep(matched.as_deref(), hashes.len(), &tokens, u);
                    tracing::debug!(
                        target: "scores",
                        "PrefixCacheAffinityFilter: {}, kept {} of {} (affinityThreshold {})",
                        outcome.as_str(),
                        kept.iter().filter(|&&k| k).count(),
                        kept.len(),
                        f.affinity_threshold
                    );
                    kept
                }
                _ => candidates
                    .iter()
                    .map(|c| filter.keeps_pod(|k| c.pod_label(k)))
                    .collect(),
            };
            if !kept.iter().all(|&k| k) {
                candidates = candidates
                    .iter()
                    .zip(&kept)
                    .filter(|(_, k)| **k)
                    .map(|(c, _)| c.clone())
                    .collect();
                if let Some(m) = &mut matched {
                    *m = m
                        .iter()
                        .zip(&kept)
                        .filter(|(_, k)| **k)
                        .map(|(&b, _)| b)
                        .collect();
                }
                if !engine.is_empty() {
                    engine = engine
                        .iter()
                        .zip(&kept)
                        .filter(|(_, k)| **k)
                        .map(|(&m, _)| m)
                        .collect();
                }
            }
            observations.push(Observation::PluginTime {
                plugin: filter.as_str(),
                kind: PluginType::Filter,
                elapsed: t.elapsed(),
            });
            if candidates.is_empty() {
                return Err(filter.as_str());
            }
        }
        if let Some(m) = &matched
            && !hashes.is_empty()
        {
            let best = m.iter().copied().max().unwrap_or(0);
            observations.push(Observation::MatchRatio(best as f64 / hashes.len() as f64));
        }
        let uncached = self.epp_uncached(request, &candidates, hashes.len(), matched.as_deref());
        let mut totals = vec![0.0f64; candidates.len()];
        let mut plugins = Vec::with_capacity(profile.scorers.len());
        let mut sessions = Vec::new();
        for scorer in &profile.scorers {
            let t = Instant::now();
            let scores: Vec<f64> = self
                .epp_scores(
                    scorer,
                    request,
                    &candidates,
                    (&hashes, matched.as_deref()),
                    &uncached,
                    &mut sessions,
                )
                .into_iter()
                .map(clamp_score)
                .collect();
            observations.push(Observation::PluginTime {
                plugin: scorer.kind.as_str(),
                kind: PluginType::Score,
                elapsed: t.elapsed(),
            });
            for (total, s) in totals.iter_mut().zip(&scores) {
                *total += s * scorer.weight;
            }
            plugins.push(PluginScores {
                plugin: scorer.kind.as_str(),
                weight: scorer.weight.round().clamp(0.0, u32::MAX as f64) as u32,
                scores: Some(scores.iter().map(|s| (s * 100.0) as u32).collect()),
                fractional: Some(Fractional {
                    name: scorer.name.clone(),
                    weight: scorer.weight,
                    scores,
                }),
            });
        }
        let mut order = profile.picker.order(&totals, rng);
        let session = session_position(&candidates, request.session_pod);
        if let Some(at) = session.and_then(|i| order.iter().position(|&o| o == i)) {
            order[..=at].rotate_right(1);
        }
        let reason = match (&matched, session.is_some()) {
            (_, true) => DecisionReason::Session,
            (None, false) => DecisionReason::Unscored,
            (Some(m), false) if m[order[0]] > 0 => DecisionReason::PrefixHit,
            (Some(m), false) if m.iter().any(|&x| x > 0) => DecisionReason::PrefixOverruled,
            (Some(_), false) => DecisionReason::PrefixMiss,
        };
        let ranked = order
            .iter()
            .take(keep.max(1))
            .map(|&i| candidates[i].clone())
            .collect();
        Ok(Decision {
            candidates,
            plugins,
            totals: totals
                .iter()
                .map(|t| (t * TOTAL_SCALE).round().max(0.0) as u64)
                .collect(),
            ranked,
            primary_at: order[0],
            reason,
            hashes,
            prompt_bytes: request.prompt.map_or(0, str::len),
            unscored,
            predicted_blocks: 0,
            predictions: Default::default(),
            engine,
            observations: Vec::new(),
            duration: Duration::ZERO,
            pd: None,
            kv_matched: None,
            epp: EppCommit {
                inflight_tokens: uncached[order[0]],
                prefill_tokens: 0,
                sessions,
            },
        })
    }

    /// Each candidate's uncached prompt tokens (llm-d's inflight-load-producer's count: the
    /// blocks it does not hold and the tail, in 4-byte tokens; the whole prompt unmatched).
    fn epp_uncached<C: Candidate>(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[C],
        total: usize,
        matched: Option<&[usize]>,
    ) -> Vec<u64> {
        let input = token_load::input_tokens(request.prompt.map_or(0, str::len));
        let block_tokens =
            (self.prefix.args().block_size_to_hash / token_load::BYTES_PER_TOKEN) as u64;
        (0..candidates.len())
            .map(|i| token_load::uncached_tokens(matched.map(|m| m[i]), total, block_tokens, input))
            .collect()
    }

    /// The prompt's hashes and each candidate's chain match, when prefix-cache-scorer runs and
    /// there is a prompt; else why not. With a precise producer ([`EppProfile::precise`]), a
    /// candidate whose engine view is live and a request with engine tokens is matched by its
    /// engine, merged with the estimate as the affinity mode merges them
    /// ([`engine_match::combine`]); the engine matches ride along (empty when none).
    fn epp_match<C: Candidate>(
        &self,
        profile: &EppProfile,
        request: &RouteRequest<'_>,
        candidates: &[C],
    ) -> EppMatch {
        let unscored = |reason, hashes| EppMatch {
            hashes,
            matched: None,
            unscored: Some(reason),
            engine: Vec::new(),
        };
        if !profile.scores_prefix() {
            return unscored(Unscored::PrefixCacheDisabled, Vec::new());
        }
        let prompt = match request.prompt {
            Ok(p) => p,
            Err(reason) => return unscored(reason, Vec::new()),
        };
        let hashes = self.hashes_of(request, prompt);
        if hashes.is_empty() {
            return unscored(Unscored::EmptyPrompt, hashes);
        }
        let slots: Vec<_> = candidates.iter().map(|c| c.slot()).collect();
        let mut matched =
            self.prefix
                .index()
                .chain_matches(ModelKey::of(request.model), &hashes, &slots);
        let mut engine = Vec::new();
        if profile.precise {
            engine = engine_match::matches(
                candidates,
                request.engine_tokens,
                prompt.len(),
                hashes.len(),
            );
            if !engine.is_empty() {
                engine_match::combine(&mut engine, &mut matched);
            }
        }
        EppMatch {
            hashes,
            matched: Some(matched),
            unscored: None,
            engine,
        }
    }

    /// One scorer's scores (before the clamp); prefix-cache-scorer scores 0 without a match.
    /// A `session_id` session-affinity-scorer with a session adds it to `sessions` (bound at
    /// commit).
    fn epp_scores<C: Candidate>(
        &self,
        scorer: &EppScorer,
        request: &RouteRequest<'_>,
        candidates: &[C],
        (hashes, matched): (&[BlockHash], Option<&[usize]>),
        uncached: &[u64],
        sessions: &mut Vec<(String, String)>,
    ) -> Vec<f64> {
        let stat = |f: fn(&C) -> f64| candidates.iter().map(f).collect::<Vec<f64>>();
        match &scorer.kind {
            &EppScorerKind::PrefixCache {
                match_length_weight,
                match_length_scale_tokens,
            } => match matched {
                None => vec![0.0; candidates.len()],
                Some(m) => prefix_scores(
                    m,
                    hashes.len(),
                    self.prefix.args().block_size_to_hash as f64 / 4.0,
                    match_length_weight,
                    match_length_scale_tokens,
                ),
            },
            EppScorerKind::Queue => min_max_scores(&stat(|c| c.stats().waiting)),
            EppScorerKind::RunningRequestsSize => min_max_scores(&stat(|c| c.stats().running)),
            EppScorerKind::KvCacheUtilization => {
                kv_utilization_scores(&stat(|c| c.stats().kv_usage))
            }
            &EppScorerKind::LoadAware { threshold } => {
                load_aware_scores(&stat(|c| c.stats().waiting), threshold)
            }
            EppScorerKind::NoHitLru { .. } => {
                let labels: Vec<&str> = candidates.iter().map(|c| c.label()).collect();
                let cold = matched.is_none_or(|m| m.iter().all(|&b| b == 0));
                self.counters.no_hit.scores(&labels, cold)
            }
            EppScorerKind::LoraAffinity => candidates
                .iter()
                .map(|c| lora_affinity_score(c.lora_state(request.model)))
                .collect(),
            &EppScorerKind::TokenLoad {
                queue_threshold_tokens,
            } => {
                let load: Vec<u64> = candidates.iter().map(|c| c.inflight_tokens()).collect();
                token_load::token_load_scores(&load, uncached, queue_threshold_tokens)
            }
            EppScorerKind::SessionAffinity(strategy) => {
                let labels: Vec<&str> = candidates.iter().map(|c| c.label()).collect();
                let session = strategy.session(request.headers);
                let target = match (strategy, session) {
                    (_, None) => None,
                    (SessionStrategy::EncodedEndpointHeader { .. }, Some(pod)) => Some(pod),
                    (SessionStrategy::SessionId { ttl, .. }, Some(id)) => {
                        let bound = self.counters.sessions.bound(&scorer.name, &id, *ttl);
                        sessions.push((scorer.name.clone(), id));
                        bound
                    }
                };
                session_scores(&labels, target.as_deref())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::EngineStats;
    use crate::scheduler::affinity::RecentPicks;
    use crate::scheduler::config::SchedulerConfig;
    use crate::scheduler::epp::{ROLE_LABEL, epp_total};
    use crate::scheduler::test_pod::{Pod, req};

    fn pods(s: &Scheduler, stats: &[(f64, f64)], roles: &[Option<&str>]) -> Vec<Arc<Pod>> {
        stats
            .iter()
            .zip(roles)
            .enumerate()
            .map(|(i, (&(waiting, kv_usage), role))| {
                Arc::new(Pod {
                    handle: s.prefix_cache().index().add_pod(),
                    label: format!("default/pod-{i}"),
                    labels: role
                        .map(|r| [(ROLE_LABEL.to_string(), r.to_string())].into())
                        .unwrap_or_default(),
                    stats: EngineStats {
                        waiting,
                        kv_usage,
                        ..EngineStats::default()
                    },
                    recent: RecentPicks::default(),
                    rendezvous: i as u64,
                    engine: None,
                })
            })
            .collect()
    }

    fn scheduler(profile: EppProfile) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                filters: Vec::new(),
                scorers: Vec::new(),
                epp: Some(profile),
                ..SchedulerConfig::default()
            },
            5,
            1,
        )
    }

    /// llm-d's default profile on three pods, by hand: prompt of n blocks held whole by pod 0
    /// (prefix 1, 0, 0); waiting 4, 0, 2 (queue 0, 1, 0.5); KV usage 0.5, 0.9, 0.1 (0.5, 0.1,
    /// 0.9). Totals: pod 0 = 2*0 + 2*0.5 + 3*1 = 4; pod 1 = 2*1 + 2*0.1 + 0 = 2.2; pod 2 =
    /// 2*0.5 + 2*0.9 + 0 = 2.8. The pick: pod 0, a prefix hit.
    #[test]
    fn the_default_profile_sums_the_weighted_formulas() {
        let s = scheduler(EppProfile::llm_d_default());
        let p = pods(
            &s,
            &[(4.0, 0.5), (0.0, 0.9), (2.0, 0.1)],
            &[None, None, None],
        );
        let prompt =
            "a shared system prompt that spans several blocks of sixty-four bytes each, repeated";
        let hashes = s.prefix_cache().hash("m", prompt.as_bytes());
        s.record("m", &hashes, &p[0].handle);
        let d = s.schedule(req(prompt), p.clone()).unwrap();
        let totals: Vec<f64> = d.totals.iter().map(|&t| epp_total(t)).collect();
        for (got, want) in totals.iter().zip([4.0, 2.2, 2.8]) {
            assert!((got - want).abs() < 1e-6, "{totals:?}");
        }
        assert_eq!(d.primary().label, "default/pod-0");
        assert_eq!(d.reason, DecisionReason::PrefixHit);
        let names: Vec<&str> = d
            .plugins
            .iter()
            .map(|p| p.fractional.as_ref().unwrap().name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "queue-scorer",
                "kv-cache-utilization-scorer",
                "prefix-cache-scorer"
            ]
        );
        assert_eq!(d.hashes, hashes, "the prompt is recorded at completion");
    }

    /// `--v 4`: each scorer's float scores in Kthena's shape, then the float totals.
    #[test]
    fn verbose_lines_show_each_scorers_float_scores_and_the_totals() {
        let profile = EppProfile {
            scorers: EppProfile::llm_d_default().scorers[..2].to_vec(),
            ..EppProfile::llm_d_default()
        };
        let s = scheduler(profile);
        let p = pods(&s, &[(4.0, 0.5), (0.0, 0.25)], &[None, None]);
        let d = s.schedule(req("x"), p).unwrap();
        let lines = crate::scheduler::test_pod::Lines::default();
        tracing::subscriber::with_default(lines.clone(), || d.log_scores());
        let got = lines.0.lock().unwrap().clone();
        assert_eq!(
            got,
            [
                "ScorePlugin: queue-scorer/queue-scorer, weight: 2",
                "Pod: default/pod-0, Score: 0",
                "Pod: default/pod-1, Score: 1",
                "ScorePlugin: kv-cache-utilization-scorer/kv-cache-utilization-scorer, weight: 2",
                "Pod: default/pod-0, Score: 0.5",
                "Pod: default/pod-1, Score: 0.75",
                "Final Pod Scores:",
                "  Pod: default/pod-0, Final Score: 1",
                "  Pod: default/pod-1, Final Score: 3.5",
            ]
        );
    }

    /// no-hit-lru-scorer: cold requests (no pod holds any of them) go to a pod no cold request
    /// went to yet, each routed one becoming the most recent; explain changes nothing.
    #[test]
    fn no_hit_lru_spreads_cold_requests_over_pods_in_lru_order() {
        use crate::scheduler::epp::{EppScorer, PREFIX_DEFAULT};
        let scorer = |name: &str, kind, weight| EppScorer {
            name: name.into(),
            kind,
            weight,
        };
        let s = scheduler(EppProfile {
            scorers: vec![
                scorer("prefix-cache-scorer", PREFIX_DEFAULT, 2.0),
                scorer(
                    "no-hit-lru-scorer",
                    EppScorerKind::NoHitLru { lru_size: 1024 },
                    1.0,
                ),
            ],
            ..EppProfile::llm_d_default()
        });
        let p = pods(&s, &[(0.0, 0.0); 3], &[None; 3]);
        let explained = s.explain(req("cold prompt zero"), p.clone()).unwrap();
        assert_eq!(explained.primary().label, "default/pod-0");
        let mut picked = Vec::new();
        for prompt in [
            "cold prompt one",
            "cold prompt two",
            "cold prompt three",
            "four",
        ] {
            let d = s.schedule(req(prompt), p.clone()).unwrap();
            assert_eq!(d.reason, DecisionReason::PrefixMiss);
            s.commit("m", &d);
            picked.push(d.primary().label.clone());
        }
        assert_eq!(
            picked,
            [
                "default/pod-0",
                "default/pod-1",
                "default/pod-2",
                "default/pod-0"
            ],
            "never-used pods first, then the least recent"
        );
    }

    #[test]
    fn a_filter_that_leaves_no_pod_is_named_and_roles_filter() {
        let profile = EppProfile {
            filters: vec![EppFilter::Decode],
            ..EppProfile::llm_d_default()
        };
        let s = scheduler(profile.clone());
        let p = pods(
            &s,
            &[(0.0, 0.0), (0.0, 0.0)],
            &[Some("prefill"), Some("decode")],
        );
        let d = s.schedule(req("x"), p.clone()).unwrap();
        assert_eq!(d.candidates.len(), 1);
        assert_eq!(d.primary().label, "default/pod-1");
        let prefill_only = pods(&s, &[(0.0, 0.0)], &[Some("prefill")]);
        let err = s.schedule(req("x"), prefill_only).unwrap_err();
        assert_eq!(err.filter, "decode-filter");
    }

    /// A test pod with an in-flight token load.
    #[derive(Debug)]
    struct Loaded(Arc<Pod>, u64);

    impl Candidate for Loaded {
        fn slot(&self) -> crate::prefix_index::PodSlot {
            self.0.slot()
        }
        fn inflight(&self) -> i64 {
            0
        }
        fn inflight_tokens(&self) -> u64 {
            self.1
        }
        fn stats(&self) -> EngineStats {
            self.0.stats()
        }
        fn recent(&self) -> &RecentPicks {
            self.0.recent()
        }
        fn rendezvous(&self) -> u64 {
            self.0.rendezvous()
        }
        fn label(&self) -> &str {
            self.0.label()
        }
    }

    /// prefix-cache-affinity-filter (threshold 0.8, TTFT penalty 5000 ms at 1000 tokens/s),
    /// prefix-cache-scorer x 3, token-load-scorer (threshold 1000 tokens) x 2,
    /// session-affinity-scorer x 1, by hand. A 640-byte prompt: 10 blocks of 64 bytes, 16
    /// tokens each, 160 tokens. Pod 0 holds 10 blocks, pod 1 holds 8, pod 2 none.
    ///
    /// Light load (in flight 500, 100, 0 tokens): sticky pods 0 and 1 (1.0, 0.8 >= 0.8); best
    /// sticky TTFT 100 ms - best other 0 ms <= 5000: pod 2 filtered out. prefix 3.0, 2.4;
    /// uncached 0 and 2 * 16 = 32 tokens, token load 1 - 500/1000 = 0.5 and 1 - 132/1000 =
    /// 0.868, x 2: 1.0, 1.736. With `x-session-token` = base64("default/pod-0"): session 1, 0;
    /// totals 5.0, 4.136: pod 0. Without it: 4.0, 4.136: pod 1, its 32 uncached tokens in flight.
    ///
    /// Heavy load on the sticky pods (8000, 7000, 0): TTFT 7000 ms - 0 > 5000: every pod kept;
    /// prefix 3.0, 2.4, 0; token load 0, 0 (capped) and 1 - 160/1000 = 0.84 x 2 = 1.68.
    #[test]
    fn affinity_filter_token_load_and_session_affinity_by_hand() {
        use crate::scheduler::epp::session_affinity::encode_pod;
        use crate::scheduler::epp::{EppFilter, EppScorer, PrefixAffinity, SessionStrategy};
        let scorer = |name: &str, kind, weight| EppScorer {
            name: name.into(),
            kind,
            weight,
        };
        let s = scheduler(EppProfile {
            filters: vec![EppFilter::PrefixAffinity(PrefixAffinity {
                max_ttft_penalty_ms: 5000.0,
                peak_prefill_throughput: 1000.0,
                ..PrefixAffinity::default()
            })],
            scorers: vec![
                scorer(
                    "prefix-cache-scorer",
                    crate::scheduler::epp::PREFIX_DEFAULT,
                    3.0,
                ),
                scorer(
                    "token-load-scorer",
                    EppScorerKind::TokenLoad {
                        queue_threshold_tokens: 1000.0,
                    },
                    2.0,
                ),
                scorer(
                    "session-affinity-scorer",
                    EppScorerKind::SessionAffinity(SessionStrategy::EncodedEndpointHeader {
                        header: "x-session-token".into(),
                    }),
                    1.0,
                ),
            ],
            ..EppProfile::llm_d_default()
        });
        let p = pods(&s, &[(0.0, 0.0); 3], &[None; 3]);
        let prompt = "0123456789".repeat(64);
        let hashes = s.prefix_cache().hash("m", prompt.as_bytes());
        assert_eq!(hashes.len(), 10);
        s.record("m", &hashes, &p[0].handle);
        s.record("m", &hashes[..8], &p[1].handle);
        let load = |tokens: [u64; 3]| -> Vec<Arc<Loaded>> {
            p.iter()
                .zip(tokens)
                .map(|(p, t)| Arc::new(Loaded(p.clone(), t)))
                .collect()
        };
        let totals = |d: &Decision<Arc<Loaded>>| -> Vec<f64> {
            d.totals.iter().map(|&t| epp_total(t)).collect()
        };
        let close = |got: Vec<f64>, want: &[f64]| {
            assert_eq!(got.len(), want.len(), "{got:?}");
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-6, "{got:?} != {want:?}");
            }
        };
        let token = [("x-session-token".to_string(), encode_pod("default/pod-0"))];
        let with_session = RouteRequest {
            headers: &token,
            ..req(&prompt)
        };
        let d = s.schedule(with_session, load([500, 100, 0])).unwrap();
        assert_eq!(d.candidates.len(), 2, "pod 2 is not sticky");
        close(totals(&d), &[5.0, 4.136]);
        assert_eq!(d.primary().label(), "default/pod-0");
        assert_eq!(d.epp.inflight_tokens, 0);

        let d = s.schedule(req(&prompt), load([500, 100, 0])).unwrap();
        close(totals(&d), &[4.0, 4.136]);
        assert_eq!(
            d.primary().label(),
            "default/pod-1",
            "no session: no preference"
        );
        assert_eq!(d.epp.inflight_tokens, 32);

        let d = s.schedule(req(&prompt), load([8000, 7000, 0])).unwrap();
        assert_eq!(d.candidates.len(), 3, "the TTFT gate broke stickiness");
        close(totals(&d), &[3.0, 2.4, 1.68]);
        let names: Vec<&str> = d.plugins.iter().map(|p| p.plugin).collect();
        assert_eq!(
            names,
            [
                "prefix-cache-scorer",
                "token-load-scorer",
                "session-affinity-scorer"
            ]
        );
        // Each plugin is timed under its type (kthena_router_scheduler_plugin_duration_seconds).
        let timed: Vec<(&str, &str)> = d
            .observations
            .iter()
            .filter_map(|o| match o {
                Observation::PluginTime { plugin, kind, .. } => Some((*plugin, kind.as_str())),
                _ => None,
            })
            .collect();
        assert_eq!(
            timed,
            [
                ("prefix-cache-affinity-filter", "filter"),
                ("prefix-cache-scorer", "score"),
                ("token-load-scorer", "score"),
                ("session-affinity-scorer", "score")
            ]
        );
    }

    /// session_id: the first request of a session is placed by the other scorers and binds
    /// it; the next ones score its pod 1 (queue-scorer x 1 alone would pick the idle pod).
    #[test]
    fn a_session_id_binds_to_its_first_pod() {
        use crate::scheduler::epp::{EppScorer, SessionStrategy};
        use std::time::Duration;
        let s = scheduler(EppProfile {
            scorers: vec![
                EppScorer {
                    name: "queue-scorer".into(),
                    kind: EppScorerKind::Queue,
                    weight: 1.0,
                },
                EppScorer {
                    name: "sticky".into(),
                    kind: EppScorerKind::SessionAffinity(SessionStrategy::SessionId {
                        headers: vec!["x-session-id".into()],
                        ttl: Duration::from_secs(300),
                        sweep: Duration::from_secs(10),
                    }),
                    weight: 2.0,
                },
            ],
            ..EppProfile::llm_d_default()
        });
        let idle_first = pods(&s, &[(0.0, 0.0), (3.0, 0.0)], &[None, None]);
        let idle_second: Vec<_> = idle_first
            .iter()
            .rev()
            .map(|p| {
                let mut stats = p.stats;
                stats.waiting = 3.0 - stats.waiting;
                Arc::new(Pod {
                    handle: p.handle.clone(),
                    label: p.label.clone(),
                    labels: p.labels.clone(),
                    stats,
                    recent: RecentPicks::default(),
                    rendezvous: p.rendezvous,
                    engine: None,
                })
            })
            .collect();
        let h = [("x-session-id".to_string(), "conv-1".to_string())];
        let r = || RouteRequest {
            headers: &h,
            ..req("x")
        };
        let first = s.schedule(r(), idle_first.clone()).unwrap();
        assert_eq!(first.primary().label, "default/pod-0");
        s.commit("m", &first);
        // pod-0 is now the busy one: queue-scorer says pod-1, the session says pod-0 (2 > 1).
        let second = s.schedule(r(), idle_second.clone()).unwrap();
        assert_eq!(second.primary().label, "default/pod-0");
        // Another session, and a request without one, follow the queue.
        let other = [("x-session-id".to_string(), "conv-2".to_string())];
        let d = s
            .schedule(
                RouteRequest {
                    headers: &other,
                    ..req("x")
                },
                idle_second.clone(),
            )
            .unwrap();
        assert_eq!(d.primary().label, "default/pod-1");
        let d = s.schedule(req("x"), idle_second).unwrap();
        assert_eq!(d.primary().label, "default/pod-1");
    }

    /// disagg-profile-handler with prefix-based-pd-decider (nonCachedTokens 16), as llm-d's P/D
    /// guide: decode profile (decode-filter, prefix x 2, queue x 1), prefill profile
    /// (prefill-filter, same scorers). A 640-byte prompt is 160 tokens in 10 blocks of 16.
    /// Nothing cached: the decode pick (decode-0, the shorter queue) holds 0, 160 >= 16
    /// uncached: the prefill profile picks prefill-1 (the shorter queue). decode-0 holding 9
    /// blocks (144 tokens): 16 uncached, still >= 16; holding all 10: 0 < 16, decode only.
    #[test]
    fn disagg_runs_the_prefill_profile_when_the_decider_says_so() {
        use crate::scheduler::epp::{
            EppFilter, EppScorer, PREFIX_DEFAULT, PdDecider, PrefillStage,
        };
        let scorers = vec![
            EppScorer {
                name: "prefix-cache-scorer".into(),
                kind: PREFIX_DEFAULT,
                weight: 2.0,
            },
            EppScorer {
                name: "queue-scorer".into(),
                kind: EppScorerKind::Queue,
                weight: 1.0,
            },
        ];
        let profile = |name: &str, filter| EppProfile {
            name: name.into(),
            filters: vec![filter],
            scorers: scorers.clone(),
            ..EppProfile::llm_d_default()
        };
        let s = scheduler(EppProfile {
            prefill: Some(Box::new(PrefillStage {
                profile: profile("prefill", EppFilter::Prefill),
                decider: PdDecider::PrefixBased {
                    non_cached_tokens: 16,
                    prompt_tokens: 0,
                },
            })),
            ..profile("decode", EppFilter::Decode)
        });
        let p = pods(
            &s,
            &[(3.0, 0.0), (0.0, 0.0), (0.0, 0.0), (2.0, 0.0)],
            &[
                Some("prefill"),
                Some("prefill"),
                Some("decode"),
                Some("decode"),
            ],
        );
        let prompt = "0123456789".repeat(64);
        let d = s.schedule(req(&prompt), p.clone()).unwrap();
        assert_eq!(d.primary().label, "default/pod-2", "decode-0");
        let pd = d.pd.as_ref().expect("disaggregated");
        assert_eq!(pd.prefill.label, "default/pod-1", "prefill-1");
        assert_eq!(d.candidates.len(), 2, "decode pods only");

        let hashes = s.prefix_cache().hash("m", prompt.as_bytes());
        s.record("m", &hashes[..9], &p[2].handle);
        let d = s.schedule(req(&prompt), p.clone()).unwrap();
        assert_eq!(d.primary().label, "default/pod-2");
        assert!(d.pd.is_some(), "16 uncached tokens >= 16");

        s.record("m", &hashes, &p[2].handle);
        let d = s.schedule(req(&prompt), p.clone()).unwrap();
        assert_eq!(d.primary().label, "default/pod-2");
        assert!(d.pd.is_none(), "all cached on the decode pod: decode only");

        // No decode pod: the decode profile's filter is named.
        let err = s.schedule(req(&prompt), p[..2].to_vec()).unwrap_err();
        assert_eq!(err.filter, "decode-filter");
        // No prefill pod (the decider says yes, prefill-filter leaves none): decode only.
        let cold = "y".repeat(640);
        let d = s.schedule(req(&cold), p[2..].to_vec()).unwrap();
        assert!(d.pd.is_none());
        assert!(s.schedule(req(&cold), p.clone()).unwrap().pd.is_some());
    }
}
