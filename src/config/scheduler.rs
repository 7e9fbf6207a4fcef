//! Kthena's `scheduler:` block: `pluginConfig` (each plugin's args), then `plugins.Filter` and
//! `plugins.Score` (which plugins run, scores with their weights). Kthena's leniencies are
//! warnings: unknown plugin names (`Failed to get plugin <name>.`, also for a filter listed
//! under `Score` or a scorer under `Filter`, as Kthena's two registries say), `disabled` lists (no
//! effect), `random` next to other scorers (removed); a weight that is not a positive integer is
//! an error, in Kthena's exact text.

use serde_yaml_ng::Value as Yaml;

use super::{ConfigError, get, lookup_ci, parse_kvcache_aware_args, parse_prefix_cache_args, show};
use crate::scheduler::config::{FilterKind, SchedulerConfig, ScorerKind};

/// Plugin names Kthena knows that prefix-picker skips (with Kthena's own warning).
const KNOWN_ELSEWHERE: [&str; 1] = ["pd-group"];

/// `scheduler:` into a [`SchedulerConfig`]; a part that is not the shape it must be stops the
/// parsing there (an error), leaving defaults for the rest.
pub(super) fn parse_scheduler(
    value: &Yaml,
    warnings: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> SchedulerConfig {
    let mut s = SchedulerConfig::default();
    let Yaml::Mapping(map) = value else {
        errors.push(ConfigError::Plugins("scheduler must be a mapping".into()));
        return s;
    };
    let list = match get(map, "pluginConfig") {
        None => &[][..],
        Some(Yaml::Sequence(list)) => list.as_slice(),
        Some(_) => {
            errors.push(ConfigError::Plugins("pluginConfig must be a list".into()));
            return s;
        }
    };
    let (prefix_args, kvcache_args) = plugin_config(list, &mut s, warnings, errors);
    let parsed = parse_prefix_cache_args(prefix_args.as_ref());
    s.prefix_cache = parsed.args;
    warnings.extend(parsed.warnings);
    let parsed = parse_kvcache_aware_args(kvcache_args.as_ref());
    s.kvcache_aware = parsed.args;
    warnings.extend(parsed.warnings);

    let Some(plugins) = get(map, "plugins") else {
        return s;
    };
    let Yaml::Mapping(plugins) = plugins else {
        errors.push(ConfigError::Plugins("plugins must be a mapping".into()));
        return s;
    };
    if let Some(filter) = get(plugins, "Filter") {
        s.filters = filter_plugins(filter, warnings, errors);
    }
    if let Some(score) = get(plugins, "Score") {
        s.scorers = score_plugins(score, warnings, errors);
    }
    s
}

/// `pluginConfig`'s entries: least-request's and least-latency's args set into `s`; the args of
/// prefix-cache and kvcache-aware returned (the last entry of each wins) for their parsers.
fn plugin_config(
    list: &[Yaml],
    s: &mut SchedulerConfig,
    warnings: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> (Option<Yaml>, Option<Yaml>) {
    let (mut prefix_args, mut kvcache_args) = (None, None);
    for item in list {
        let name = item.get("name").and_then(Yaml::as_str).unwrap_or_default();
        let args = item.get("args");
        match name {
            "prefix-cache" => prefix_args = args.cloned(),
            "kvcache-aware" => kvcache_args = args.cloned(),
            "least-request" => {
                if let Some(n) = args
                    .and_then(|a| lookup_ci(a, "maxWaitingRequests"))
                    .and_then(Yaml::as_i64)
                {
                    s.max_waiting_requests = if n > 0 { n as u64 } else { 10 };
                }
            }
            "least-latency" => {
                if let Some(v) = args.and_then(|a| lookup_ci(a, "TTFTTPOTWeightFactor")) {
                    match v.as_f64() {
                        Some(f) if f.is_finite() && (0.0..=1.0).contains(&f) => {
                            s.ttft_tpot_weight_factor = f
                        }
                        _ => errors.push(ConfigError::WeightFactor(show(v))),
                    }
                }
            }
            other => warnings.push(format!("pluginConfig for {other:?} ignored")),
        }
    }
    (prefix_args, kvcache_args)
}

/// The entries of a plugin section's `enabled` list (none when it is not a list).
fn enabled(section: &Yaml) -> impl Iterator<Item = &Yaml> {
    section
        .get("enabled")
        .and_then(Yaml::as_sequence)
        .into_iter()
        .flatten()
}

/// `plugins.Filter`: the filters, in order (least-request, lora-affinity; a name listed twice
/// runs twice, as in Kthena).
fn filter_plugins(
    filter: &Yaml,
    warnings: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> Vec<FilterKind> {
    if filter.get("disabled").is_some() {
        warnings.push("plugins.Filter.disabled has no effect".into());
    }
    let mut filters = Vec::new();
    for name in enabled(filter) {
        match name.as_str() {
            Some(other) => match FilterKind::from_name(other) {
                Some(kind) => filters.push(kind),
                None => warnings.push(format!("Failed to get plugin {other}.")),
            },
            None => errors.push(ConfigError::Plugins(format!(
                "filter plugin names must be strings, got {}",
                show(name)
            ))),
        }
    }
    filters
}

/// `plugins.Score`: the scorers with their weights, in order; `random` dropped when others run.
fn score_plugins(
    score: &Yaml,
    warnings: &mut Vec<String>,
    errors: &mut Vec<ConfigError>,
) -> Vec<(ScorerKind, u32)> {
    if score.get("disabled").is_some() {
        warnings.push("plugins.Score.disabled has no effect".into());
    }
    let mut scorers = Vec::new();
    for item in enabled(score) {
        let Some((name, weight)) = weighted(item, errors) else {
            continue;
        };
        match ScorerKind::from_name(name) {
            Some(kind) => scorers.push((kind, weight.min(u32::MAX as i64) as u32)),
            None if KNOWN_ELSEWHERE.contains(&name) => warnings.push(format!(
                "Failed to get plugin {name}. (not implemented by prefix-picker; skipped)"
            )),
            None if FilterKind::from_name(name).is_some() => warnings.push(format!(
                "Failed to get plugin {name}. (a filter plugin: list it under plugins.Filter)"
            )),
            None => warnings.push(format!("Failed to get plugin {name}.")),
        }
    }
    if scorers.len() > 1 && scorers.iter().any(|(k, _)| *k == ScorerKind::Random) {
        scorers.retain(|(k, _)| *k != ScorerKind::Random);
        warnings.push("random score plugin removed: it cannot be combined with others".into());
    }
    scorers
}

/// A score entry's name and its weight, a positive integer (unset is 0, Kthena's error).
fn weighted<'a>(item: &'a Yaml, errors: &mut Vec<ConfigError>) -> Option<(&'a str, i64)> {
    let Some(name) = item.get("name").and_then(Yaml::as_str) else {
        errors.push(ConfigError::Plugins(format!(
            "score plugin entry without a name: {}",
            show(item)
        )));
        return None;
    };
    let weight = match item.get("weight") {
        None | Some(Yaml::Null) => 0,
        Some(w) => match w.as_i64() {
            Some(w) => w,
            None => {
                errors.push(ConfigError::Plugins(format!(
                    "score plugin {name:?} weight must be an integer, got {}",
                    show(w)
                )));
                return None;
            }
        },
    };
    if weight <= 0 {
        errors.push(ConfigError::Weight {
            name: name.to_string(),
            weight,
        });
        return None;
    }
    Some((name, weight))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Yaml {
        serde_yaml_ng::from_str(text).unwrap()
    }

    #[test]
    fn a_weight_must_be_a_positive_integer_and_the_error_names_the_plugin() {
        let mut errors = Vec::new();
        let ok = yaml("{name: prefix-cache, weight: 3}");
        assert_eq!(weighted(&ok, &mut errors), Some(("prefix-cache", 3)));
        for bad in [
            "{name: p}",
            "{name: p, weight: 0}",
            "{name: p, weight: 1.5}",
            "{weight: 2}",
        ] {
            assert_eq!(weighted(&yaml(bad), &mut errors), None, "{bad}");
        }
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(shown[0].ends_with("score plugin \"p\" must set a weight greater than 0, got 0"));
        assert!(shown[1].ends_with("got 0"), "{}", shown[1]);
        assert!(shown[2].ends_with("score plugin \"p\" weight must be an integer, got 1.5"));
        assert!(shown[3].ends_with("score plugin entry without a name: weight: 2"));
    }

    #[test]
    fn plugin_config_keeps_the_last_args_and_warns_of_other_plugins() {
        let list = yaml(
            "[{name: prefix-cache, args: {blockSizeToHash: 8}}, {name: prefix-cache},
              {name: least-request, args: {MAXWAITINGREQUESTS: 7}}, {name: gpu-usage}]",
        );
        let (mut s, mut warnings, mut errors) = (SchedulerConfig::default(), vec![], vec![]);
        let (prefix, kvcache) = plugin_config(
            list.as_sequence().unwrap(),
            &mut s,
            &mut warnings,
            &mut errors,
        );
        assert_eq!((prefix, kvcache), (None, None));
        assert_eq!(s.max_waiting_requests, 7, "keys match case-insensitively");
        assert_eq!(warnings, ["pluginConfig for \"gpu-usage\" ignored"]);
        assert!(errors.is_empty());
    }

    #[test]
    fn random_is_dropped_only_next_to_other_scorers() {
        let (mut warnings, mut errors) = (vec![], vec![]);
        let alone = yaml("{enabled: [{name: random, weight: 1}]}");
        assert_eq!(
            score_plugins(&alone, &mut warnings, &mut errors),
            [(ScorerKind::Random, 1)]
        );
        assert!(warnings.is_empty());
        let both = yaml("{enabled: [{name: random, weight: 1}, {name: least-request, weight: 2}]}");
        assert_eq!(
            score_plugins(&both, &mut warnings, &mut errors),
            [(ScorerKind::LeastRequest, 2)]
        );
        assert_eq!(
            warnings,
            ["random score plugin removed: it cannot be combined with others"]
        );
    }
}
