//! Agent sessions (one script, three API shapes): a shared tool preamble longer than the
//! router's 8 KiB hash coverage, then sessions that grow append-only, one tool call and its
//! result per turn. [`AgentScript`] draws the words (deterministic under the seed); each shape
//! sends the same words:
//!
//! - [`agent_sessions`] (`agent`): chat completions, text only: the preamble as the system
//!   message, each call an assistant message `call ...`, each result a user message
//!   `Tool result: ...`.
//! - [`agent_messages`] (`agent-messages`, issue 58): Anthropic's Messages API as an agent harness
//!   sends it: the preamble as a `system` text block (with `cache_control`, which changes
//!   nothing), [`TOOLS`] in `tools`, each call an assistant turn of a short text and a `tool_use`
//!   whose input carries the call's words, each result a user turn of one `tool_result` (a string
//!   or one text block, alternately).
//! - [`agent_chat_tools`] (`agent-chat`): the same as chat completions in OpenAI's shape: the
//!   tools as functions, each call an assistant message with that text and a `tool_calls` entry
//!   (`arguments`: the input's compact JSON, keys sorted), each result a `tool` message. This is
//!   the chat request vLLM serves the Messages one as (`model_sim::messages::chat_body`, a test
//!   checks it), so the engines see the same prompts and the two rows compare routing alone.

use prefix_picker::prompt::messages::canonical_arguments;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{BenchRequest, chat, text};

/// The path of Anthropic's Messages API.
pub const MESSAGES_PATH: &str = "/v1/messages";

/// The agent's tools: name, what its description is about, the input's key.
pub const TOOLS: [(&str, &str, &str); 4] = [
    ("bash", "Run a shell command in the workspace", "command"),
    ("read_file", "Read a file of the workspace", "path"),
    ("edit_file", "Replace a span of a file", "patch"),
    ("search", "Search the workspace for a pattern", "query"),
];

/// Bytes of each tool's description after its summary (words from the vocabulary).
const TOOL_DESCRIPTION_BYTES: usize = 256;

/// One step of a session: the model's tool call and the tool's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub call: String,
    pub result: String,
}

/// One session: its task and its steps (turn `t` sends the first `t` steps).
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub task: String,
    pub steps: Vec<Step>,
}

/// The words of an agent workload, whatever API shape sends them.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentScript {
    pub preamble: String,
    pub sessions: Vec<Session>,
    /// Output tokens per request.
    pub output_tokens: usize,
    seed: u64,
}

impl AgentScript {
    /// `sessions` of `turns` requests over a preamble of `preamble_bytes` (after its first
    /// sentence), a task of `task_tokens`, calls of `output_tokens` and results of half to 1.5x
    /// `step_tokens`.
    pub fn new(
        sessions: usize,
        turns: usize,
        preamble_bytes: usize,
        task_tokens: usize,
        step_tokens: usize,
        output_tokens: usize,
        seed: u64,
    ) -> AgentScript {
        let preamble = format!(
            "You are an agent. Call one tool per step. Tools: {}",
            text(seed ^ 0xA6E7, preamble_bytes)
        );
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xA6E7_5E55);
        let sessions = (0..sessions)
            .map(|s| {
                let cs = seed ^ (s as u64 + 1).wrapping_mul(0xD6E8_FEB8_6659_FD93);
                let steps = (0..turns)
                    .map(|t| {
                        let call = text(cs ^ (2 * t as u64 + 1), output_tokens * 4);
                        let result_tokens = rng.random_range(step_tokens / 2..=step_tokens * 3 / 2);
                        let result = text(cs ^ (2 * t as u64 + 2), result_tokens * 4);
                        Step { call, result }
                    })
                    .collect();
                Session {
                    task: text(cs, task_tokens * 4),
                    steps,
                }
            })
            .collect();
        AgentScript {
            preamble,
            sessions,
            output_tokens,
            seed,
        }
    }

    /// Every turn of every session, session by session: `(session, its steps so far)`.
    fn turns(&self) -> impl Iterator<Item = (u32, &Session, &[Step])> {
        self.sessions.iter().enumerate().flat_map(|(s, session)| {
            (0..session.steps.len()).map(move |t| (s as u32, session, &session.steps[..t]))
        })
    }

    /// A tool's description: its summary, then words.
    fn description(&self, tool: usize) -> String {
        let (_, summary, _) = TOOLS[tool];
        let words = text(
            self.seed ^ (tool as u64 + 1).wrapping_mul(0x7001_5EED),
            TOOL_DESCRIPTION_BYTES,
        );
        format!("{summary}. {words}")
    }
}

/// The tool step `t` calls, and its call's id in session `s`.
fn tool_of(t: usize) -> usize {
    t % TOOLS.len()
}

