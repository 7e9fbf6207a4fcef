//! The families a scrape reads, cut out of an exposition before it is parsed: an engine's
//! `/metrics` holds dozens of families (vLLM's histograms of request sizes and times, Python's
//! process and GC metrics) of which the picker reads a handful, and parsing every sample of the
//! rest cost more than the read itself.
//!
//! One pass over the lines keeps a line when its metric name (a sample's name, or the name a
//! `# HELP` / `# TYPE` line describes) is a wanted family's, or one with a sample suffix
//! (`_bucket`, `_sum`, `_count`, `_total`, `_created`); it drops a `# HELP` or `# TYPE` line
//! and a well-formed sample line (`name`, optional `{labels}` with quoted values, a value, an
//! optional integer timestamp) of any other family. Any other line is kept, so the parser
//! still refuses what it refused before (a garbled line of an unread family included). The
//! kept lines stay in order: the parser sees each wanted family exactly as it was exposed, so
//! what is read from it is unchanged (`super::parse_whole_with` is the reference, and the tests
//! compare the two).

/// Sample-name suffixes of a family's samples (histograms, summaries, counters).
const SUFFIXES: [&str; 5] = ["_bucket", "_sum", "_count", "_total", "_created"];

/// The family names to keep.
#[derive(Debug, Clone, Default)]
pub struct Wanted<'a>(Vec<&'a str>);

impl<'a> Wanted<'a> {
    pub fn new(names: impl IntoIterator<Item = &'a str>) -> Wanted<'a> {
        let mut v: Vec<&str> = names.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        Wanted(v)
    }

    /// Whether a line naming `name` belongs to a wanted family.
    fn wants(&self, name: &str) -> bool {
        self.0.contains(&name)
            || SUFFIXES.iter().any(|s| {
                name.strip_suffix(s)
                    .is_some_and(|base| self.0.contains(&base))
            })
    }

    /// The lines of `text` this filter keeps, in order, each ended by a newline.
    pub fn keep(&self, text: &str) -> String {
        let mut kept = String::new();
        for line in text.lines() {
            if self.keeps(line) {
                kept.push_str(line);
                kept.push('\n');
            }
        }
        kept
    }

    fn keeps(&self, line: &str) -> bool {
        match described(line).or_else(|| sample_name(line)) {
            Some(name) => self.wants(name),
            None => true,
        }
    }
}

/// The family a `# HELP name ...` or `# TYPE name ...` line describes.
fn described(line: &str) -> Option<&str> {
    let rest = line.strip_prefix('#')?.trim_start();
    let rest = rest
        .strip_prefix("HELP")
        .or_else(|| rest.strip_prefix("TYPE"))?;
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let name = rest.split_whitespace().next()?;
    is_metric_name(name).then_some(name)
}

/// The metric name of a well-formed sample line; `None` for anything else (kept for the
/// parser to judge).
fn sample_name(line: &str) -> Option<&str> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let (name, rest) = line.split_at(end);
    if !is_metric_name(name) {
        return None;
    }
    let rest = match rest.strip_prefix('{') {
        Some(labels) => after_labels(labels)?,
        None => rest,
    };
    let mut fields = rest.split_whitespace();
    fields.next()?.parse::<f64>().ok()?;
    if let Some(timestamp) = fields.next() {
        timestamp.parse::<i64>().ok()?;
    }
    (fields.next().is_none() && rest.starts_with([' ', '\t'])).then_some(name)
}

/// What follows a label set's closing `}` (`labels` starts after its `{`); `None` when it does
/// not close.
fn after_labels(labels: &str) -> Option<&str> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(&labels[i + 1..]),
            _ => {}
        }
    }
    None
}

fn is_metric_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_wanted_families_with_their_sample_suffixes() {
        let wanted = Wanted::new(["vllm:time_to_first_token_seconds", "up"]);
        let text = "# HELP vllm:time_to_first_token_seconds Time\n\
            # TYPE vllm:time_to_first_token_seconds histogram\n\
            vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4\n\
            vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.8\n\
            # TYPE vllm:e2e_request_latency_seconds histogram\n\
            vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"a}b \\\" c\"} 4\n\
            vllm:e2e_request_latency_seconds_count 4 1712345678000\n\
            # a comment\n\
            up 1\n\
            upstream 1\n";
        assert_eq!(
            wanted.keep(text),
            "# HELP vllm:time_to_first_token_seconds Time\n\
             # TYPE vllm:time_to_first_token_seconds histogram\n\
             vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4\n\
             vllm:time_to_first_token_seconds_sum{model_name=\"m\"} 0.8\n\
             # a comment\n\
             up 1\n"
        );
    }

    #[test]
    fn a_line_that_is_not_a_well_formed_sample_is_kept_for_the_parser() {
        let wanted = Wanted::new(["up"]);
        for line in [
            "this is { not metrics",
            "other{a=\"unclosed} 1",
            "other 1 2 3",
            "other one",
            "other 1 1.5",
            "other{a=\"b\"}1",
            "9lives 1",
        ] {
            assert_eq!(wanted.keep(line), format!("{line}\n"), "{line}");
        }
        for line in [
            "other 1",
            "other{a=\"b\"} NaN",
            "other +Inf 17",
            "other_total 2e3",
        ] {
            assert_eq!(wanted.keep(line), "", "{line}");
        }
    }
}
