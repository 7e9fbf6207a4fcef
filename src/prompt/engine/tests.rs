//! The affinity mode's rendering: what it adds to Kthena's, where, and what that does to the
//! block hashes (Kthena's mode is the golden tests of `prompt/tests.rs`, untouched).

use serde_json::{Value, json};

use crate::hashing::{BlockChain, BlockHash};
use crate::prompt::Rendering;
use crate::request::InferenceRequest;

/// Small blocks, so each message spans several.
const CHAIN: BlockChain = BlockChain {
    block_size: 16,
    max_blocks: 4096,
};

/// The prompt in `rendering`, checked equal through the borrowed and the `Value` parse.
fn render(body: &Value, rendering: Rendering) -> String {
    let bytes = serde_json::to_vec(body).unwrap();
    let parsed = InferenceRequest::parse_as(&bytes, rendering).unwrap();
    assert_eq!(
        parsed,
        InferenceRequest::parse_by_value_as(&bytes, rendering).unwrap()
    );
    parsed.prompt.unwrap()
}

fn engine(body: &Value) -> String {
    render(body, Rendering::Engine)
}

fn hashes(body: &Value, rendering: Rendering) -> Vec<BlockHash> {
    CHAIN.hash("m", render(body, rendering).as_bytes())
}

/// Blocks the two chains share from the start.
fn shared(a: &[BlockHash], b: &[BlockHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The first byte where `a` and `b` differ, checked to lie in `a`'s first `marker` (the message
/// or part that makes the difference) and returned in full blocks: the blocks that must match.
fn head_blocks(a: &str, b: &str, marker: &str, marker_len: usize) -> usize {
    let diff = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let at = a.find(marker).unwrap();
    assert!(
        (at..at + marker_len).contains(&diff),
        "{diff} not in {at}+{marker_len}"
    );
    diff / CHAIN.block_size
}

fn weather_tool(unit: &str) -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"type": "string", "enum": [unit]}, "days": {"type": "integer", "maximum": 7}}}}})
}

fn chat(tools: Option<Value>, messages: Value) -> Value {
    let mut body = json!({"model": "m", "messages": messages});
    if let Some(tools) = tools {
        body["tools"] = tools;
    }
    body
}

fn conversation() -> Value {
    json!([
        {"role": "system", "content": "You are an agent with tools. Use them when useful."},
        {"role": "user", "content": "What is the weather in Paris and in Berlin today?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees."},
    ])
}

