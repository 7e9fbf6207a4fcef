//! The suite's workloads (`prefix-bench suite`, `--quick` for the small ones): each a
//! [`WorkloadSpec`] with its `--workloads` key, its report name, its requests
//! ([`workload`]), how they arrive, and the engines it runs on (KV cache blocks, running
//! requests, sims without prefix caching, restarts mid-run). The `trace` workload replays a
//! Mooncake trace file and is skipped, with the reason, when the file is missing.

use std::path::PathBuf;

use anyhow::Context;
use prefix_picker::request::Api;

use super::driver::Arrival;
use super::engines::SIMS;
use super::project::root;
use super::suite_results::Skipped;
use super::workload::{self, AgentScript, BenchRequest};

/// One workload of the suite: its requests, how they arrive, and the engines it runs on.
pub struct WorkloadSpec {
    /// Short name for `--workloads`.
    pub key: &'static str,
    pub name: &'static str,
    pub requests: Vec<BenchRequest>,
    pub arrival: Arrival,
    /// KV cache blocks per sim (the shared-prefix workloads use a small cache for pressure).
    pub kv_blocks: usize,
    /// Running requests per sim before requests queue.
    pub max_num_seqs: usize,
    /// Sims (by index) that run with `--no-enable-prefix-caching`.
    pub caching_off: Vec<usize>,
    /// Every engine restarts once mid-run ([`workload::restarts`]).
    pub restarts: bool,
    /// The picker behind Envoy restarts once, after half the requests.
    pub picker_restart: bool,
    /// The `picker.flowControl` mapping (flow-style YAML) the prefix-picker rows run with
    /// (`None`: the shipped default), e.g. the objectives' priorities a workload names.
    pub flow_control: Option<&'static str>,
}

impl WorkloadSpec {
    pub fn new(
        key: &'static str,
        name: &'static str,
        requests: Vec<BenchRequest>,
        arrival: Arrival,
        kv_blocks: usize,
    ) -> WorkloadSpec {
        WorkloadSpec {
            key,
            name,
            requests,
            arrival,
            kv_blocks,
            max_num_seqs: 64,
            caching_off: Vec::new(),
            restarts: false,
            picker_restart: false,
            flow_control: None,
        }
    }

    /// The prefix-picker rows run with this `picker.flowControl` mapping (flow-style YAML).
    pub fn flow_control(mut self, mapping: &'static str) -> WorkloadSpec {
        self.flow_control = Some(mapping);
        self
    }

    pub fn max_num_seqs(mut self, n: usize) -> WorkloadSpec {
        self.max_num_seqs = n;
        self
    }

    /// Sim `pod` runs with `--no-enable-prefix-caching`.
    pub fn caching_off(mut self, pod: usize) -> WorkloadSpec {
        self.caching_off.push(pod);
        self
    }

    /// Every engine restarts once, one at a time, mid-run.
    pub fn with_restarts(mut self) -> WorkloadSpec {
        self.restarts = true;
        self
    }

    /// The picker behind Envoy restarts once, after half the requests (the engines stay warm).
    pub fn with_picker_restart(mut self) -> WorkloadSpec {
        self.picker_restart = true;
        self
    }

    /// After how many requests the picker restarts (`None` unless
    /// [`WorkloadSpec::with_picker_restart`]).
    pub fn picker_restart_after(&self) -> Option<usize> {
        self.picker_restart.then_some(self.requests.len() / 2)
    }

    /// The restarts of a run of this workload (none unless [`WorkloadSpec::with_restarts`]).
    pub fn restart_schedule(&self) -> Vec<workload::Restart> {
        if self.restarts {
            workload::restarts(self.requests.len(), SIMS)
        } else {
            Vec::new()
        }
    }

    /// Selected by `--workloads` (nothing given = all): an entry equal to its key, or a prefix
    /// of its name ([`select`] keeps a workload's key from selecting others by name).
    pub fn selected(&self, filter: &[String]) -> bool {
        filter.is_empty()
            || filter
                .iter()
                .any(|f| f == self.key || self.name.starts_with(f.as_str()))
    }

    /// Whether its requests go to Anthropic's `/v1/messages` (a router must route that path).
    pub fn speaks_messages(&self) -> bool {
        self.requests
            .iter()
            .any(|r| Api::from_path(r.path) == Some(Api::Messages))
    }
}

