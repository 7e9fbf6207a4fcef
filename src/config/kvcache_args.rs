//! `kvcache-aware`'s `pluginConfig` args, parsed with Kthena's leniency (`NewKVCacheAware` at
//! volcano-sh/kthena 3cc0572): keys match case-insensitively (Go's JSON decoding), an args
//! block that does not decode (a string or fractional value, a list) gives all defaults with
//! Kthena's `Failed to unmarshal KVCacheAwareArgs` warning; `blockSizeToHash` or
//! `maxBlocksToMatch` omitted, zero or negative -> the default (warned here when set, silent in
//! Kthena); a tokenizer port outside 1..=65535 and not 0 -> the default with Kthena's
//! `invalid <engine> tokenizer port` warning. Unknown keys are ignored, with a warning.

use serde_yaml_ng::Value as Yaml;

use super::integral;
use crate::scheduler::kvcache_aware::KvCacheAwareArgs;

/// The exact log line Kthena writes when the args block cannot be decoded (Kthena appends the
/// decoder's error).
pub const UNPARSABLE_KVCACHE_ARGS: &str = "Failed to unmarshal KVCacheAwareArgs";

const KEYS: [&str; 4] = [
    "blockSizeToHash",
    "maxBlocksToMatch",
    "vllmTokenizerPort",
    "sglangTokenizerPort",
];

/// kvcache-aware's args and the warnings their parsing produced (for the caller to log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKvCacheArgs {
    pub args: KvCacheAwareArgs,
    pub warnings: Vec<String>,
}

/// Parses `args` (never fails; see the module header).
pub fn parse_kvcache_aware_args(args: Option<&Yaml>) -> ParsedKvCacheArgs {
    let mut warnings = Vec::new();
    let values = match decode(args, &mut warnings) {
        Ok(values) => values,
        Err(e) => {
            return ParsedKvCacheArgs {
                args: KvCacheAwareArgs::default(),
                warnings: vec![format!("{UNPARSABLE_KVCACHE_ARGS}: {e}")],
            };
        }
    };
    let d = KvCacheAwareArgs::default();
    let mut count = |v: Option<i64>, name: &str, default: usize| match v {
        Some(n) if n > 0 => usize::try_from(n).unwrap_or(default),
        None => default,
        Some(n) => {
            warnings.push(format!(
                "kvcache-aware: {name} {n} is not positive, using default {default}"
            ));
            default
        }
    };
    let block_size_to_hash = count(values[0], KEYS[0], d.block_size_to_hash);
    let max_blocks_to_match = count(values[1], KEYS[1], d.max_blocks_to_match);
    let mut port = |v: Option<i64>, engine: &str, default: u16| match v {
        Some(n) if (1..=65535).contains(&n) => n as u16,
        None | Some(0) => default,
        Some(n) => {
            warnings.push(format!(
                "KVCacheAware: invalid {engine} tokenizer port {n}, using default {default}"
            ));
            default
        }
    };
    let vllm_tokenizer_port = port(values[2], "vllm", d.vllm_tokenizer_port);
    let sglang_tokenizer_port = port(values[3], "sglang", d.sglang_tokenizer_port);
    ParsedKvCacheArgs {
        args: KvCacheAwareArgs {
            block_size_to_hash,
            max_blocks_to_match,
            vllm_tokenizer_port,
            sglang_tokenizer_port,
        },
        warnings,
    }
}

/// The args block decoded as Go decodes it into the args struct: each known key's integer, by
/// [`KEYS`]' order (case-insensitive names; unknown ones warned about); the error says why not.
fn decode(args: Option<&Yaml>, warnings: &mut Vec<String>) -> Result<[Option<i64>; 4], String> {
    let mut values: [Option<i64>; 4] = [None; 4];
    let map = match args {
        None | Some(Yaml::Null) => return Ok(values),
        Some(Yaml::Mapping(map)) => map,
        Some(other) => return Err(format!("args must be a mapping, got {other:?}")),
    };
    for (k, v) in map {
        let name = k
            .as_str()
            .ok_or_else(|| format!("key {k:?} is not a string"))?;
        let Some(slot) = KEYS.iter().position(|key| key.eq_ignore_ascii_case(name)) else {
            warnings.push(format!(
                "kvcache-aware: unknown argument {name:?} ignored (known: {})",
                KEYS.join(", ")
            ));
            continue;
        };
        values[slot] = integral(v).map_err(|()| format!("{name}: not an integer: {v:?}"))?;
    }
    Ok(values)
}
