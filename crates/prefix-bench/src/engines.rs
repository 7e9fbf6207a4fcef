//! The model-sims a suite row runs on: [`SIMS`] of them, their arguments ([`sim_args`], and the
//! [`EngineProfile`]'s), which of them run without prefix caching, whether they publish KV
//! events (and so can be restarted mid-run, [`restarts_mid_run`]) and on which topic.

use testkit::{Process, bin_dir};

use super::driver;
use super::picker_config;
use super::workload;

/// Engines per row.
pub const SIMS: usize = 4;
/// Simulated engines: 7-8B on one H100, `kv_blocks` of cache, 10x faster.
pub fn sim_args(kv_blocks: usize, max_num_seqs: usize) -> Vec<String> {
    let (kv, seqs) = (kv_blocks.to_string(), max_num_seqs.to_string());
    [
        "--time-scale",
        "10",
        "--kv-blocks",
        kv.as_str(),
        "--max-num-seqs",
        seqs.as_str(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The engines a suite runs on (`suite --engine-profile`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum EngineProfile {
    /// model-sim's defaults: the router's ChatML rendering, ~4.1 bytes per token, only
    /// `--max-num-seqs` limits running requests, each workload's own cache size (every result
    /// so far).
    #[default]
    Default,
    /// An engine the router was not tuned on, under KV pressure: vLLM's KV-capacity admission
    /// and preemption (`--kv-admission vllm`), Llama 3's chat template (`--chat-template
    /// llama3`), the dense tokenizer (`--tokenizer dense`, ~3.2 bytes per token), and a cache
    /// that holds a few of the workload's longest requests ([`kv_pressure_blocks`];
    /// [`KV_PRESSURE_PROMPTS`] unless `suite --kv-pressure-prompts` says).
    KvPressure,
}

/// The longest requests (prompt and output) a `kv-pressure` engine's cache holds at once, by
/// default.
pub const KV_PRESSURE_PROMPTS: usize = 3;

impl EngineProfile {
    /// The profile's model-sim arguments, after [`sim_args`].
    pub fn sim_args(self) -> Vec<String> {
        match self {
            EngineProfile::Default => Vec::new(),
            EngineProfile::KvPressure => [
                "--kv-admission",
                "vllm",
                "--chat-template",
                "llama3",
                "--tokenizer",
                "dense",
            ]
            .map(String::from)
            .to_vec(),
        }
    }

    /// The cache size (blocks of `block_tokens`) of a sim running `requests`, whose own size is
    /// `workload_blocks`; a `kv-pressure` cache holds `prompts` of the longest requests.
    pub fn kv_blocks(
        self,
        workload_blocks: usize,
        requests: &[workload::BenchRequest],
        block_tokens: usize,
        prompts: usize,
    ) -> usize {
        match self {
            EngineProfile::Default => workload_blocks,
            EngineProfile::KvPressure => kv_pressure_blocks(requests, block_tokens, prompts),
        }
    }

    /// Whether the engines run model-sim's defaults (the router's template and tokenizer).
    pub fn is_default(&self) -> bool {
        *self == EngineProfile::Default
    }

    /// Its `--engine-profile` value.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineProfile::Default => "default",
            EngineProfile::KvPressure => "kv-pressure",
        }
    }
}

/// A request's tokens on a `kv-pressure` engine: its prompt as Llama 3 renders it, in the
/// dense tokenizer's tokens, plus its `max_tokens`.
fn kv_pressure_tokens(r: &workload::BenchRequest) -> usize {
    use model_sim::template::ChatTemplate;
    let body = serde_json::to_vec(&r.body).expect("a JSON value serializes");
    let router = prefix_picker::request::InferenceRequest::parse(&body)
        .map(|p| p.prompt)
        .unwrap_or(Err(prefix_picker::prompt::NoPrompt::NoPromptField));
    let prompt = ChatTemplate::Llama3
        .prompt(&r.body, router)
        .unwrap_or_default();
    let output = r.body.get("max_tokens").and_then(serde_json::Value::as_u64);
    model_sim::tokenizer::SimTokenizer::Dense
        .ids(prompt.as_bytes())
        .len()
        + output.unwrap_or(16) as usize
}

/// A `kv-pressure` cache: the blocks of the workload's `prompts` longest requests (prompt and
/// output) on that engine, so that a few running long prompts fill it.
pub fn kv_pressure_blocks(
    requests: &[workload::BenchRequest],
    block_tokens: usize,
    prompts: usize,
) -> usize {
    let mut tokens: Vec<usize> = requests.iter().map(kv_pressure_tokens).collect();
    tokens.sort_unstable_by(|a, b| b.cmp(a));
    tokens
        .iter()
        .take(prompts.max(1))
        .map(|t| t.div_ceil(block_tokens.max(1)))
        .sum::<usize>()
        .max(1)
}

/// The engines of a row.
pub struct EnginePlan {
    /// Every sim's arguments ([`sim_args`]).
    pub args: Vec<String>,
    /// Sims (by index) that run with `--no-enable-prefix-caching`.
    pub caching_off: Vec<usize>,
    /// Sims that publish KV events and can be restarted ([`testkit::Sim`]).
    pub kv_events: bool,
    /// The topic they publish on (`""`: vLLM's default).
    pub topic: String,
    /// The model the workload's requests name (the kvcache-aware row's relays write it).
    pub model: String,
    /// The `picker.flowControl` mapping the prefix-picker rows run with (the workload's).
    pub flow_control: Option<String>,
}

impl EnginePlan {
    /// `SIMS` sims with `args`, no events.
    pub fn plain(args: &[String]) -> EnginePlan {
        EnginePlan {
            args: args.to_vec(),
            caching_off: Vec::new(),
            kv_events: false,
            topic: String::new(),
            model: "model".into(),
            flow_control: None,
        }
    }

    /// Sim `i`'s own arguments (after the common ones).
    pub fn extra(&self, i: usize) -> Vec<String> {
        if self.caching_off.contains(&i) {
            vec!["--no-enable-prefix-caching".to_string()]
        } else {
            Vec::new()
        }
    }

    /// Starts the sims `sim-0..SIMS`, each seeded with its number.
    pub fn start(&self) -> anyhow::Result<Sims> {
        let bin = bin_dir().join("model-sim");
        if self.kv_events {
            return Ok(Sims::Publishing(testkit::Sim::start_n_on_topic(
                &bin,
                SIMS,
                &self.args,
                |i| self.extra(i),
                &self.topic,
            )?));
        }
        let sims = (0..SIMS)
            .map(|i| {
                let mut args = self.args.clone();
                args.extend(["--seed".to_string(), i.to_string()]);
                args.extend(self.extra(i));
                testkit::start_sim(&bin, &format!("sim-{i}"), &args)
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Sims::Plain(sims))
    }
}

/// A row's running sims.
pub enum Sims {
    Plain(Vec<Process>),
    /// Publishing KV events, restartable.
    Publishing(Vec<testkit::Sim>),
}

impl Sims {
    /// The static endpoints `sim-0..` of a picker config.
    pub fn pods(&self) -> Vec<picker_config::Pod> {
        match self {
            Sims::Plain(sims) => sims
                .iter()
                .enumerate()
                .map(|(i, s)| picker_config::Pod {
                    name: format!("sim-{i}"),
                    addr: s.addr,
                    kv_events: None,
                })
                .collect(),
            Sims::Publishing(sims) => sims
                .iter()
                .map(|s| picker_config::Pod {
                    name: s.name().to_string(),
                    addr: s.addr(),
                    kv_events: Some(s.kv_events()),
                })
                .collect(),
        }
    }
}

/// The driver's mid-run actions for `schedule`: restart sim `engine` after `after` requests
/// (none when the schedule is empty). Restarting needs sims that publish KV events
/// ([`testkit::Sim`]).
pub fn restarts_mid_run(
    sims: &mut Sims,
    schedule: Vec<workload::Restart>,
) -> Option<driver::MidRun<'_>> {
    if schedule.is_empty() {
        return None;
    }
    let Sims::Publishing(sims) = sims else {
        eprintln!("  restarts need restartable sims: none done");
        return None;
    };
    let after = schedule.iter().map(|r| r.after).collect();
    Some(driver::MidRun {
        after,
        act: Box::new(move |i| {
            let Some(sim) = schedule.get(i).and_then(|r| sims.get_mut(r.engine)) else {
                return Ok(());
            };
            let t = std::time::Instant::now();
            sim.restart()?;
            eprint!(
                " [{} restarted in {} ms] ",
                sim.name(),
                t.elapsed().as_millis()
            );
            Ok(())
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::CACHING_OFF_POD;

    #[test]
    fn the_default_profile_adds_no_argument_and_kv_pressure_asks_for_another_engine() {
        assert!(EngineProfile::default().sim_args().is_empty());
        assert_eq!(
            EngineProfile::KvPressure.sim_args(),
            [
                "--kv-admission",
                "vllm",
                "--chat-template",
                "llama3",
                "--tokenizer",
                "dense"
            ]
        );
    }

    /// The kv-pressure cache holds the three longest requests of the workload, as that engine
    /// tokenizes them; the default keeps the workload's own size.
    #[test]
    fn a_kv_pressure_cache_holds_three_of_the_longest_requests() {
        let requests = workload::multi_tenant(4, 12, 1536, 64, 16, 1.0, 1, "m");
        let blocks = kv_pressure_blocks(&requests, 16, KV_PRESSURE_PROMPTS);
        let mut tokens: Vec<usize> = requests.iter().map(kv_pressure_tokens).collect();
        tokens.sort_unstable();
        let top: usize = tokens.iter().rev().take(3).map(|t| t.div_ceil(16)).sum();
        assert_eq!(blocks, top);
        let longest = tokens[tokens.len() - 1];
        // ~6 KB of system prompt at ~3.2 bytes per token: well over the default's 1536 tokens.
        assert!(longest > 1900, "{longest}");
        assert_eq!(EngineProfile::Default.kv_blocks(448, &requests, 16, 3), 448);
        assert_eq!(
            EngineProfile::KvPressure.kv_blocks(448, &requests, 16, 3),
            blocks
        );
    }

    #[test]
    fn only_the_caching_off_pod_gets_the_flag() {
        let plan = EnginePlan {
            args: sim_args(1024, 8),
            caching_off: vec![CACHING_OFF_POD],
            kv_events: false,
            topic: String::new(),
            model: "model".into(),
            flow_control: None,
        };
        for i in 0..SIMS {
            assert_eq!(
                plan.extra(i),
                if i == CACHING_OFF_POD {
                    vec!["--no-enable-prefix-caching".to_string()]
                } else {
                    Vec::new()
                }
            );
        }
    }
}
