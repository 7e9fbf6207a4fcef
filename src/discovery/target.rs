//! What the pod watcher selects: a Kubernetes label selector and the target ports.
//!
//! The selector string follows Kubernetes' label-selector grammar (`kubectl get -l`, GIE's
//! `--endpoint-selector`): comma-separated requirements `key`, `!key`, `key=value`, `key==value`,
//! `key!=value`, `key in (a,b)`, `key notin (a,b)`. Keys are qualified names (optional DNS-subdomain
//! prefix and `/`, then a name of at most 63 characters); values are empty or at most 63
//! characters. It is parsed once into [`kube::core::Selector`], whose `Display` is what the watch
//! request sends. An empty selector is refused: it would select every pod in the namespace.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, Selector};
use thiserror::Error;

/// Pods to watch and the ports each one serves on: one endpoint per pod IP x port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub selector: Selector,
    /// Distinct, non-zero, in configured order.
    pub ports: Vec<u16>,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("label selector must not be empty (it would select every pod)")]
    EmptySelector,
    #[error("label selector {selector:?}: bad requirement {requirement:?}: {reason}")]
    Selector {
        selector: String,
        requirement: String,
        reason: &'static str,
    },
    #[error("target ports must not be empty")]
    NoPorts,
    #[error("target port {0} is not in 1..=65535")]
    Port(i64),
    #[error("target port {0} is listed twice")]
    DuplicatePort(u16),
}

impl Target {
    /// Validates ports (1..=65535, distinct, at least one).
    pub fn new(selector: Selector, ports: &[i64]) -> Result<Target, TargetError> {
        if ports.is_empty() {
            return Err(TargetError::NoPorts);
        }
        let mut out: Vec<u16> = Vec::with_capacity(ports.len());
        for &p in ports {
            let port = u16::try_from(p)
                .ok()
                .filter(|p| *p != 0)
                .ok_or(TargetError::Port(p))?;
            if out.contains(&port) {
                return Err(TargetError::DuplicatePort(port));
            }
            out.push(port);
        }
        Ok(Target {
            selector,
            ports: out,
        })
    }

    /// A selector of `key=value` pairs (an InferencePool's `matchLabels`).
    pub fn match_labels(labels: &BTreeMap<String, String>) -> Result<Selector, TargetError> {
        let text = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        parse_selector(&text)
    }
}

/// Parses a label-selector string.
pub fn parse_selector(text: &str) -> Result<Selector, TargetError> {
    if text.trim().is_empty() {
        return Err(TargetError::EmptySelector);
    }
    let mut expressions = Vec::new();
    for requirement in split_requirements(text) {
        let bad = |reason| TargetError::Selector {
            selector: text.to_string(),
            requirement: requirement.to_string(),
            reason,
        };
        expressions.push(parse_requirement(requirement.trim()).map_err(bad)?);
    }
    Ok(expressions.into_iter().collect())
}

/// Splits at commas outside parentheses.
fn split_requirements(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(r: &str) -> Result<Expression, &'static str> {
    if r.is_empty() {
        return Err("empty requirement");
    }
    if let Some(key) = r.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(key_of(key.trim())?));
    }
    if let Some((key, rest)) = r.split_once(char::is_whitespace) {
        let rest = rest.trim_start();
        let (set_op, values) = if let Some(v) = rest.strip_prefix("notin") {
            (false, v)
        } else if let Some(v) = rest.strip_prefix("in") {
            (true, v)
        } else {
            return parse_comparison(r);
        };
        let values = values
            .trim()
            .strip_prefix('(')
            .and_then(|v| v.strip_suffix(')'))
            .ok_or("a set must be written (a,b,...)")?;
        let set = values
            .split(',')
            .map(|v| value_of(v.trim()))
            .collect::<Result<BTreeSet<_>, _>>()?;
        let key = key_of(key)?;
        return Ok(if set_op {
            Expression::In(key, set)
        } else {
            Expression::NotIn(key, set)
        });
    }
    parse_comparison(r)
}