/// The workloads of `all` that `--workloads` `filter` selects (all when empty): an entry that is
/// a workload's key selects that workload alone (`agent` is not `agent-messages`, whose name
/// starts with it), any other entry every workload whose name starts with it.
pub fn select(all: Vec<WorkloadSpec>, filter: &[String]) -> Vec<WorkloadSpec> {
    let keys: Vec<&'static str> = all.iter().map(|w| w.key).collect();
    all.into_iter()
        .filter(|w| {
            filter.is_empty()
                || filter.iter().any(|f| {
                    f.as_str() == w.key
                        || (!keys.contains(&f.as_str()) && w.name.starts_with(f.as_str()))
                })
        })
        .collect()
}

/// Multi-tenant system prompts, tokens (~6 KB): the engines' caches hold about a quarter of the
/// 16 tenants' prompts (4 x 96 blocks of 16 tokens, plus 64 blocks for running requests).
pub const TENANT_SYSTEM_TOKENS: usize = 1536;
pub const TENANT_KV_BLOCKS: usize = 4 * TENANT_SYSTEM_TOKENS / 16 + 64;

/// The `trace` workload's file when `--trace` names none.
pub fn default_trace() -> PathBuf {
    root().join("../shared/data/mooncake/synthetic_trace.jsonl")
}

/// Why the `trace` workload cannot run, when its file is missing.
fn trace_missing(path: &std::path::Path) -> Skipped {
    Skipped {
        workload: "trace".into(),
        reason: format!(
            "the trace file {} is missing: get `synthetic_trace.jsonl` from Mooncake's \
             `FAST25-release/traces/` (https://github.com/kvcache-ai/Mooncake, Apache-2.0) and put \
             it there, or name it with `--trace FILE`",
            path.display()
        ),
    }
}

/// The workloads (`--quick`: the small ones), and those skipped for a missing input.
pub fn workloads(
    quick: bool,
    seed: u64,
    trace_path: &std::path::Path,
) -> anyhow::Result<(Vec<WorkloadSpec>, Vec<Skipped>)> {
    let mut w = if quick {
        quick_catalogue(seed)
    } else {
        full_catalogue(seed)
    };
    let mut skipped = Vec::new();
    if trace_path.exists() {
        w.push(trace_workload(quick, trace_path)?);
    } else {
        skipped.push(trace_missing(trace_path));
    }
    Ok((w, skipped))
}

