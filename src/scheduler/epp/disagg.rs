//! llm-d's `disagg-profile-handler` for prefill/decode (P/D), mapped onto this project's P/D
//! pairs: the decode pod is the pick, the prefill pod is named in `x-prefiller-host-port` and
//! recorded like a Kthena `pdGroup` pair's.
//!
//! Upstream (llm-d/llm-d-router ebab6879, read, not copied):
//! `pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go`
//! (`pickDecodeFirst`, `ProcessResults`, `PreRequest`), `prefix_based_pd_decider.go`,
//! `always_disagg_pd_decider.go`. One request, decode first (llm-d's default `stageOrder`):
//! 1. the decode profile (`profiles.decode`, default `decode`) runs over every pod; no pod
//!    left: the request fails ("failed to find available decode workers");
//! 2. with a prefill decider (`deciders.prefill`) and a prefill profile (`profiles.prefill`,
//!    default `prefill`), the decider is asked about the decode pick; when it says yes, the
//!    prefill profile runs over every pod and its pick is the prefill pod (none left: decode
//!    only, no header). Without a decider P/D is off for every request.
//!
//! Deciders: `prefix-based-pd-decider` says yes when `nonCachedTokens > 0`, the prompt's tokens
//! are at least `promptTokens` (when > 0) and at least `nonCachedTokens`, and the prompt's
//! tokens not held by the decode pick (prompt tokens - its matched blocks * block tokens) are
//! at least `nonCachedTokens`; no prefix match known (no prefix-cache-scorer in the decode
//! profile): no. `always-disagg-pd-decider` always says yes. Tokens are the estimate token
//! producer's ([`super::token_load::input_tokens`]). The encode stage and `stageOrder:
//! prefill-first` are refused by the config.

use super::EppProfile;

/// A prefill decider (`deciders.prefill`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdDecider {
    /// `prefix-based-pd-decider`.
    PrefixBased {
        non_cached_tokens: u64,
        prompt_tokens: u64,
    },
    /// `always-disagg-pd-decider`.
    Always,
}

impl PdDecider {
    pub fn as_str(self) -> &'static str {
        match self {
            PdDecider::PrefixBased { .. } => "prefix-based-pd-decider",
            PdDecider::Always => "always-disagg-pd-decider",
        }
    }

    /// Whether the prefill stage runs, for a prompt of `input` tokens of which the decode pick
    /// holds `cached` (`None`: no prefix match known).
    pub fn disaggregate(self, input: u64, cached: Option<u64>) -> bool {
        match self {
            PdDecider::Always => true,
            PdDecider::PrefixBased {
                non_cached_tokens,
                prompt_tokens,
            } => {
                if non_cached_tokens == 0
                    || (prompt_tokens > 0 && input < prompt_tokens)
                    || input < non_cached_tokens
                {
                    return false;
                }
                cached.is_some_and(|c| input.saturating_sub(c) >= non_cached_tokens)
            }
        }
    }
}

/// The prefill stage of a `disagg-profile-handler`: its profile and its decider.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillStage {
    pub profile: EppProfile,
    pub decider: PdDecider,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand, nonCachedTokens 16: a 100-token prompt the decode pod holds 80 of leaves 20,
    /// at least 16: yes; holding 96 leaves 4: no; a 10-token prompt is shorter than 16: no; no
    /// match known: no. promptTokens 200 turns the 100-token prompt away. 0 disables it.
    #[test]
    fn prefix_based_decider_follows_the_uncached_suffix() {
        let d = PdDecider::PrefixBased {
            non_cached_tokens: 16,
            prompt_tokens: 0,
        };
        assert!(d.disaggregate(100, Some(80)));
        assert!(!d.disaggregate(100, Some(96)));
        assert!(!d.disaggregate(10, Some(0)));
        assert!(!d.disaggregate(100, None));
        let gated = PdDecider::PrefixBased {
            non_cached_tokens: 16,
            prompt_tokens: 200,
        };
        assert!(!gated.disaggregate(100, Some(0)));
        assert!(gated.disaggregate(200, Some(0)));
        let off = PdDecider::PrefixBased {
            non_cached_tokens: 0,
            prompt_tokens: 0,
        };
        assert!(!off.disaggregate(1000, Some(0)));
        assert!(PdDecider::Always.disaggregate(0, None));
    }
}
