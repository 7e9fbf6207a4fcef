//! prefix-cache's `pluginConfig` args, parsed with Kthena's leniency (never fails): omitted,
//! zero or negative -> default; unknown names are ignored with a warning; an args block that
//! cannot be parsed (a string value, a fraction, a list) gives all defaults and
//! [`UNPARSABLE_ARGS`], Kthena's exact log line.

use serde_yaml_ng::Value as Yaml;

use super::integral;
use crate::scheduler::prefix_cache::PrefixCacheArgs;

/// The exact log line Kthena writes when the args block cannot be parsed.
pub const UNPARSABLE_ARGS: &str = "Failed to unmarshal PrefixCacheArgs, using default values";

/// prefix-cache's arguments plus the warnings their parsing produced (for the caller to log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedArgs {
    pub args: PrefixCacheArgs,
    pub warnings: Vec<String>,
}

const KEYS: [&str; 4] = [
    "blockSizeToHash",
    "maxBlocksToMatch",
    "maxHashCacheSize",
    "topKMatches",
];

/// Parses prefix-cache's `args` value with Kthena's leniency (never fails): omitted, zero or
/// negative -> default; unknown names are ignored with a warning; an args block that cannot be
/// parsed (a string value, a fraction, a list) gives all defaults and [`UNPARSABLE_ARGS`].
pub fn parse_prefix_cache_args(args: Option<&Yaml>) -> ParsedArgs {
    let mut warnings = Vec::new();
    let mut values: [Option<i64>; 4] = [None; 4];
    let parsed = match args {
        None | Some(Yaml::Null) => true,
        Some(Yaml::Mapping(map)) => map.iter().all(|(k, v)| {
            let Some(name) = k.as_str() else {
                return false;
            };
            let Some(slot) = KEYS.iter().position(|key| key.eq_ignore_ascii_case(name)) else {
                warnings.push(format!(
                    "prefix-cache: unknown argument {name:?} ignored (known: {})",
                    KEYS.join(", ")
                ));
                return true;
            };
            match integral(v) {
                Ok(n) => {
                    values[slot] = n;
                    true
                }
                Err(()) => false,
            }
        }),
        Some(_) => false,
    };
    if !parsed {
        warnings.clear();
        warnings.push(UNPARSABLE_ARGS.to_string());
        return ParsedArgs {
            args: PrefixCacheArgs::default(),
            warnings,
        };
    }
    let d = PrefixCacheArgs::default();
    let pick = |v: Option<i64>, default: usize| match v {
        Some(n) if n > 0 => usize::try_from(n).unwrap_or(default),
        _ => default,
    };
    ParsedArgs {
        args: PrefixCacheArgs {
            block_size_to_hash: pick(values[0], d.block_size_to_hash),
            max_blocks_to_match: pick(values[1], d.max_blocks_to_match),
            max_hash_cache_size: pick(values[2], d.max_hash_cache_size).min(u32::MAX as usize - 1),
            top_k_matches: pick(values[3], d.top_k_matches),
        },
        warnings,
    }
}