/// The `--quick` catalogue, in report order. A table: each workload's parameters read best
/// side by side with the others'.
fn quick_catalogue(seed: u64) -> Vec<WorkloadSpec> {
    let m = "model";
    let agent_script = AgentScript::new(8, 4, 10 * 1024, 64, 128, 16, seed);
    vec![
        WorkloadSpec::new(
            "shared-prefix",
            "shared-prefix (16 groups x 8, system 1024 tok, question 64, out 32)",
            workload::shared_prefix(16, 8, 1024, 64, 32, seed, m),
            Arrival::Closed { concurrency: 8 },
            4096,
        ),
        WorkloadSpec::new(
            "multi-turn",
            "multi-turn (16 conversations x 4 turns, user 128 tok, out 64)",
            workload::multi_turn(16, 4, 256, 128, 64, seed, m),
            Arrival::Closed { concurrency: 8 },
            4096,
        ),
        WorkloadSpec::new(
            "burst",
            "burst (8 new prefixes x 8 at once, 1024 tok)",
            workload::burst(8, 8, 1024, 16, seed, m),
            Arrival::Closed { concurrency: 1 },
            4096,
        ),
        WorkloadSpec::new(
            "multi-tenant",
            "multi-tenant (16 tenants x 6 KB system, Zipf 1, 48 sessions of 1-3 turns, out 16; caches hold ~4 tenants)",
            workload::multi_tenant(16, 48, TENANT_SYSTEM_TOKENS, 64, 16, 1.0, seed, m),
            Arrival::Closed { concurrency: 8 },
            TENANT_KV_BLOCKS,
        ),
        WorkloadSpec::new(
            "agent",
            "agent (8 sessions x 4 turns, shared 10 KB tool preamble, steps ~128 tok, out 16)",
            workload::agent_sessions(8, 4, 10 * 1024, 64, 128, 16, seed, m),
            Arrival::Closed { concurrency: 4 },
            2048,
        ),
        WorkloadSpec::new(
            "agent-messages",
            "agent-messages (agent's words with 4 tools as Anthropic Messages, /v1/messages: 8 sessions x 4 turns of tool_use and tool_result, out 16)",
            workload::agent_messages(&agent_script, m),
            Arrival::Closed { concurrency: 4 },
            2048,
        ),
        WorkloadSpec::new(
            "agent-chat",
            "agent-chat (agent-messages as chat completions: tool_calls and tool messages)",
            workload::agent_chat_tools(&agent_script, m),
            Arrival::Closed { concurrency: 4 },
            2048,
        ),
        WorkloadSpec::new(
            "busy-tenants",
            "busy-tenants (12 tenants x 6 KB system, Zipf 1, 64 sessions of 1-3 turns, out 32; max-num-seqs 4, 24 clients for 16 slots)",
            workload::multi_tenant(12, 64, TENANT_SYSTEM_TOKENS, 64, 32, 1.0, seed, m),
            Arrival::Closed { concurrency: 24 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(4),
        WorkloadSpec::new(
            "hot-prefix",
            "hot-prefix (8 prefixes, 50% on one, 96 requests, system 512 tok, out 16; max-num-seqs 8)",
            workload::hot_prefix(8, 96, 0.5, 512, 64, 16, seed, m),
            Arrival::Closed { concurrency: 12 },
            4096,
        )
        .max_num_seqs(8),
    ]
}

/// The full catalogue, in report order. A table, as [`quick_catalogue`]'s: a function per workload
/// would scatter what a reader compares (sizes, arrivals, caches, engines).
fn full_catalogue(seed: u64) -> Vec<WorkloadSpec> {
    let m = "model";
    // The full multi-tenant and agent workloads, under their own key and name and under those
    // of the engine-truth workloads built on them (the same requests).
    let multi_tenant = |key, name| {
        WorkloadSpec::new(
            key,
            name,
            workload::multi_tenant(16, 192, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
            Arrival::Closed { concurrency: 12 },
            TENANT_KV_BLOCKS,
        )
    };
    let agent = |key, name| {
        WorkloadSpec::new(
            key,
            name,
            workload::agent_sessions(32, 8, 10 * 1024, 128, 512, 48, seed, m),
            Arrival::Closed { concurrency: 16 },
            2048,
        )
    };
    // The agent workload's words with tools, as Anthropic Messages and as chat completions
    // (issue 58): the same engines and arrivals as `agent`.
    let agent_script = AgentScript::new(32, 8, 10 * 1024, 128, 512, 48, seed);
    let agent_shaped = |key, name, requests| {
        WorkloadSpec::new(
            key,
            name,
            requests,
            Arrival::Closed { concurrency: 16 },
            2048,
        )
    };
    // The retrieval workload, under its own key and name and with a pod that never reuses.
    let retrieval = |key, name| {
        WorkloadSpec::new(
            key,
            name,
            workload::retrieval(DOCUMENTS, 320, 256, DOCUMENT_TOKENS, 64, 32, 1.0, seed, m),
            Arrival::Closed { concurrency: 12 },
            DOCUMENT_KV_BLOCKS,
        )
    };
    vec![
        WorkloadSpec::new(
            "sglang-defaults",
            "shared-prefix SGLang defaults (64 groups x 16, system 2048 tok, question 128, out 256)",
            workload::shared_prefix(64, 16, 2048, 128, 256, seed, m),
            Arrival::Closed { concurrency: 32 },
            4096,
        ),
        WorkloadSpec::new(
            "kthena-long",
            "shared-prefix Kthena long system (48 groups x 8, system 4096 tok, question 256, out 128)",
            workload::shared_prefix(48, 8, 4096, 256, 128, seed, m),
            Arrival::Poisson { rate: 40.0, seed },
            // Scaled with the groups (64 groups on 4,096 blocks before), for the same pressure.
            3072,
        ),
        WorkloadSpec::new(
            "kthena-short",
            "shared-prefix Kthena short system (48 groups x 8, system 256 tok, question 4096, out 128)",
            workload::shared_prefix(48, 8, 256, 4096, 128, seed, m),
            Arrival::Poisson { rate: 40.0, seed },
            3072,
        ),
        WorkloadSpec::new(
            "multi-turn",
            "multi-turn (64 conversations x 6 turns, system 512, user 256 tok, out 128)",
            workload::multi_turn(64, 6, 512, 256, 128, seed, m),
            Arrival::Closed { concurrency: 32 },
            4096,
        ),
        WorkloadSpec::new(
            "burst",
            "burst (32 new prefixes x 16 at once, 2048 tok)",
            workload::burst(32, 16, 2048, 32, seed, m),
            Arrival::Closed { concurrency: 2 },
            4096,
        ),
        multi_tenant(
            "multi-tenant",
            "multi-tenant (16 tenants x 6 KB system, Zipf 1, 192 sessions of 1-3 turns, question 128 tok, out 64; caches hold ~4 tenants)",
        ),
        agent(
            "agent",
            "agent (32 sessions x 8 turns, shared 10 KB tool preamble, steps ~512 tok, out 48)",
        ),
        agent_shaped(
            "agent-messages",
            "agent-messages (agent's words with 4 tools as Anthropic Messages, /v1/messages: 32 sessions x 8 turns of tool_use and tool_result, out 48)",
            workload::agent_messages(&agent_script, m),
        ),
        agent_shaped(
            "agent-chat",
            "agent-chat (agent-messages as chat completions: tool_calls and tool messages)",
            workload::agent_chat_tools(&agent_script, m),
        ),
        WorkloadSpec::new(
            "busy-tenants",
            "busy-tenants (12 tenants x 6 KB system, Zipf 1, 256 sessions of 1-3 turns, question 128 tok, out 64; max-num-seqs 4, 24 clients for 16 slots)",
            workload::multi_tenant(12, 256, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, m),
            Arrival::Closed { concurrency: 24 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(4),
        WorkloadSpec::new(
            "ramp",
            "ramp (12 tenants x 6 KB system, Zipf 1, 640 single questions, out 64; open loop 10 -> 130 -> 10 requests/s, ~1.5x the capacity of 4 pods x max-num-seqs 4 at the peak)",
            ramp_requests(640, seed, m),
            Arrival::Trace,
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(4),
        WorkloadSpec::new(
            "hot-prefix",
            "hot-prefix (16 prefixes, 50% on one, 512 requests, system 1024 tok, question 128, out 64; max-num-seqs 8)",
            workload::hot_prefix(16, 512, 0.5, 1024, 128, 64, seed, m),
            Arrival::Closed { concurrency: 24 },
            4096,
        )
        .max_num_seqs(8),
        // Engine truth: what an estimate cannot know. Both the full multi-tenant workload.
        multi_tenant(
            "engine-restarts",
            "engine-restarts (multi-tenant as above; each of the 4 engines restarts once, one at a time, after 1/5, 2/5, 3/5, 4/5 of the requests: killed and started again on the same ports, cache empty)",
        )
        .with_restarts(),
        multi_tenant(
            "caching-off",
            "caching-off (multi-tenant as above; sim-0 runs with --no-enable-prefix-caching: it never reuses its cache)",
        )
        .caching_off(CACHING_OFF_POD),
        // A rollout of the picker: what it knew is gone, the engines are warm.
        agent(
            "picker-restart",
            "picker-restart (agent as above; the picker restarts after half the requests: its index and engine views empty, the engines warm; peer routers, oracles and the kvcache-aware row are not restarted)",
        )
        .with_picker_restart(),
        // Shared prefixes that end inside a message (issue 55): what a router that cuts
        // prompts at message ends cannot see.
        retrieval(
            "retrieval",
            "retrieval (1 KB instruction block, then one of 32 ~6 KB documents inside the user message, Zipf 1, then a question of 64 tok; 320 requests, out 32; caches hold ~6 documents)",
        ),
        retrieval(
            "retrieval-caching-off",
            "retrieval-caching-off (retrieval as above; sim-0 runs with --no-enable-prefix-caching: it never reuses its cache)",
        )
        .caching_off(CACHING_OFF_POD),
        WorkloadSpec::new(
            "completion-doc",
            "completion-doc (/v1/completions: one of 32 ~6 KB document heads, Zipf 1, then a question of 64 tok in the same prompt; 320 requests, out 32; caches hold ~6 documents)",
            workload::completion_doc(DOCUMENTS, 320, DOCUMENT_TOKENS, 64, 32, 1.0, seed, m),
            Arrival::Closed { concurrency: 12 },
            DOCUMENT_KV_BLOCKS,
        ),
        WorkloadSpec::new(
            "few-shot",
            "few-shot (short system, then one last user message: one of 12 ~4 KB few-shot example sets, Zipf 1, then a query of 64 tok; 320 requests, out 32; caches hold ~4 sets)",
            workload::few_shot(12, 320, FEW_SHOT_TOKENS, 64, 32, 1.0, seed, m),
            Arrival::Closed { concurrency: 12 },
            4 * FEW_SHOT_TOKENS / 16 + 64,
        ),
        WorkloadSpec::new(
            "tool-result",
            "tool-result (64 scratchpad agent sessions x 5 requests over a shared 2 KB tool preamble; each re-sends the task and one ~8 KB tool result inside its one user message, then a new step note of 64 tok; out 48; caches hold ~6 sessions)",
            workload::tool_result(64, 5, 2048, 64, 2048, 64, 48, seed, m),
            Arrival::Closed { concurrency: 16 },
            1024,
        ),
        WorkloadSpec::new(
            "noisy-neighbour",
            "noisy-neighbour (heavy tenant: 20 clients x 16 requests of ~6 KB, out 64; light tenant: 2 clients x 24 requests of ~256 B, out 16, all sent while the heavy one floods; each client back to back; max-num-seqs 2, 22 clients for 8 slots)",
            workload::noisy_neighbour(&[HEAVY_TENANT, LIGHT_TENANT], seed, m),
            Arrival::Closed { concurrency: 22 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(2),
        WorkloadSpec::new(
            "noisy-neighbour-light",
            "noisy-neighbour-light (the light tenant of noisy-neighbour alone: 2 clients x 24 requests of ~256 B, out 16; max-num-seqs 2)",
            workload::noisy_neighbour(&[LIGHT_TENANT], seed, m),
            Arrival::Closed { concurrency: 2 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(2),
        // The same clients as noisy-neighbour, the picker told the engines' slot count (2, as
        // a deployment knows its --max-num-seqs): flow control judges room from the first
        // request instead of from the first engine queue a scrape shows.
        WorkloadSpec::new(
            "noisy-neighbour-slots",
            "noisy-neighbour-slots (noisy-neighbour as above; the picker's flowControl.maxInFlightPerPod is 2, the engines' max-num-seqs)",
            workload::noisy_neighbour(&[HEAVY_TENANT, LIGHT_TENANT], seed, m),
            Arrival::Closed { concurrency: 22 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(2)
        .flow_control("{maxInFlightPerPod: 2}"),
        // Priority (issue 57): noisy-neighbour's clients as two objectives of one flow.
        WorkloadSpec::new(
            "priority",
            "priority (one flow, two objectives: batch, 20 clients x 16 requests of ~6 KB, out 64, priority 0; interactive, 2 clients x 24 requests of ~256 B, out 16, priority 10 (flowControl.priorities); max-num-seqs 2, 22 clients for 8 slots)",
            workload::objectives(&[BATCH_OBJECTIVE, INTERACTIVE_OBJECTIVE], seed, m),
            Arrival::Closed { concurrency: 22 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(2)
        .flow_control(PRIORITIES),
        WorkloadSpec::new(
            "priority-alone",
            "priority-alone (the interactive objective of priority alone: 2 clients x 24 requests of ~256 B, out 16; max-num-seqs 2)",
            workload::objectives(&[INTERACTIVE_OBJECTIVE], seed, m),
            Arrival::Closed { concurrency: 2 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(2)
        .flow_control(PRIORITIES),
        WorkloadSpec::new(
            "busy-agent",
            "busy-agent (agent as above: 32 sessions x 8 turns, shared 10 KB tool preamble; max-num-seqs 3, 18 clients for 12 slots)",
            workload::agent_sessions(32, 8, 10 * 1024, 128, 512, 48, seed, m),
            Arrival::Closed { concurrency: 18 },
            BUSY_KV_BLOCKS,
        )
        .max_num_seqs(3),
    ]
}

/// noisy-neighbour's tenants: one floods with many clients and long prompts, one asks short
/// questions with few clients.
pub const HEAVY_TENANT: workload::Tenant = workload::Tenant {
    name: "heavy",
    clients: 20,
    requests: 16,
    prompt_tokens: 1536,
    output_tokens: 64,
};
pub const LIGHT_TENANT: workload::Tenant = workload::Tenant {
    name: "light",
    clients: 2,
    requests: 24,
    prompt_tokens: 64,
    output_tokens: 16,
};

/// The priority workload's objectives: noisy-neighbour's tenants, named as objectives.
pub const BATCH_OBJECTIVE: workload::Tenant = workload::Tenant {
    name: "batch",
    ..HEAVY_TENANT
};
pub const INTERACTIVE_OBJECTIVE: workload::Tenant = workload::Tenant {
    name: "interactive",
    ..LIGHT_TENANT
};
/// Their priorities, as a deployment writes them (`picker.flowControl.priorities`; `batch` is
/// the default 0).
pub const PRIORITIES: &str = "{priorities: {interactive: 10}}";

/// Documents of the retrieval and completion-doc workloads, and their tokens (~6 KB each).
pub const DOCUMENTS: usize = 32;
pub const DOCUMENT_TOKENS: usize = 1536;
/// KV blocks per sim of the document workloads: about 6 of the 32 documents (6 x 96 blocks of
/// 16 tokens, plus 64 for running requests), so the 4 pods together hold the popular ones only.
pub const DOCUMENT_KV_BLOCKS: usize = 6 * DOCUMENT_TOKENS / 16 + 64;
/// Tokens of one few-shot example set (~4 KB); the sims hold about 4 of the 12 sets.
pub const FEW_SHOT_TOKENS: usize = 1024;

/// The `trace` workload: the first requests of the Mooncake trace at `path`, 20x faster.
fn trace_workload(quick: bool, path: &std::path::Path) -> anyhow::Result<WorkloadSpec> {
    let limit = if quick { 200 } else { 600 };
    Ok(WorkloadSpec::new(
        "trace",
        if quick {
            "trace (Mooncake synthetic, first 200 requests, 20x speed-up)"
        } else {
            "trace (Mooncake synthetic, first 600 requests, 20x speed-up)"
        },
        workload::trace(path, limit, 20.0, 64, "model")
            .with_context(|| format!("reading {}", path.display()))?,
        Arrival::Trace,
        // Long reuse distances: a full H100-sized cache (32,768 blocks = 524k tokens).
        32_768,
    ))
}

/// The pod of `caching-off` that never reuses its cache: the first, where routers that break
/// ties by endpoint order land.
pub const CACHING_OFF_POD: usize = 0;

/// KV blocks per sim of the busy workloads: room for every tenant's prompt on every pod (the
/// pressure there is the queue, not the cache).
pub const BUSY_KV_BLOCKS: usize = 4096;

/// The `ramp` workload: single questions to 12 Zipf tenants, arriving 10 -> 130 -> 10 per second.
fn ramp_requests(n: usize, seed: u64, model: &str) -> Vec<BenchRequest> {
    let mut requests: Vec<BenchRequest> =
        workload::multi_tenant(12, n * 2, TENANT_SYSTEM_TOKENS, 128, 64, 1.0, seed, model)
            .into_iter()
            .filter(|r| r.body["messages"].as_array().is_some_and(|m| m.len() == 2))
            .take(n)
            .map(|mut r| {
                r.conversation = None;
                r
            })
            .collect();
    workload::ramp(&mut requests, 10.0, 130.0);
    requests
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(w: &'a [WorkloadSpec], key: &str) -> Option<&'a WorkloadSpec> {
        w.iter().find(|w| w.key == key)
    }

    #[test]
    fn the_engine_truth_workloads_are_the_full_multi_tenant_one_disturbed() {
        let all = workloads(false, 1, &default_trace()).unwrap().0;
        let tenants = find(&all, "multi-tenant").unwrap();
        let restarts = find(&all, "engine-restarts").unwrap();
        let off = find(&all, "caching-off").unwrap();
        for w in [restarts, off] {
            assert_eq!(w.requests.len(), tenants.requests.len(), "{}", w.key);
            assert_eq!(w.requests[7].body, tenants.requests[7].body, "{}", w.key);
            assert_eq!(w.arrival, tenants.arrival);
            assert_eq!(
                (w.kv_blocks, w.max_num_seqs),
                (tenants.kv_blocks, tenants.max_num_seqs)
            );
        }
        // Every engine restarts once, one at a time, inside the run; no pod without caching.
        let schedule = restarts.restart_schedule();
        assert_eq!(
            schedule.iter().map(|r| r.engine).collect::<Vec<_>>(),
            (0..SIMS).collect::<Vec<_>>()
        );
        assert!(schedule.last().unwrap().after < restarts.requests.len());
        assert!(restarts.caching_off.is_empty());
        // One pod never reuses its cache; nothing restarts.
        assert_eq!(off.caching_off, vec![CACHING_OFF_POD]);
        assert!(off.restart_schedule().is_empty());
        // The picker restarts once, halfway through the full agent workload.
        let agent = find(&all, "agent").unwrap();
        let rollout = find(&all, "picker-restart").unwrap();
        assert_eq!(rollout.requests.len(), agent.requests.len());
        assert_eq!(rollout.requests[7].body, agent.requests[7].body);
        assert_eq!(
            rollout.picker_restart_after(),
            Some(agent.requests.len() / 2)
        );
        assert!(rollout.restart_schedule().is_empty() && rollout.caching_off.is_empty());
        // The other workloads are undisturbed, and `--quick` has none of the new ones.
        for w in all.iter().filter(|w| {
            ![
                "engine-restarts",
                "caching-off",
                "picker-restart",
                "retrieval-caching-off",
            ]
            .contains(&w.key)
        }) {
            assert!(w.caching_off.is_empty() && !w.restarts, "{}", w.key);
            assert_eq!(w.picker_restart_after(), None, "{}", w.key);
        }
        let quick = workloads(true, 1, &default_trace()).unwrap().0;
        for key in [
            "engine-restarts",
            "caching-off",
            "picker-restart",
            "retrieval-caching-off",
        ] {
            assert!(find(&quick, key).is_none(), "{key}");
        }
    }
    #[test]
    fn the_flow_control_workloads_name_their_picker_mapping_and_no_other_does() {
        let all = workloads(false, 1, &default_trace()).unwrap().0;
        let noisy = find(&all, "noisy-neighbour").unwrap();
        let slots = find(&all, "noisy-neighbour-slots").unwrap();
        // The same requests and engines; only the picker is told the engines' slot count.
        assert_eq!(slots.requests.len(), noisy.requests.len());
        assert!(
            slots
                .requests
                .iter()
                .zip(&noisy.requests)
                .all(|(a, b)| a.body == b.body && a.headers == b.headers)
        );
        assert_eq!(slots.max_num_seqs, 2);
        assert_eq!(
            slots.flow_control,
            Some("{maxInFlightPerPod: 2}"),
            "the engines' max-num-seqs"
        );
        // Priority: two objectives of one flow (no fairness id), the high one alone as well.
        let both = find(&all, "priority").unwrap();
        let alone = find(&all, "priority-alone").unwrap();
        for w in [both, alone] {
            assert_eq!(w.flow_control, Some(PRIORITIES), "{}", w.key);
            assert!(
                w.requests
                    .iter()
                    .all(|r| r.headers.len() == 1 && r.headers[0].0 == workload::OBJECTIVE_HEADER)
            );
        }
        let named =
            |w: &WorkloadSpec, o: &str| w.requests.iter().filter(|r| r.headers[0].1 == o).count();
        assert_eq!(named(both, "batch"), 320);
        assert_eq!(named(both, "interactive"), 48);
        assert_eq!(named(alone, "interactive"), alone.requests.len());
        for w in all
            .iter()
            .filter(|w| !["noisy-neighbour-slots", "priority", "priority-alone"].contains(&w.key))
        {
            assert_eq!(w.flow_control, None, "{}", w.key);
        }
    }

    #[test]
    fn the_mid_message_workloads_are_in_the_full_catalogue_as_issue_55_shapes_them() {
        let all = workloads(false, 1, &default_trace()).unwrap().0;
        let tenants = find(&all, "multi-tenant").unwrap().requests.len();
        for key in [
            "retrieval",
            "retrieval-caching-off",
            "completion-doc",
            "few-shot",
            "tool-result",
            "busy-agent",
        ] {
            let w = find(&all, key).unwrap_or_else(|| panic!("{key}"));
            assert!(w.name.starts_with(key), "{}", w.name);
            assert!(w.selected(&[key.to_string()]));
            // About as many requests as multi-tenant, so a row takes about as long.
            let n = w.requests.len();
            assert!(
                n * 2 > tenants && n < tenants * 3 / 2,
                "{key}: {n} vs {tenants}"
            );
        }
        // The same requests with sim-0 reusing nothing.
        let retrieval = find(&all, "retrieval").unwrap();
        let off = find(&all, "retrieval-caching-off").unwrap();
        assert_eq!(off.requests.len(), retrieval.requests.len());
        assert_eq!(off.requests[7].body, retrieval.requests[7].body);
        assert_eq!(off.caching_off, vec![CACHING_OFF_POD]);
        assert!(retrieval.caching_off.is_empty());
        assert_eq!(
            (off.kv_blocks, off.arrival),
            (retrieval.kv_blocks, retrieval.arrival)
        );
        // One pod holds a few documents, not all: the cache is the pressure.
        assert!(retrieval.kv_blocks * 16 < DOCUMENTS * DOCUMENT_TOKENS / 4);
        assert!(retrieval.kv_blocks * 16 > 4 * DOCUMENT_TOKENS);
        assert_eq!(
            find(&all, "completion-doc").unwrap().requests[0].path,
            "/v1/completions"
        );
        // Busy agent sessions: the agent workload's requests, 3 slots per engine, 18 clients.
        let agent = find(&all, "agent").unwrap();
        let busy = find(&all, "busy-agent").unwrap();
        assert_eq!(busy.requests.len(), agent.requests.len());
        assert_eq!(busy.requests[9].body, agent.requests[9].body);
        assert_eq!(busy.max_num_seqs, 3);
        assert_eq!(busy.arrival, Arrival::Closed { concurrency: 18 });
    }

    #[test]
    fn the_messages_agent_and_its_chat_twin_are_the_agents_sessions() {
        for quick in [false, true] {
            let all = workloads(quick, 1, &default_trace()).unwrap().0;
            let agent = find(&all, "agent").unwrap();
            let messages = find(&all, "agent-messages").unwrap();
            let chat = find(&all, "agent-chat").unwrap();
            for w in [messages, chat] {
                assert_eq!(w.requests.len(), agent.requests.len(), "{}", w.key);
                assert_eq!(
                    (w.arrival, w.kv_blocks, w.max_num_seqs),
                    (agent.arrival, agent.kv_blocks, agent.max_num_seqs)
                );
                assert!(w.name.starts_with(w.key));
            }
            assert!(messages.speaks_messages());
            assert!(!chat.speaks_messages() && !agent.speaks_messages());
            assert!(messages.requests.iter().all(|r| r.path == "/v1/messages"));
            // The same sessions, turn for turn.
            for (a, b) in messages.requests.iter().zip(&chat.requests) {
                assert_eq!((a.group, a.conversation), (b.group, b.conversation));
            }
            assert_eq!(
                messages.requests[9].body["system"][0]["text"],
                agent.requests[9].body["messages"][0]["content"]
            );
        }
    }

    #[test]
    fn a_workloads_key_selects_it_alone_and_a_name_prefix_selects_every_match() {
        let keys = |filter: &[&str]| -> Vec<&'static str> {
            let all = workloads(false, 1, &default_trace()).unwrap().0;
            let filter: Vec<String> = filter.iter().map(|f| f.to_string()).collect();
            select(all, &filter).iter().map(|w| w.key).collect()
        };
        assert_eq!(keys(&["agent"]), vec!["agent"]);
        assert_eq!(
            keys(&["agent-messages", "agent-chat"]),
            vec!["agent-messages", "agent-chat"]
        );
        assert_eq!(keys(&["agent-"]), vec!["agent-messages", "agent-chat"]);
        assert_eq!(
            keys(&["shared-prefix Kthena"]),
            vec!["kthena-long", "kthena-short"]
        );
        let all = workloads(false, 1, &default_trace()).unwrap().0.len();
        assert_eq!(keys(&[]).len(), all);
    }

    #[test]
    fn a_missing_trace_is_skipped_naming_the_file_and_where_to_get_it() {
        let missing = std::path::Path::new("/nonexistent/synthetic_trace.jsonl");
        for quick in [false, true] {
            let (w, skipped) = workloads(quick, 1, missing).unwrap();
            assert!(find(&w, "trace").is_none());
            assert_eq!(skipped.len(), 1);
            assert_eq!(skipped[0].workload, "trace");
            let reason = &skipped[0].reason;
            assert!(
                reason.contains("/nonexistent/synthetic_trace.jsonl"),
                "{reason}"
            );
            assert!(reason.contains("kvcache-ai/Mooncake") && reason.contains("--trace"));
        }
    }
}
