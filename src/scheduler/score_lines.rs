//! Kthena's `--v=4` score lines of a decision, verbatim, at debug level on the `scores`
//! target (the golden-log tests compare them with Kthena's), then the affinity mode's
//! predictions and match sources. An `EndpointPickerConfig` profile's scorers print in the same
//! shape with llm-d's float scores: `ScorePlugin: <type>/<name>, weight: <w>`, then `Pod: <pod>,
//! Score: <0..1>` per pod, then `Final Pod Scores:` and `  Pod: <pod>, Final Score: <weighted
//! sum>`.

use super::{Candidate, Decision, PrefillPass};

impl<C: Candidate> Decision<C> {
    /// Kthena's `--v=4` score lines, verbatim, at debug level on the `scores` target; in PD
    /// mode with Kthena's phase lines before the decode pass and each prefill pass.
    pub fn log_scores(&self) {
        if !tracing::enabled!(target: "scores", tracing::Level::DEBUG) {
            return;
        }
        let Some(pd) = &self.pd else {
            self.log_pass();
            return;
        };
        tracing::debug!(target: "scores", "Using optimized PD disaggregated scheduling");
        tracing::debug!(target: "scores", "Running score plugins for decode pod");
        self.log_pass();
        for pass in &pd.passes {
            match pass {
                PrefillPass::Scored { decision, .. } => {
                    tracing::debug!(target: "scores", "Running score plugins for prefill pod");
                    decision.log_pass();
                }
                PrefillPass::NoPrefillPods { decode } => tracing::debug!(
                    target: "scores",
                    decode_instance = decode.label(),
                    "prefill pods for decode group not found"
                ),
                PrefillPass::FilteredOut { decode, filter } => tracing::debug!(
                    target: "scores",
                    decode_instance = decode.label(),
                    filter,
                    "prefill pods were filtered out"
                ),
            }
        }
    }

    /// An `EndpointPickerConfig` profile's lines: each scorer's float scores, then the totals.
    fn log_fractional(&self) {
        for p in &self.plugins {
            let Some(f) = &p.fractional else { continue };
            tracing::debug!(target: "scores", "ScorePlugin: {}/{}, weight: {}", p.plugin, f.name, f.weight);
            for (e, s) in self.candidates.iter().zip(&f.scores) {
                tracing::debug!(target: "scores", "Pod: {}, Score: {}", e.label(), s);
            }
        }
        tracing::debug!(target: "scores", "Final Pod Scores:");
        for (e, &t) in self.candidates.iter().zip(&self.totals) {
            let total = super::epp::epp_total(t);
            tracing::debug!(target: "scores", "  Pod: {}, Final Score: {}", e.label(), total);
        }
        self.log_match_sources();
    }

    /// One pass's score lines.
    fn log_pass(&self) {
        if self.plugins.iter().any(|p| p.fractional.is_some()) {
            self.log_fractional();
            return;
        }
        for p in &self.plugins {
            let Some(scores) = &p.scores else { continue };
            tracing::debug!(target: "scores", "ScorePlugin: {}", p.plugin);
            for (e, s) in self.candidates.iter().zip(scores) {
                tracing::debug!(target: "scores", "Pod: {}, Score: {}", e.label(), s);
            }
        }
        if let Some((matched, total)) = &self.kv_matched {
            // Kthena's calculatePodScores line per pod holding the first block.
            for (e, &m) in self.candidates.iter().zip(matched) {
                if m == 0 {
                    continue;
                }
                let score = (m as f64 / *total as f64 * 100.0) as u32;
                tracing::debug!(
                    target: "scores",
                    "KVCacheAware.calculateScores: pod={} matched={}/{} blocks, score={}",
                    e.cache_owner().unwrap_or(e.label()),
                    m,
                    total,
                    score
                );
            }
        }
        tracing::debug!(target: "scores", "Final Pod Scores:");
        for (e, t) in self.candidates.iter().zip(&self.totals) {
            tracing::debug!(target: "scores", "  Pod: {}, Final Score: {}", e.label(), t);
        }
        if !self.predictions.is_empty() {
            tracing::debug!(target: "scores", "Predicted TTFT:");
        }
        for (e, p) in self.candidates.iter().zip(self.predictions.iter()) {
            tracing::debug!(
                target: "scores",
                "  Pod: {}, Predicted TTFT: {:.1} ms (wait {:.1} ms, prefill {:.1} ms of {:.0} tokens)",
                e.label(),
                p.ttft() * 1e3,
                p.wait * 1e3,
                p.prefill * 1e3,
                p.uncached_tokens
            );
        }
        self.log_match_sources();
    }

    /// The affinity mode's, or an `EndpointPickerConfig` precise producer's, engine matches.
    fn log_match_sources(&self) {
        if self.engine.is_empty() {
            return;
        }
        tracing::debug!(target: "scores", "Match sources:");
        for (i, e) in self.candidates.iter().enumerate() {
            match self.engine.get(i).copied().flatten() {
                Some(m) => tracing::debug!(
                    target: "scores",
                    "  Pod: {}, Source: {}, Matched: {} tokens, then {} blocks by the estimate",
                    e.label(),
                    self.match_source(i).as_str(),
                    m.tokens,
                    m.estimate_beyond
                ),
                None => tracing::debug!(target: "scores", "  Pod: {}, Source: estimate", e.label()),
            }
        }
    }
}
