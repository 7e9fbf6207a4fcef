//! What the benchmark reads from the processes it runs: the picker's decisions by reason, the
//! engines' KV admission (under vLLM's), and CPU time. Starting them is [`testkit`]'s.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// The latency model's learned values in a picker's `/metrics` (concurrency and service time
/// per pod, seconds per prefilled token), as one line for the run's log; empty without them.
pub async fn latency_model(admin: SocketAddr) -> String {
    let url = format!("http://{admin}/metrics");
    let Ok(r) = reqwest::Client::new().get(url).send().await else {
        return String::new();
    };
    latency_model_line(&r.text().await.unwrap_or_default())
}

/// How the run's log shows a learned value, given its pod (`?` without one) and its value.
type Show = fn(&str, f64) -> String;

/// The learned values: each sample's name (up to its labels) and how the log shows it.
const LEARNED: [(&str, Show); 4] = [
    ("prefix_picker_pod_concurrency{", |pod, v| {
        format!("{pod} runs {v:.1}")
    }),
    ("prefix_picker_pod_kv_capacity_blocks{", |pod, v| {
        format!("{pod} holds {v:.0} blocks")
    }),
    ("prefix_picker_pod_service_seconds{", |pod, v| {
        format!("{pod} serves in {:.0} ms", v * 1e3)
    }),
    ("prefix_picker_prefill_seconds_per_token ", |_, v| {
        format!("prefill {:.1} us/token", v * 1e6)
    }),
];

/// [`latency_model`]'s line for a Prometheus text exposition.
fn latency_model_line(text: &str) -> String {
    text.lines()
        .filter_map(|line| {
            let (_, show) = LEARNED.iter().find(|(name, _)| line.starts_with(name))?;
            let pod = line
                .split("model_server_pod=\"")
                .nth(1)
                .and_then(|r| r.split('"').next());
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            Some(show(pod.unwrap_or("?"), value.unwrap_or(0.0)))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `prefix_picker_decisions_total` by reason, summed over pickers' admin endpoints (a picker
/// that does not answer counts nothing).
pub async fn decision_reasons(admins: &[SocketAddr]) -> BTreeMap<String, f64> {
    labelled_counts(admins, DECISIONS).await
}

/// A labelled counter family of the picker's exposition: its name and its one label.
#[derive(Debug, Clone, Copy)]
pub struct Counter {
    pub name: &'static str,
    pub label: &'static str,
}

/// Routing decisions by reason.
pub const DECISIONS: Counter = Counter {
    name: "prefix_picker_decisions_total",
    label: "reason",
};
/// Affinity-mode decisions by where the picked pod's match came from (engine, estimate, both).
pub const MATCH_SOURCES: Counter = Counter {
    name: "prefix_picker_match_source_total",
    label: "source",
};
/// Requests to pods with engine views, by how their engine tokens were found.
pub const ENGINE_TOKENS: Counter = Counter {
    name: "prefix_picker_engine_tokens_total",
    label: "outcome",
};

/// `counter`'s samples by label value, summed over pickers' admin endpoints (a picker that
/// does not answer counts nothing).
pub async fn labelled_counts(admins: &[SocketAddr], counter: Counter) -> BTreeMap<String, f64> {
    let client = reqwest::Client::new();
    let mut sums = BTreeMap::new();
    for admin in admins {
        let Ok(r) = client.get(format!("http://{admin}/metrics")).send().await else {
            continue;
        };
        let text = r.text().await.unwrap_or_default();
        for (value, n) in parse_labelled(&text, counter) {
            *sums.entry(value).or_insert(0.0) += n;
        }
    }
    sums
}

/// The `prefix_picker_decisions_total{reason}` samples of a Prometheus text exposition.
pub fn parse_decision_reasons(text: &str) -> Vec<(String, f64)> {
    parse_labelled(text, DECISIONS)
}

/// `counter`'s samples (`name{label="value"} n`) of a Prometheus text exposition.
pub fn parse_labelled(text: &str, counter: Counter) -> Vec<(String, f64)> {
    let prefix = format!("{}{{{}=\"", counter.name, counter.label);
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix.as_str())?;
            let (value, n) = rest.split_once("\"} ")?;
            Some((value.to_string(), n.trim().parse().ok()?))
        })
        .collect()
}

