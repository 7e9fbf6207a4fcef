//! vLLM's mapping of a Messages request to its chat form, block by block, and what the affinity
//! mode's hashes make of it.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{canonical_arguments, chat_form, chat_tools};
use crate::hashing::{BlockChain, BlockHash};
use crate::prompt::engine;
use crate::prompt::{NoPrompt, Rendering};
use crate::request::{Api, InferenceRequest};

const CHAIN: BlockChain = BlockChain {
    block_size: 16,
    max_blocks: 4096,
};

/// The prompt of a Messages body in `rendering`, checked equal through both parsers.
fn render(body: &Value, rendering: Rendering) -> Result<String, NoPrompt> {
    let bytes = serde_json::to_vec(body).unwrap();
    let parsed = InferenceRequest::parse_for(Api::Messages, &bytes, rendering).unwrap();
    assert_eq!(
        parsed,
        InferenceRequest::parse_by_value_for(Api::Messages, &bytes, rendering).unwrap()
    );
    parsed.prompt
}

fn engine(body: &Value) -> String {
    let prompt = render(body, Rendering::Engine).unwrap();
    assert_eq!(prompt, reference(body), "{body}");
    prompt
}

/// The reference the direct rendering is checked against: the chat form built, then rendered
/// as a chat body.
fn reference(body: &Value) -> String {
    let messages = body["messages"].as_array().unwrap();
    let form = chat_form(body.get("system"), messages, canonical_arguments);
    let tools = chat_tools(body.get("tools"));
    engine::render_chat(tools.as_ref(), None::<&Value>, &form)
}

fn hashes(body: &Value) -> Vec<BlockHash> {
    CHAIN.hash("m", engine(body).as_bytes())
}

fn shared(a: &[BlockHash], b: &[BlockHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The chat form of a body's `system` and `messages`.
fn form(body: &Value) -> Vec<Value> {
    let messages = body["messages"].as_array().unwrap();
    chat_form(body.get("system"), messages, canonical_arguments)
}

fn weather_tool(unit: &str) -> Value {
    json!({"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": [unit]}}, "required": ["city"]}})
}

/// An agent turn: a question, a tool call, its result and the answer.
fn agent(tools: Value, result: &str) -> Value {
    json!({"model": "m", "max_tokens": 64, "tools": tools,
    "system": [{"type": "text", "text": "You are an agent. Use the tools when useful."}],
    "messages": [
        {"role": "user", "content": "What is the weather in Paris today, in Celsius?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris", "unit": "c"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
            "content": result}]},
        {"role": "assistant", "content": "It is sunny."},
    ]})
}