#[test]
fn renders_tools_calls_and_parts_in_place() {
    let body = chat(
        Some(json!([weather_tool("c")])),
        json!([
            {"role": "user", "content": [{"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "https://x/a.png"}}, {"text": "ok?"}]},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"function": {"name": "zoom", "arguments": "{\"x\":1}"}}]},
            {"role": "tool", "tool_call_id": "c9", "content": "zoomed"},
        ]),
    );
    let prompt = engine(&body);
    let tools = &prompt[..prompt.find('\n').unwrap()];
    assert!(
        tools.starts_with("<|tools:") && tools.len() == 26,
        "{prompt}"
    );
    let part = prompt.find("<|part:image_url:").unwrap();
    assert_eq!(
        &prompt[tools.len() + 1..],
        format!(
            "<|im_start|>user\nLook:\n{}\nok?<|im_end|>\n\
             <|im_start|>assistant\nChecking.<|tool_call:zoom|>{{\"x\":1}}<|im_end|>\n\
             <|im_start|>tool\n<|tool_call_id:c9|>zoomed<|im_end|>\n",
            &prompt[part..part + "<|part:image_url:0123456789abcdef|>".len()]
        )
    );
    // Kthena's mode sees the text only.
    assert_eq!(
        render(&body, Rendering::Kthena),
        "<|im_start|>user\nLook:\nok?<|im_end|>\n<|im_start|>assistant\nChecking.<|im_end|>\n\
         <|im_start|>tool\nzoomed<|im_end|>\n"
    );
}

#[test]
fn text_only_requests_render_as_kthena_renders_them() {
    for body in [
        chat(
            None,
            json!([{"role": "system", "content": "s"}, {"role": "user", "content":
            [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}, 5]}]),
        ),
        chat(
            Some(json!([])),
            json!([{"role": "user", "content": "x"}, {"role": "bad"}]),
        ),
        json!({"model": "m", "system": "top", "messages": [{"role": "user", "content": "q"}]}),
        json!({"model": "m", "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}),
        json!({"model": "m", "input": "hello", "tools": []}),
        json!({"model": "m", "prompt": "plain", "tools": [weather_tool("c")]}),
    ] {
        assert_eq!(engine(&body), render(&body, Rendering::Kthena), "{body}");
    }
}

#[test]
fn tools_change_every_block_in_the_affinity_mode_only() {
    let without = chat(None, conversation());
    let with_c = chat(Some(json!([weather_tool("c")])), conversation());
    let with_f = chat(Some(json!([weather_tool("f")])), conversation());
    let (none, c, f) = (
        hashes(&without, Rendering::Engine),
        hashes(&with_c, Rendering::Engine),
        hashes(&with_f, Rendering::Engine),
    );
    assert!(c.len() > 8);
    for (a, b) in [(&none, &c), (&c, &f)] {
        assert_eq!(shared(a, b), 0, "the first block differs already");
        // Not only by the chain: the tools line shifts every block, and every block differs.
        assert!(a.iter().all(|h| !b.contains(h)));
    }
    let kthena = hashes(&without, Rendering::Kthena);
    assert_eq!(hashes(&with_c, Rendering::Kthena), kthena);
    assert_eq!(hashes(&with_f, Rendering::Kthena), kthena);
}

#[test]
fn tool_calls_change_the_hashes_from_their_message_on() {
    let mut other = conversation();
    other[2]["tool_calls"][0]["function"]["arguments"] = json!("{\"city\":\"Berlin\"}");
    let mut other_id = conversation();
    other_id[3]["tool_call_id"] = json!("call_2");
    let base = chat(None, conversation());
    let (other, other_id) = (chat(None, other), chat(None, other_id));
    let prompt = engine(&base);
    let a = hashes(&base, Rendering::Engine);
    for (b, marker, len) in [
        (&other, "<|tool_call:get_weather|>", 60),
        (&other_id, "<|tool_call_id:", 30),
    ] {
        let head = head_blocks(&prompt, &engine(b), marker, len);
        assert!(head > 4);
        let hb = hashes(b, Rendering::Engine);
        assert_eq!(shared(&a, &hb), head, "equal up to the block of {marker}");
        assert_eq!(a.len(), hb.len());
        // Kthena's mode renders neither: one prompt there.
        assert_eq!(
            hashes(b, Rendering::Kthena),
            hashes(&base, Rendering::Kthena)
        );
    }
}

#[test]
fn a_different_image_changes_the_hashes_from_its_part_on() {
    let with_image = |url: &str, detail: Option<&str>| {
        let mut image = json!({"type": "image_url", "image_url": {"url": url}});
        if let Some(d) = detail {
            image["image_url"]["detail"] = json!(d);
        }
        chat(
            None,
            json!([
                {"role": "system", "content": "You describe pictures in great detail, always."},
                {"role": "user", "content": [{"type": "text", "text": "What is in this one?"},
                    image, {"type": "text", "text": "Answer in French please."}]},
            ]),
        )
    };
    let a = with_image("data:image/png;base64,AAAA", None);
    let prompt = engine(&a);
    let ha = hashes(&a, Rendering::Engine);
    for b in [
        with_image("data:image/png;base64,BBBB", None),
        with_image("data:image/png;base64,AAAA", Some("low")),
    ] {
        let head = head_blocks(&prompt, &engine(&b), "<|part:image_url:", 35);
        assert!(head > 2);
        let hb = hashes(&b, Rendering::Engine);
        assert_eq!(shared(&ha, &hb), head);
        assert_eq!(ha.len(), hb.len());
        assert_eq!(hashes(&b, Rendering::Kthena), hashes(&a, Rendering::Kthena));
    }
    assert_eq!(
        hashes(
            &with_image("data:image/png;base64,AAAA", None),
            Rendering::Engine
        ),
        ha
    );
    // Other kinds of part too; Kthena's mode sees none of them.
    for part in [
        json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),
        json!({"type": "file", "file": {"file_id": "file-1"}}),
        json!({"type": "input_image", "image_url": "https://x/y.png"}),
    ] {
        let body = chat(
            None,
            json!([{"role": "user", "content": [{"type": "text", "text": "q"}, part]}]),
        );
        let kind = part["type"].as_str().unwrap();
        assert!(engine(&body).contains(&format!("<|part:{kind}:")), "{body}");
        assert_eq!(
            render(&body, Rendering::Kthena),
            "<|im_start|>user\nq<|im_end|>\n"
        );
    }
}

#[test]
fn identical_requests_hash_identically_whatever_the_key_order() {
    let a = chat(Some(json!([weather_tool("c")])), conversation());
    assert_eq!(
        hashes(&a, Rendering::Engine),
        hashes(&a.clone(), Rendering::Engine)
    );
    // The same tools and image with keys reordered and spaced out: the same digests.
    let body = |tools: &str, image: &str| {
        let text = format!(
            r#"{{"model":"m","tools":{tools},"messages":[{{"role":"user","content":[{image}]}}]}}"#
        );
        InferenceRequest::parse_as(text.as_bytes(), Rendering::Engine)
            .unwrap()
            .prompt
            .unwrap()
    };
    let one = body(
        r#"[{"type":"function","function":{"name":"f","parameters":{"a":1.50,"b":[true,null]}}}]"#,
        r#"{"type":"image_url","image_url":{"url":"u","detail":"high"}}"#,
    );
    let two = body(
        r#"[ { "function" : { "parameters" : { "b" : [ true , null ] , "a" : 1.5 } , "name" : "f" } , "type" : "function" } ]"#,
        r#"{"image_url":{"detail":"high","url":"u"},"type":"image_url"}"#,
    );
    assert_eq!(one, two);
    // The serde path (an escape) and the fast path agree too.
    let three = body(
        r#"[{"type":"function","function":{"name":"\u0066","parameters":{"a":1.5e0,"b":[true,null]}}}]"#,
        r#"{"type":"image_url","image_url":{"url":"u","detail":"high"}}"#,
    );
    assert_eq!(one, three);
    let other = body(
        r#"[{"type":"function","function":{"name":"f","parameters":{"a":1.51,"b":[true,null]}}}]"#,
        r#"{"type":"image_url","image_url":{"url":"u","detail":"high"}}"#,
    );
    assert_ne!(one, other);
}

#[test]
fn a_follow_up_keeps_the_head_of_the_conversation() {
    let tools = Some(json!([weather_tool("c")]));
    let first = chat(tools.clone(), conversation());
    let mut turns = conversation();
    let turns_list = turns.as_array_mut().unwrap();
    turns_list.push(json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_2", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\":\"Berlin\"}"}}]}));
    turns_list.push(json!({"role": "tool", "tool_call_id": "call_2", "content": "Rain."}));
    let next = chat(tools, turns);
    let (a, b) = (
        hashes(&first, Rendering::Engine),
        hashes(&next, Rendering::Engine),
    );
    let full = engine(&first).len() / CHAIN.block_size;
    assert!(engine(&next).starts_with(&engine(&first)));
    assert_eq!(
        shared(&a, &b),
        full,
        "every full block of the first request"
    );
}