/// What vLLM admission did on the engines (`model-sim --kv-admission vllm`), summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KvAdmission {
    pub preemptions: f64,
    /// Requests that waited at the head of a queue for KV space.
    pub kv_waits: f64,
    /// ... for a running slot (`--max-num-seqs`).
    pub slot_waits: f64,
}

impl KvAdmission {
    /// Adds the samples of one engine's Prometheus text exposition.
    pub fn add(&mut self, text: &str) {
        for (name, value) in samples(text) {
            match name {
                "vllm:num_preemptions_total" => self.preemptions += value,
                "model_sim_admission_waits_total{cause=\"kv_cache\"}" => self.kv_waits += value,
                "model_sim_admission_waits_total{cause=\"max_num_seqs\"}" => {
                    self.slot_waits += value
                }
                _ => {}
            }
        }
    }

    /// The engines at `sims` (base URLs), since they started; an engine that does not answer
    /// counts nothing.
    pub async fn read(sims: &[String]) -> KvAdmission {
        sum_engines(sims, KvAdmission::add).await
    }
}

impl std::fmt::Display for KvAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} preemptions, {} requests waited for KV space, {} for a slot",
            self.preemptions, self.kv_waits, self.slot_waits
        )
    }
}

/// What a router's tokenizer calls cost the engines (`model_sim_tokenize_requests_total`,
/// `model_sim_tokenize_tokens_total`), summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenizeWork {
    pub calls: f64,
    pub tokens: f64,
}

impl TokenizeWork {
    /// Adds the samples of one engine's Prometheus text exposition.
    pub fn add(&mut self, text: &str) {
        for (name, value) in samples(text) {
            match name {
                "model_sim_tokenize_requests_total" => self.calls += value,
                "model_sim_tokenize_tokens_total" => self.tokens += value,
                _ => {}
            }
        }
    }

    /// The engines at `sims` (base URLs); an engine that does not answer counts nothing.
    pub async fn read(sims: &[String]) -> TokenizeWork {
        sum_engines(sims, TokenizeWork::add).await
    }

    /// Adds the samples of a picker's exposition: its in-process tokenizations (the `file`
    /// source; an engine source's calls are the engines' work, counted there), the tokens it
    /// computed (`prefix_picker_tokenized_tokens_total`) and the heads tokenized.
    pub fn add_picker(&mut self, text: &str) {
        for (name, value) in samples(text) {
            match name {
                "prefix_picker_tokenize_calls_total{result=\"ok\"}" => self.calls += value,
                "prefix_picker_tokenized_tokens_total" => self.tokens += value,
                _ => {}
            }
        }
    }

    /// The picker at `admin` ([`TokenizeWork::add_picker`]); nothing when it does not answer.
    pub async fn read_picker(admin: SocketAddr) -> TokenizeWork {
        let mut work = TokenizeWork::default();
        if let Ok(r) = reqwest::Client::new()
            .get(format!("http://{admin}/metrics"))
            .send()
            .await
        {
            work.add_picker(&r.text().await.unwrap_or_default());
        }
        work
    }

    /// What was done since `before` (an engine restarted since counts from 0: never below 0).
    pub fn since(self, before: TokenizeWork) -> TokenizeWork {
        TokenizeWork {
            calls: (self.calls - before.calls).max(0.0),
            tokens: (self.tokens - before.tokens).max(0.0),
        }
    }
}

/// Each `name value` sample of a Prometheus text exposition (an unparsable value reads 0).
fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        Some((name, value.parse().unwrap_or(0.0)))
    })
}