#[test]
fn every_block_type_maps_as_vllm_maps_it() {
    let body = json!({"model": "m", "max_tokens": 8,
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=9f"},
        {"type": "text", "text": "Be brief. ", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Cite."}],
    "messages": [
        {"role": "system", "content": " Always."},
        {"role": "user", "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                "data": "iVBORw0"}},
            {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
            {"type": "text", "text": ""}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants", "signature": "s1"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "thinking", "thinking": " a zoom."},
            {"type": "text", "text": "Zooming."},
            {"type": "tool_use", "id": "toolu_1", "name": "zoom", "input": {"y": 2, "x": 1}},
            {"type": "tool_use", "id": "toolu_2", "name": "crop", "input": {}}]},
        {"role": "ctx", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
                "content": "zoomed"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [
                {"type": "text", "text": "cropped"}, {"type": "text", "text": "twice"},
                {"type": "image", "source": {"type": "url", "url": "https://x/b.png"}},
                {"type": "tool_reference", "tool_name": "rotate"}]},
            {"type": "text", "text": "Thanks."}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]},
        {"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "late"}]},
        {"role": "assistant", "content": []},
        {"role": "user", "content": []},
        {"role": "robot", "content": "skipped"},
        "not a message",
    ]});
    assert_eq!(
        Value::Array(form(&body)),
        json!([
            {"role": "system", "content": "Be brief. Cite. Always."},
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0"}},
                {"type": "image_url", "image_url": {"url": "https://x/a.png"}}]},
            {"role": "assistant", "content": "Zooming.", "reasoning": "The user wants a zoom.",
                "tool_calls": [
                {"id": "toolu_1", "type": "function",
                    "function": {"name": "zoom", "arguments": "{\"x\":1,\"y\":2}"}},
                {"id": "toolu_2", "type": "function",
                    "function": {"name": "crop", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "zoomed"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "cropped\ntwice"},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://x/b.png"}}]},
            {"role": "tool", "tool_call_id": "toolu_2", "content": [
                {"type": "tool_reference", "name": "rotate"}]},
            {"role": "user", "content": "Thanks."},
            {"role": "tool", "tool_call_id": "toolu_3", "content": ""},
            {"role": "assistant", "content": "Tool result: late"},
            {"role": "assistant"},
        ])
    );
    let prompt = engine(&body);
    let parts: Vec<&str> = prompt
        .match_indices("<|part:image_url:")
        .map(|(i, _)| &prompt[i..i + "<|part:image_url:0123456789abcdef|>".len()])
        .collect();
    let (a, b) = (parts[0], parts[1]);
    assert_ne!(a, b, "images differ by content");
    assert!(
        prompt.starts_with(&format!(
            "<|im_start|>system\nBe brief. Cite. Always.<|im_end|>\n\
             <|im_start|>user\nLook:\n{a}\n{b}<|im_end|>\n\
             <|im_start|>assistant\nZooming.<|tool_call:zoom|>{{\"x\":1,\"y\":2}}\
             <|tool_call:crop|>{{}}<|im_end|>\n\
             <|im_start|>tool\n<|tool_call_id:toolu_1|>zoomed<|im_end|>\n\
             <|im_start|>tool\n<|tool_call_id:toolu_2|>cropped\ntwice<|im_end|>\n"
        )),
        "{prompt}"
    );
    assert!(
        prompt.ends_with(
            "<|im_start|>user\nThanks.<|im_end|>\n\
             <|im_start|>tool\n<|tool_call_id:toolu_3|><|im_end|>\n\
             <|im_start|>assistant\nTool result: late<|im_end|>\n"
        ),
        "{prompt}"
    );
}

#[test]
fn documents_and_string_contents() {
    let body = json!({"model": "m", "system": "", "messages": [
        {"role": "user", "content": [{"type": "document", "source": {"type": "text",
            "media_type": "text/plain", "data": "the doc"}}]},
        {"role": "assistant", "content": "plain"}]});
    let form = form(&body);
    assert_eq!(form[0]["content"][0]["type"], "document");
    assert_eq!(form[1], json!({"role": "assistant", "content": "plain"}));
    let prompt = engine(&body);
    assert!(
        prompt.starts_with("<|im_start|>user\n<|part:document:"),
        "{prompt}"
    );
    let other = json!({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "document", "source": {"type": "text",
            "media_type": "text/plain", "data": "another doc"}}]},
        {"role": "assistant", "content": "plain"}]});
    assert_ne!(engine(&other), prompt);
}

#[test]
fn tools_map_to_functions() {
    let tools = json!([weather_tool("c"), {"description": "no name"}]);
    assert_eq!(
        chat_tools(Some(&tools)),
        Some(
            json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Weather in a city", "parameters": weather_tool("c")["input_schema"]}}])
        )
    );
    assert_eq!(chat_tools(Some(&json!("x"))), None);
    assert_eq!(chat_tools::<Value>(None), None);
}

#[test]
fn kthena_mode_reads_a_messages_body_as_a_chat_body() {
    let body = agent(json!([weather_tool("c")]), "Sunny, 21 degrees.");
    assert_eq!(
        render(&body, Rendering::Kthena).unwrap(),
        "<|im_start|>system\nYou are an agent. Use the tools when useful.<|im_end|>\n\
         <|im_start|>user\nWhat is the weather in Paris today, in Celsius?<|im_end|>\n\
         <|im_start|>assistant\nChecking.<|im_end|>\n\
         <|im_start|>assistant\nIt is sunny.<|im_end|>\n"
    );
    // Exactly what the same body gets on a chat path (Kthena's router reads every /v1/ path alike).
    let bytes = serde_json::to_vec(&body).unwrap();
    assert_eq!(
        InferenceRequest::parse_for(Api::Messages, &bytes, Rendering::Kthena).unwrap(),
        InferenceRequest::parse(&bytes).unwrap()
    );
}