fn parse_comparison(r: &str) -> Result<Expression, &'static str> {
    if let Some((k, v)) = r.split_once("!=") {
        return Ok(Expression::NotEqual(key_of(k.trim())?, value_of(v.trim())?));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        return Ok(Expression::Equal(key_of(k.trim())?, value_of(v.trim())?));
    }
    Ok(Expression::Exists(key_of(r)?))
}

/// A label key: `[prefix/]name`, prefix a DNS subdomain (<= 253), name <= 63.
fn key_of(key: &str) -> Result<String, &'static str> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            let dns =
                |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
            if prefix.is_empty() || prefix.len() > 253 || !prefix.chars().all(dns) {
                return Err("key prefix must be a DNS subdomain");
            }
            name
        }
        None => key,
    };
    if name.is_empty() || !is_label_value(name) {
        return Err(
            "key must be 1-63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
        );
    }
    Ok(key.to_string())
}

fn value_of(value: &str) -> Result<String, &'static str> {
    if !is_label_value(value) {
        return Err(
            "value must be at most 63 alphanumerics, '-', '_' or '.', starting and ending alphanumeric",
        );
    }
    Ok(value.to_string())
}

/// Kubernetes label-value syntax (also the name part of a key).
pub(crate) fn is_label_value(v: &str) -> bool {
    let alnum = |c: &char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= 63
            && v.chars().next().as_ref().is_some_and(alnum)
            && v.chars().last().as_ref().is_some_and(alnum)
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

/// Whether `key` is a valid label key (used for `roleLabel` and `modelLabel`).
pub(crate) fn is_label_key(key: &str) -> bool {
    key_of(key).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_round_trip_through_kube() {
        for (input, shown) in [
            ("app=vllm", "app=vllm"),
            ("app==vllm, tier!=x", "app=vllm,tier!=x"),
            ("app in (a, b),!canary", "app in (a,b),!canary"),
            ("env notin (dev),gpu", "env notin (dev),gpu"),
            ("example.com/role=decode", "example.com/role=decode"),
            ("app=", "app="),
        ] {
            assert_eq!(parse_selector(input).unwrap().to_string(), shown, "{input}");
        }
    }

    #[test]
    fn bad_selectors_name_the_requirement() {
        assert_eq!(parse_selector(" "), Err(TargetError::EmptySelector));
        for (input, requirement) in [
            ("app=vllm,", ""),
            ("app=-x", "app=-x"),
            ("app in a,b", "app in a"),
            ("Bad_Prefix/x=1", "Bad_Prefix/x=1"),
            ("a b=c", "a b=c"),
        ] {
            match parse_selector(input) {
                Err(TargetError::Selector { requirement: r, .. }) => {
                    assert_eq!(r, requirement, "{input}")
                }
                other => panic!("{input}: {other:?}"),
            }
        }
    }

    #[test]
    fn ports_are_checked() {
        let s = parse_selector("app=x").unwrap();
        assert_eq!(
            Target::new(s.clone(), &[8000, 8001]).unwrap().ports,
            [8000, 8001]
        );
        assert_eq!(Target::new(s.clone(), &[]), Err(TargetError::NoPorts));
        assert_eq!(Target::new(s.clone(), &[0]), Err(TargetError::Port(0)));
        assert_eq!(
            Target::new(s.clone(), &[70000]),
            Err(TargetError::Port(70000))
        );
        assert_eq!(
            Target::new(s, &[80, 80]),
            Err(TargetError::DuplicatePort(80))
        );
    }

    #[test]
    fn match_labels_become_an_equality_selector() {
        let labels = BTreeMap::from([("app".into(), "vllm".into()), ("pool".into(), "a".into())]);
        assert_eq!(
            Target::match_labels(&labels).unwrap().to_string(),
            "app=vllm,pool=a"
        );
    }
}