/// `add` over the `/metrics` of the engines at `sims` (base URLs), from a default; an engine
/// that does not answer adds nothing.
async fn sum_engines<T: Default>(sims: &[String], add: fn(&mut T, &str)) -> T {
    let client = reqwest::Client::new();
    let mut sum = T::default();
    for s in sims {
        if let Ok(r) = client.get(format!("{s}/metrics")).send().await {
            add(&mut sum, &r.text().await.unwrap_or_default());
        }
    }
    sum
}

/// `utime + stime` of a process, in seconds (Linux `/proc/<pid>/stat`, 100 ticks/s).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_model_line_shows_each_learned_value_in_order() {
        let text = "# HELP prefix_picker_pod_concurrency Learned concurrency\n\
            prefix_picker_pod_concurrency{model_server_pod=\"sim-0\"} 3.24\n\
            prefix_picker_pod_service_seconds{model_server_pod=\"sim-0\"} 0.0421\n\
            prefix_picker_pod_kv_capacity_blocks{model_server_pod=\"sim-1\"} 140.4\n\
            prefix_picker_pod_concurrency_other 7\n\
            prefix_picker_prefill_seconds_per_token 0.0000123\n";
        assert_eq!(
            latency_model_line(text),
            "sim-0 runs 3.2, sim-0 serves in 42 ms, sim-1 holds 140 blocks, prefill 12.3 us/token"
        );
        assert_eq!(latency_model_line("prefix_picker_decisions_total 1\n"), "");
    }

    #[test]
    fn tokenize_work_sums_the_engines_series_and_counts_a_restarted_one_from_zero() {
        let mut before = TokenizeWork::default();
        before.add("model_sim_tokenize_requests_total 2\nmodel_sim_tokenize_tokens_total 300\n");
        let mut after = TokenizeWork::default();
        after.add("model_sim_tokenize_requests_total 5\nmodel_sim_tokenize_tokens_total 900\n");
        after.add("model_sim_tokenize_requests_total 1\nmodel_sim_tokenize_tokens_total 50\n");
        assert_eq!(
            after.since(before),
            TokenizeWork {
                calls: 4.0,
                tokens: 650.0
            }
        );
        assert_eq!(before.since(after), TokenizeWork::default());
        let mut picker = TokenizeWork::default();
        picker.add_picker(
            "prefix_picker_tokenize_calls_total{result=\"ok\"} 3\nprefix_picker_tokenize_calls_total{result=\"template\"} 9\nprefix_picker_tokenized_tokens_total 120\n",
        );
        assert_eq!(
            picker,
            TokenizeWork {
                calls: 3.0,
                tokens: 120.0
            }
        );
    }

    #[test]
    fn kv_admission_sums_the_engines_series() {
        let text = "vllm:num_preemptions_total 3\n\
            model_sim_admission_waits_total{cause=\"kv_cache\"} 7\n\
            model_sim_admission_waits_total{cause=\"max_num_seqs\"} 2\n\
            vllm:num_requests_waiting 1\n";
        let mut sum = KvAdmission::default();
        sum.add(text);
        sum.add("vllm:num_preemptions_total 1\n");
        assert_eq!(
            sum.to_string(),
            "4 preemptions, 7 requests waited for KV space, 2 for a slot"
        );
    }

    #[test]
    fn decision_reasons_are_read_from_the_exposition() {
        let text = "# HELP prefix_picker_decisions_total Routing decisions\n\
            # TYPE prefix_picker_decisions_total counter\n\
            prefix_picker_decisions_total{reason=\"prefix_hit\"} 12\n\
            prefix_picker_decisions_total{reason=\"prefix_overruled\"} 3\n\
            prefix_picker_decision_duration_seconds_count 15\n";
        assert_eq!(
            parse_decision_reasons(text),
            [
                ("prefix_hit".to_string(), 12.0),
                ("prefix_overruled".to_string(), 3.0)
            ]
        );
    }
}