#[test]
fn no_prompt_and_no_salt() {
    assert_eq!(
        render(&json!({"model": "m", "max_tokens": 1}), Rendering::Engine),
        Err(NoPrompt::NoPromptField)
    );
    assert_eq!(
        render(&json!({"model": "m", "messages": "hi"}), Rendering::Engine),
        Err(NoPrompt::MessagesNotList)
    );
    // vLLM answers a Messages request from its `messages` alone: a `prompt` is not read.
    assert_eq!(
        render(
            &json!({"model": "m", "prompt": "p", "messages": [{"role": "user", "content": "q"}]}),
            Rendering::Engine
        ),
        Ok("<|im_start|>user\nq<|im_end|>\n".to_string())
    );
    let body = br#"{"model":"m","cache_salt":"tenant","messages":[{"role":"user","content":"q"}]}"#;
    for rendering in [Rendering::Kthena, Rendering::Engine] {
        let parsed = InferenceRequest::parse_for(Api::Messages, body, rendering).unwrap();
        assert_eq!(parsed.salt, None, "vLLM's /v1/messages has no cache_salt");
    }
    for (body, error) in [
        (
            &b"[]"[..],
            "request body must be a JSON object, got an array",
        ),
        (br#"{"messages":[]}"#, "request body has no `model` field"),
        (br#"{"model":7}"#, "`model` must be a string, got a number"),
    ] {
        let err = InferenceRequest::parse_for(Api::Messages, body, Rendering::Engine).unwrap_err();
        assert_eq!(err.to_string(), error);
    }
}

#[test]
fn tools_and_tool_results_change_the_hashes_from_where_they_differ() {
    let base = hashes(&agent(json!([weather_tool("c")]), "Sunny, 21 degrees."));
    // Other tools: the tools line comes first, so every block differs.
    let tools = hashes(&agent(json!([weather_tool("f")]), "Sunny, 21 degrees."));
    assert_eq!(shared(&base, &tools), 0);
    // Another tool result: the blocks before it are kept, the ones from it on differ.
    let body = agent(json!([weather_tool("c")]), "Rain, 12 degrees.");
    let prompt = engine(&body);
    let result =
        prompt.find("<|tool_call_id:toolu_1|>").unwrap() + "<|tool_call_id:toolu_1|>".len();
    let other = hashes(&body);
    assert_eq!(shared(&base, &other), result / CHAIN.block_size);
    assert!(result / CHAIN.block_size > 4);
    // Another tool input: differs from the assistant's tool call on.
    let mut body = agent(json!([weather_tool("c")]), "Sunny, 21 degrees.");
    body["messages"][1]["content"][1]["input"]["city"] = json!("Lyon");
    let (before, after) = (
        engine(&agent(json!([weather_tool("c")]), "Sunny, 21 degrees.")),
        engine(&body),
    );
    let diff = before
        .bytes()
        .zip(after.bytes())
        .take_while(|(x, y)| x == y)
        .count();
    let call = after.find("<|tool_call:get_weather|>").unwrap();
    assert!(diff > call && diff < call + 60, "{diff} {call}");
    let moved = shared(&base, &hashes(&body));
    assert_eq!(moved, diff / CHAIN.block_size);
    assert!(moved < shared(&base, &other));
}

#[test]
fn cache_control_metadata_tool_choice_and_is_error_do_not_change_the_hashes() {
    let plain = agent(json!([weather_tool("c")]), "Sunny, 21 degrees.");
    let mut marked = plain.clone();
    marked["system"][0]["cache_control"] = json!({"type": "ephemeral"});
    marked["tools"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
    marked["messages"][2]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
    marked["messages"][2]["content"][0]["is_error"] = json!(false);
    marked["metadata"] = json!({"user_id": "user_abc_session_1"});
    marked["tool_choice"] = json!({"type": "any"});
    marked["temperature"] = json!(0.2);
    assert_eq!(hashes(&plain), hashes(&marked));
}

#[test]
fn a_follow_up_keeps_the_head_of_the_conversation() {
    let first = agent(json!([weather_tool("c")]), "Sunny, 21 degrees.");
    let mut next = first.clone();
    next["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "And tomorrow?"}));
    let (a, b) = (engine(&first), engine(&next));
    assert!(b.starts_with(&a));
}

#[test]
fn hostile_bodies_never_fail_the_request() {
    for messages in [
        json!([{"role": "user", "content": [{"type": "tool_use", "input": "not an object"}]}]),
        json!([{"role": "assistant", "content": [{"type": "tool_use", "name": 5, "input": [1]}]}]),
        json!([{"role": "user", "content": [{"type": "tool_result", "content": {"a": 1}}]}]),
        json!([{"role": "user", "content": [{"type": "image", "source": "x"}, {"type": 3}]}]),
        json!([{"role": "user", "content": [{"type": "tool_result", "content": [1, null, {}]}]}]),
        json!([{"role": "system", "content": [{"type": "text", "text": 1}]}, {"role": 1}]),
        json!([[[[[{"role": "user"}]]]]]),
    ] {
        for rendering in [Rendering::Kthena, Rendering::Engine] {
            let body = json!({"model": "m", "system": {"odd": true}, "tools": [{"name": {}}],
                "messages": messages});
            assert!(render(&body, rendering).is_ok(), "{body}");
        }
        let body = json!({"model": "m", "tools": [{"name": {}, "description": null}],
            "messages": messages});
        engine(&body);
    }
}

/// A conversation turn, sent as a Messages block list and as its chat-completions equivalent.
#[derive(Debug, Clone)]
enum Turn {
    User(String),
    Assistant(String),
    ToolCall { id: u8, city: String },
    ToolResult { id: u8, text: String },
}

fn turn() -> impl Strategy<Value = Turn> {
    let text = "[a-z ]{1,40}";
    prop_oneof![
        text.prop_map(Turn::User),
        text.prop_map(Turn::Assistant),
        (any::<u8>(), "[A-Z][a-z]{1,8}").prop_map(|(id, city)| Turn::ToolCall { id, city }),
        (any::<u8>(), text).prop_map(|(id, text)| Turn::ToolResult { id, text }),
    ]
}

/// The Messages body and the chat body a client would send for the same conversation.
fn both_shapes(system: &str, tools: bool, turns: &[Turn]) -> (Value, Value) {
    let mut anthropic = Vec::new();
    let mut chat = vec![json!({"role": "system", "content": system})];
    for t in turns {
        match t {
            Turn::User(text) => {
                anthropic
                    .push(json!({"role": "user", "content": [{"type": "text", "text": text}]}));
                chat.push(json!({"role": "user", "content": text}));
            }
            Turn::Assistant(text) => {
                anthropic.push(json!({"role": "assistant", "content": text}));
                chat.push(json!({"role": "assistant", "content": text}));
            }
            Turn::ToolCall { id, city } => {
                let input = json!({"unit": "c", "city": city});
                anthropic.push(json!({"role": "assistant", "content": [{"type": "tool_use",
                    "id": format!("t{id}"), "name": "get_weather", "input": input}]}));
                chat.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": format!("t{id}"), "type": "function", "function": {
                        "name": "get_weather", "arguments": canonical_arguments(&input)}}]}));
            }
            Turn::ToolResult { id, text } => {
                anthropic.push(json!({"role": "user", "content": [{"type": "tool_result",
                    "tool_use_id": format!("t{id}"), "content": [{"type": "text", "text": text}]}]}));
                chat.push(
                    json!({"role": "tool", "tool_call_id": format!("t{id}"), "content": text}),
                );
            }
        }
    }
    let mut anthropic = json!({"model": "m", "max_tokens": 16, "system": system,
        "messages": anthropic});
    let mut chat = json!({"model": "m", "messages": chat});
    if tools {
        anthropic["tools"] = json!([weather_tool("c")]);
        chat["tools"] = chat_tools(Some(&anthropic["tools"])).unwrap();
    }
    (anthropic, chat)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// A Messages body and its chat-completions equivalent render, and so hash, alike: the same
    /// shared prefix finds the same pod whichever API a harness speaks.
    #[test]
    fn a_messages_body_hashes_as_its_chat_equivalent(
        system in "[a-z ]{1,60}",
        tools in any::<bool>(),
        turns in prop::collection::vec(turn(), 1..8),
    ) {
        let (anthropic, chat) = both_shapes(&system, tools, &turns);
        let chat_prompt = InferenceRequest::parse_as(
            &serde_json::to_vec(&chat).unwrap(), Rendering::Engine).unwrap().prompt.unwrap();
        prop_assert_eq!(engine(&anthropic), chat_prompt);
    }

    /// The borrowed parse equals the `Value` parse for Messages bodies, hostile ones included.
    #[test]
    fn the_borrowed_parse_equals_the_value_parse(
        body in prop::collection::vec(any::<u8>(), 0..64),
        turns in prop::collection::vec(turn(), 0..4),
    ) {
        let (valid, _) = both_shapes("s", true, &turns);
        for bytes in [body, serde_json::to_vec(&valid).unwrap()] {
            for rendering in [Rendering::Kthena, Rendering::Engine] {
                let a = InferenceRequest::parse_for(Api::Messages, &bytes, rendering);
                let b = InferenceRequest::parse_by_value_for(Api::Messages, &bytes, rendering);
                prop_assert_eq!(format!("{:?}", a.map_err(|e| e.to_string())),
                    format!("{:?}", b.map_err(|e| e.to_string())));
            }
        }
    }
}