#[test]
fn responses_items_and_tools_render_in_place() {
    let body = |output: &str| {
        json!({"model": "m", "tools": [weather_tool("c")], "instructions": "be brief", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"},
                {"type": "input_image", "image_url": "https://x/p.png"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": output},
            {"type": "message", "role": "user", "content": "thanks"},
        ]})
    };
    let prompt = engine(&body("sunny"));
    assert!(prompt.starts_with("<|tools:"), "{prompt}");
    for marker in [
        "<|im_start|>developer\nbe brief<|im_end|>\n<|im_start|>user\nweather?\n<|part:input_image:",
        "<|item:function_call:",
        "<|item:function_call_output:",
        "<|im_start|>user\nthanks<|im_end|>\n",
    ] {
        assert!(prompt.contains(marker), "{marker} in {prompt}");
    }
    let other = engine(&body("rainy"));
    let at = prompt.find("<|item:function_call_output:").unwrap();
    assert_eq!(prompt[..at], other[..at]);
    assert_ne!(prompt[at..], other[at..]);
    assert_eq!(
        render(&body("sunny"), Rendering::Kthena),
        "<|im_start|>developer\nbe brief<|im_end|>\n<|im_start|>user\nweather?<|im_end|>\n\
         <|im_start|>user\nthanks<|im_end|>\n"
    );
}

#[test]
fn odd_tool_fields_never_fail_the_request() {
    for messages in [
        json!([{"role": "assistant", "tool_calls": "x"}]),
        json!([{"role": "assistant", "tool_calls": [1, null, {"function": 3}, {"type": "custom"}]}]),
        json!([{"role": "assistant", "tool_calls": [{"function": {"name": 5, "arguments": {"a": [1]}}}]}]),
        json!([{"role": "tool", "tool_call_id": 7, "content": [{"type": 1}, {"type": ""}]}]),
    ] {
        for tools in [
            None,
            Some(json!("t")),
            Some(json!({"a": 1})),
            Some(json!([null])),
        ] {
            let body = chat(tools, messages.clone());
            engine(&body);
        }
    }
    assert_eq!(
        engine(&chat(
            None,
            json!([{"role": "assistant", "content": null,
            "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": 2}}}]}])
        )),
        "<|im_start|>assistant\n<|tool_call:f|>{\"a\":2,\"b\":1}<|im_end|>\n"
    );
}
