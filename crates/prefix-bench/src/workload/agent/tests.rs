use prefix_picker::prompt::Rendering;
use prefix_picker::request::{Api, InferenceRequest};
use serde_json::Value;

use super::super::{ceiling_hit_rate, engine_prompt};
use super::*;

fn script() -> AgentScript {
    AgentScript::new(6, 5, 10 * 1024, 64, 256, 32, 1)
}

/// The affinity mode's prompt of a request, as the picker renders it for its path.
fn routed_prompt(r: &BenchRequest) -> String {
    let api = Api::from_path(r.path).unwrap();
    let body = serde_json::to_vec(&r.body).unwrap();
    InferenceRequest::parse_for(api, &body, Rendering::Engine)
        .unwrap()
        .prompt
        .unwrap()
}

fn list<'a>(body: &'a Value, key: &str) -> &'a Vec<Value> {
    body[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}: {body}"))
}

#[test]
fn the_text_agent_is_the_scripts_words() {
    let s = script();
    let w = agent_sessions(6, 5, 10 * 1024, 64, 256, 32, 1, "m");
    assert_eq!(w.len(), 30);
    // Turn 3 of session 2: system, task, then three calls and results.
    let m = list(&w[2 * 5 + 3].body, "messages");
    assert_eq!(m.len(), 2 + 2 * 3);
    assert_eq!(m[0]["content"], s.preamble.as_str());
    let session = &s.sessions[2];
    assert_eq!(m[1]["content"], format!("Task: {}", session.task).as_str());
    assert_eq!(
        m[6]["content"],
        format!("call {}", session.steps[2].call).as_str()
    );
    assert_eq!(
        m[7]["content"],
        format!("Tool result: {}", session.steps[2].result).as_str()
    );
}

#[test]
fn both_shapes_send_the_same_requests_in_the_same_order() {
    let s = script();
    let (messages, chat) = (agent_messages(&s, "m"), agent_chat_tools(&s, "m"));
    assert_eq!(messages.len(), 6 * 5);
    assert_eq!(chat.len(), messages.len());
    for (a, b) in messages.iter().zip(&chat) {
        assert_eq!(a.path, "/v1/messages");
        assert_eq!(b.path, "/v1/chat/completions");
        assert_eq!((a.group, a.conversation), (b.group, b.conversation));
        assert!(a.group.is_some() && a.group == a.conversation);
        assert_eq!(a.body["stream"], true);
        assert_eq!(b.body["stream"], true);
        assert_eq!(b.body["stream_options"]["include_usage"], true);
        assert_eq!(a.body["max_tokens"], b.body["max_tokens"]);
        assert_eq!(a.body["model"], "m");
    }
}

#[test]
fn the_chat_shape_is_the_chat_request_vllm_serves_the_messages_one_as() {
    let s = script();
    for (a, b) in agent_messages(&s, "m")
        .iter()
        .zip(&agent_chat_tools(&s, "m"))
    {
        let served = model_sim::messages::chat_body(&a.body);
        assert_eq!(served["messages"], b.body["messages"], "{}", a.body);
        assert_eq!(served["tools"], b.body["tools"]);
        // The engine's prompt and the picker's hashed prompt are the same bytes.
        assert_eq!(engine_prompt(a), engine_prompt(b));
        assert_eq!(routed_prompt(a), routed_prompt(b));
    }
}

#[test]
fn messages_carry_the_scripts_words_in_anthropics_blocks() {
    let s = script();
    let w = agent_messages(&s, "m");
    let body = &w[3].body;
    let session = &s.sessions[0];
    assert_eq!(body["system"][0]["text"], s.preamble.as_str());
    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral");
    let tools = list(body, "tools");
    assert_eq!(tools.len(), TOOLS.len());
    assert!(tools.iter().all(|t| t["input_schema"]["type"] == "object"));
    let m = list(body, "messages");
    // The task, then three rounds of tool_use and tool_result.
    assert_eq!(m.len(), 1 + 2 * 3);
    assert_eq!(
        m[0]["content"][0]["text"],
        format!("Task: {}", session.task).as_str()
    );
    for t in 0..3 {
        let (call, result) = (&m[1 + 2 * t]["content"], &m[2 + 2 * t]["content"]);
        assert_eq!(call[1]["type"], "tool_use");
        assert_eq!(call[1]["name"], TOOLS[t % TOOLS.len()].0);
        let key = TOOLS[t % TOOLS.len()].2;
        assert_eq!(call[1]["input"][key], session.steps[t].call.as_str());
        assert_eq!(result[0]["type"], "tool_result");
        assert_eq!(result[0]["tool_use_id"], call[1]["id"]);
        let text = match &result[0]["content"] {
            Value::String(text) => text.as_str(),
            blocks => blocks[0]["text"].as_str().unwrap(),
        };
        assert_eq!(text, session.steps[t].result);
    }
    // Results come as a string and as text blocks.
    assert!(m[2]["content"][0]["content"].is_string());
    assert!(m[4]["content"][0]["content"].is_array());
}

#[test]
fn sessions_append_a_call_and_its_result_per_turn() {
    let s = script();
    for (w, key, per_turn) in [
        (agent_messages(&s, "m"), "messages", 2),
        (agent_chat_tools(&s, "m"), "messages", 2),
    ] {
        let mut by_session = std::collections::BTreeMap::<u32, Vec<&BenchRequest>>::new();
        for r in &w {
            by_session
                .entry(r.conversation.unwrap())
                .or_default()
                .push(r);
        }
        assert_eq!(by_session.len(), 6);
        for turns in by_session.values() {
            assert_eq!(turns.len(), 5);
            for pair in turns.windows(2) {
                let (a, b) = (list(&pair[0].body, key), list(&pair[1].body, key));
                assert_eq!(b.len(), a.len() + per_turn);
                assert_eq!(a[..], b[..a.len()], "append-only");
                assert_eq!(pair[0].body["tools"], pair[1].body["tools"]);
                // The picker's prompt of a turn extends the previous turn's.
                assert!(routed_prompt(pair[1]).starts_with(&routed_prompt(pair[0])));
            }
        }
    }
}

#[test]
fn the_shapes_have_one_ceiling_near_the_text_agents() {
    let s = script();
    let messages = ceiling_hit_rate(&agent_messages(&s, "m"), 16);
    let chat = ceiling_hit_rate(&agent_chat_tools(&s, "m"), 16);
    assert_eq!(messages, chat);
    // The engines render neither tools nor tool calls (model-sim's ChatML), so each turn adds
    // the result and a short text where the text agent adds the call's words too.
    let text = ceiling_hit_rate(&agent_sessions(6, 5, 10 * 1024, 64, 256, 32, 1, "m"), 16);
    assert!(
        messages > 0.8 && (messages - text).abs() < 0.05,
        "{messages} vs {text}"
    );
}