/// Any block a Messages body may carry, well-formed or not.
fn block() -> impl Strategy<Value = Value> {
    let text = prop_oneof![Just(String::new()), "[a-z ]{1,12}".prop_map(String::from)];
    let item = prop_oneof![
        text.clone()
            .prop_map(|t| json!({"type": "text", "text": t})),
        "[a-z]{1,6}".prop_map(|u| json!({"type": "image", "source": {"type": "url", "url": u}})),
        "[a-z]{0,4}".prop_map(|n| json!({"type": "tool_reference", "tool_name": n})),
        Just(json!(7)),
        Just(json!({"type": "text", "text": 3})),
    ];
    prop_oneof![
        text.clone()
            .prop_map(|t| json!({"type": "text", "text": t})),
        ("[a-z]{1,6}", prop::option::of("image/[a-z]{3}")).prop_map(|(d, m)| {
            let mut source = json!({"type": "base64", "data": d});
            if let Some(m) = m {
                source["media_type"] = json!(m);
            }
            json!({"type": "image", "source": source})
        }),
        "[a-z]{1,6}".prop_map(|d| json!({"type": "document", "source": {"data": d}})),
        text.clone()
            .prop_map(|t| json!({"type": "thinking", "thinking": t})),
        Just(json!({"type": "redacted_thinking", "data": "x"})),
        (
            "[a-z]{0,3}",
            prop_oneof![
                Just(json!({})),
                Just(json!(null)),
                Just(json!({"b": 1, "a": [2.5]}))
            ]
        )
            .prop_map(
                |(n, input)| json!({"type": "tool_use", "id": "t", "name": n, "input": input})
            ),
        (prop_oneof![
            text.clone().prop_map(Value::from),
            prop::collection::vec(item, 0..4).prop_map(Value::from),
            Just(json!(null)),
            Just(json!({"a": 1})),
        ])
        .prop_map(|c| json!({"type": "tool_result", "tool_use_id": "t", "content": c})),
        Just(json!({"type": 5})),
        Just(json!("loose")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// The direct rendering equals the reference (the chat form built, then rendered) for any
    /// mix of blocks, roles and system shapes.
    #[test]
    fn the_direct_rendering_is_the_chat_forms(
        system in prop_oneof![
            Just(json!(null)),
            Just(json!("")),
            "[a-z ]{0,10}".prop_map(Value::from),
            prop::collection::vec(block(), 0..3).prop_map(Value::from),
        ],
        messages in prop::collection::vec(
            (
                prop::sample::select(vec!["user", "assistant", "system", "ctx", "robot"]),
                prop_oneof![
                    "[a-z ]{0,10}".prop_map(Value::from),
                    prop::collection::vec(block(), 0..5).prop_map(Value::from),
                    Just(json!(null)),
                ],
            )
                .prop_map(|(role, content)| json!({"role": role, "content": content})),
            0..6,
        ),
        tools in prop_oneof![
            Just(None),
            Just(Some(json!([]))),
            Just(Some(json!([{"name": "w", "description": null}, {"x": 1}]))),
            Just(Some(json!([weather_tool("c")]))),
        ],
    ) {
        let mut body = json!({"model": "m", "messages": messages});
        if !system.is_null() {
            body["system"] = system;
        }
        if let Some(tools) = tools {
            body["tools"] = tools;
        }
        prop_assert_eq!(render(&body, Rendering::Engine).unwrap(), reference(&body));
    }
}
