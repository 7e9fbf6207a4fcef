//! `disagg-profile-handler` and its prefill deciders as an `EndpointPickerConfig` declares
//! them (llm-d/llm-d-router ebab6879,
//! `pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler.go`:
//! `DisaggProfileHandlerParameters`, the deprecated flat `legacyDisaggProfileHandlerParameters`;
//! `prefix_based_pd_decider.go`: `PrefixBasedPDDeciderConfig`). The scheduling is
//! [`crate::scheduler::epp::disagg`]. Refused by name: the encode stage (`deciders.encode`) and
//! `stageOrder: prefill-first`.

use serde::Deserialize;

use crate::scheduler::epp::PdDecider;

/// The handler's parameters, as read: which profiles are decode and prefill, and which plugin
/// decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DisaggHandler {
    pub decode: String,
    pub prefill: String,
    /// `deciders.prefill`: a decider plugin's name (none: P/D off, as llm-d).
    pub decider: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Nested {
    stage_order: Option<String>,
    #[serde(default)]
    profiles: Profiles,
    #[serde(default)]
    deciders: Deciders,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profiles {
    decode: Option<String>,
    prefill: Option<String>,
    encode: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Deciders {
    prefill: Option<String>,
    encode: Option<String>,
}

/// The deprecated flat format llm-d still reads.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Legacy {
    stage_order: Option<String>,
    decode_profile: Option<String>,
    prefill_profile: Option<String>,
    encode_profile: Option<String>,
    prefill_decider_plugin_name: Option<String>,
    encode_decider_plugin_name: Option<String>,
    decider_plugin_name: Option<String>,
}

/// `disagg-profile-handler`'s parameters (`None`: llm-d's defaults, decode-only).
pub(super) fn handler(
    spec: &super::PluginSpec,
    warnings: &mut Vec<String>,
) -> Result<DisaggHandler, String> {
    let nested = match &spec.parameters {
        None | Some(serde_yaml_ng::Value::Null) => Nested::default(),
        Some(v) => match serde_yaml_ng::from_value::<Nested>(v.clone()) {
            Ok(n) => n,
            Err(nested) => {
                let legacy: Legacy = serde_yaml_ng::from_value(v.clone()).map_err(|legacy| {
                    format!(
                        "parameters of disagg-profile-handler: nested schema error: {nested}; legacy schema error: {legacy}"
                    )
                })?;
                warnings.push(
                    "disagg-profile-handler: the flat parameter format is deprecated (llm-d); use profiles / deciders".into(),
                );
                Nested {
                    stage_order: legacy.stage_order,
                    profiles: Profiles {
                        decode: legacy.decode_profile,
                        prefill: legacy.prefill_profile,
                        encode: legacy.encode_profile,
                    },
                    deciders: Deciders {
                        prefill: legacy
                            .prefill_decider_plugin_name
                            .or(legacy.decider_plugin_name),
                        encode: legacy.encode_decider_plugin_name,
                    },
                }
            }
        },
    };
    let order = nested.stage_order.unwrap_or_default();
    match order.to_ascii_lowercase().replace(['-', '_'], "").as_str() {
        "" | "decodefirst" | "decode" => {}
        "prefillfirst" | "prefill" => {
            return Err(format!(
                "stageOrder {order:?} is llm-d's but not implemented by prefix-picker (the decode pod is picked first); leave it out"
            ));
        }
        _ => {
            return Err(format!(
                "stageOrder {order:?} must be \"decode-first\" or \"prefill-first\""
            ));
        }
    }
    if let Some(encode) = nested.deciders.encode.filter(|e| !e.is_empty()) {
        return Err(format!(
            "deciders.encode {encode:?}: the encode stage (E/P/D) is not implemented by prefix-picker; leave it out"
        ));
    }
    let _ = nested.profiles.encode;
    let name = |v: Option<String>, default: &str| {
        v.filter(|s| !s.is_empty())
            .unwrap_or_else(|| default.to_string())
    };
    Ok(DisaggHandler {
        decode: name(nested.profiles.decode, "decode"),
        prefill: name(nested.profiles.prefill, "prefill"),
        decider: nested.deciders.prefill.filter(|s| !s.is_empty()),
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PrefixBasedParameters {
    non_cached_tokens: Option<i64>,
    prompt_tokens: Option<i64>,
}

/// `prefix-based-pd-decider`'s parameters (both default 0; `nonCachedTokens: 0` never
/// disaggregates).
pub(super) fn prefix_based(spec: &super::PluginSpec) -> Result<PdDecider, String> {
    let p: PrefixBasedParameters = super::parameters(spec)?;
    let non_negative = |v: Option<i64>, field: &str| match v.unwrap_or(0) {
        n if n < 0 => Err(format!("{field} cannot be negative, got {n}")),
        n => Ok(n as u64),
    };
    Ok(PdDecider::PrefixBased {
        non_cached_tokens: non_negative(p.non_cached_tokens, "nonCachedTokens")?,
        prompt_tokens: non_negative(p.prompt_tokens, "promptTokens")?,
    })
}