fn call_id(s: u32, t: usize) -> String {
    format!("toolu_{s:03}_{t:02}")
}

/// The short text before step `t`'s tool call.
fn call_text(t: usize) -> String {
    format!("Step {}: calling {}.", t + 1, TOOLS[tool_of(t)].0)
}

/// The input of step `t`'s tool call: its words under the tool's key.
fn call_input(t: usize, step: &Step) -> Value {
    let (_, _, key) = TOOLS[tool_of(t)];
    json!({ key: step.call })
}

/// A tool's input schema: one string property, required.
fn input_schema(tool: usize) -> Value {
    let (_, _, key) = TOOLS[tool];
    json!({"type": "object", "properties": {key: {"type": "string"}}, "required": [key]})
}

/// The `agent` workload: chat completions, calls and results as text.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per workload parameter"
)]
pub fn agent_sessions(
    sessions: usize,
    turns: usize,
    preamble_bytes: usize,
    task_tokens: usize,
    step_tokens: usize,
    output_tokens: usize,
    seed: u64,
    model: &str,
) -> Vec<BenchRequest> {
    let script = AgentScript::new(
        sessions,
        turns,
        preamble_bytes,
        task_tokens,
        step_tokens,
        output_tokens,
        seed,
    );
    script
        .turns()
        .map(|(s, session, steps)| {
            let mut history = vec![
                json!({"role": "system", "content": script.preamble}),
                json!({"role": "user", "content": format!("Task: {}", session.task)}),
            ];
            for step in steps {
                history
                    .push(json!({"role": "assistant", "content": format!("call {}", step.call)}));
                history.push(
                    json!({"role": "user", "content": format!("Tool result: {}", step.result)}),
                );
            }
            BenchRequest::new(
                "/v1/chat/completions",
                chat(Value::Array(history), output_tokens, model),
                Some(s),
            )
            .turn_of(s)
        })
        .collect()
}

/// The `agent-messages` workload: `script` sent to `/v1/messages`, streamed.
pub fn agent_messages(script: &AgentScript, model: &str) -> Vec<BenchRequest> {
    let tools: Vec<Value> = (0..TOOLS.len())
        .map(|i| {
            json!({"name": TOOLS[i].0, "description": script.description(i),
                "input_schema": input_schema(i)})
        })
        .collect();
    script
        .turns()
        .map(|(s, session, steps)| {
            let mut messages = vec![json!({"role": "user", "content": [
                {"type": "text", "text": format!("Task: {}", session.task)}]})];
            for (t, step) in steps.iter().enumerate() {
                let id = call_id(s, t);
                messages.push(json!({"role": "assistant", "content": [
                    {"type": "text", "text": call_text(t)},
                    {"type": "tool_use", "id": id, "name": TOOLS[tool_of(t)].0,
                        "input": call_input(t, step)}]}));
                // Both shapes of a result's content: a string, or text blocks.
                let content = if t % 2 == 0 {
                    Value::from(step.result.as_str())
                } else {
                    json!([{"type": "text", "text": step.result}])
                };
                messages.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": content}]}));
            }
            let body = json!({"model": model, "max_tokens": script.output_tokens, "stream": true,
                "system": [{"type": "text", "text": script.preamble,
                    "cache_control": {"type": "ephemeral"}}],
                "tools": tools, "messages": messages,
                "metadata": {"user_id": format!("session-{s}")}});
            BenchRequest::new(MESSAGES_PATH, body, Some(s)).turn_of(s)
        })
        .collect()
}

/// The `agent-chat` workload: `script` as chat completions with tool calls, streamed.
pub fn agent_chat_tools(script: &AgentScript, model: &str) -> Vec<BenchRequest> {
    let tools: Vec<Value> = (0..TOOLS.len())
        .map(|i| {
            json!({"type": "function", "function": {"name": TOOLS[i].0,
                "description": script.description(i), "parameters": input_schema(i)}})
        })
        .collect();
    script
        .turns()
        .map(|(s, session, steps)| {
            let mut messages = vec![
                json!({"role": "system", "content": script.preamble}),
                json!({"role": "user", "content": format!("Task: {}", session.task)}),
            ];
            for (t, step) in steps.iter().enumerate() {
                let id = call_id(s, t);
                let arguments = canonical_arguments(&call_input(t, step));
                messages.push(json!({"role": "assistant", "content": call_text(t),
                    "tool_calls": [{"id": id, "type": "function",
                        "function": {"name": TOOLS[tool_of(t)].0, "arguments": arguments}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": step.result}));
            }
            let mut body = chat(Value::Array(messages), script.output_tokens, model);
            body["tools"] = Value::Array(tools.clone());
            BenchRequest::new("/v1/chat/completions", body, Some(s)).turn_of(s)
        })
        .collect()
}

#[cfg(test)]
mod tests;
