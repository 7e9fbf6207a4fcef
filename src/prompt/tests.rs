//! Golden tests for every rendering rule of the semantics doc §1.

use crate::prompt::NoPrompt;
use crate::request::InferenceRequest;

fn render(body: &str) -> Result<String, NoPrompt> {
    InferenceRequest::parse(body.as_bytes()).unwrap().prompt
}

fn ok(body: &str) -> String {
    render(body).unwrap()
}

#[test]
fn completions_prompt_is_used_as_is() {
    assert_eq!(ok(r#"{"model":"m","prompt":"Hello World"}"#), "Hello World");
    assert_eq!(ok(r#"{"model":"m","prompt":""}"#), "");
    assert_eq!(ok(r#"{"model":"m","prompt":"a\nb\u00e9"}"#), "a\nbé");
}

#[test]
fn non_string_prompt_is_no_prompt_and_does_not_fall_through() {
    for p in ["null", "[1,2,3]", r#"["a"]"#, "5", "{}"] {
        let body =
            format!(r#"{{"model":"m","prompt":{p},"messages":[{{"role":"user","content":"x"}}]}}"#);
        assert_eq!(render(&body), Err(NoPrompt::PromptNotString), "{p}");
    }
}

#[test]
fn no_prompt_reasons() {
    assert_eq!(render(r#"{"model":"m"}"#), Err(NoPrompt::NoPromptField));
    assert_eq!(
        render(r#"{"model":"m","messages":"hi"}"#),
        Err(NoPrompt::MessagesNotList)
    );
    assert_eq!(
        render(r#"{"model":"m","messages":null}"#),
        Err(NoPrompt::MessagesNotList)
    );
    assert_eq!(
        render(r#"{"model":"m","input":5}"#),
        Err(NoPrompt::InputNotStringOrList)
    );
    assert_eq!(
        render(r#"{"model":"m","input":{"role":"user"},"instructions":"x"}"#),
        Err(NoPrompt::InputNotStringOrList)
    );
}

#[test]
fn chat_renders_chatml_in_order() {
    let body = r#"{"model":"m","messages":[
        {"role":"system","content":"You are a helpful assistant."},
        {"role":"user","content":"What is Kthena?"}]}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is Kthena?<|im_end|>\n"
    );
}

#[test]
fn top_level_system_comes_first_when_it_parses() {
    let body = r#"{"model":"m","system":"S","messages":[{"role":"user","content":"U"}]}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    );
    let body = r#"{"model":"m","system":[{"type":"text","text":"A"},{"text":"B"}],"messages":[]}"#;
    assert_eq!(ok(body), "<|im_start|>system\nA\nB<|im_end|>\n");
    // A system that does not parse is not added.
    let body = r#"{"model":"m","system":5,"messages":[{"role":"user","content":"U"}]}"#;
    assert_eq!(ok(body), "<|im_start|>user\nU<|im_end|>\n");
    // `system` applies to chat only.
    assert_eq!(ok(r#"{"model":"m","system":"S","prompt":"P"}"#), "P");
    assert_eq!(
        ok(r#"{"model":"m","system":"S","input":"I"}"#),
        "<|im_start|>user\nI<|im_end|>\n"
    );
}

#[test]
fn chat_content_parts_keep_text_kinds_only() {
    let body = r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"one"},
        {"type":"image_url","image_url":{"url":"http://x"}},
        {"type":"input_text","text":"two"},
        {"type":"output_text","text":"three"},
        {"text":"four"},
        {"type":"text","text":5},
        "bare string",
        {"type":"text"}
    ]}]}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>user\none\ntwo\nthree\nfour<|im_end|>\n"
    );
}

#[test]
fn chat_skips_bad_messages_and_keeps_empty_role() {
    let body = r#"{"model":"m","messages":[
        "not an object",
        {"role":5,"content":"bad role"},
        {"content":"no role"},
        {"role":"user"},
        {"role":"user","content":null},
        {"role":"assistant","content":[{"type":"image_url"}]},
        {"role":"tool","tool_calls":[]},
        {"role":"","content":"empty role"},
        {"role":"user","content":""}
    ]}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>\nempty role<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
    );
    assert_eq!(ok(r#"{"model":"m","messages":[]}"#), "");
}

#[test]
fn precedence_prompt_then_messages_then_input() {
    let body = r#"{"model":"m","input":"I","messages":[{"role":"user","content":"M"}]}"#;
    assert_eq!(ok(body), "<|im_start|>user\nM<|im_end|>\n");
}

#[test]
fn responses_instructions_and_string_input() {
    let body = r#"{"model":"m","instructions":"Be brief.","input":"Hi"}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>developer\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
    let body = r#"{"model":"m","instructions":"","input":"Hi"}"#;
    assert_eq!(ok(body), "<|im_start|>user\nHi<|im_end|>\n");
    let body = r#"{"model":"m","instructions":7,"input":"Hi"}"#;
    assert_eq!(ok(body), "<|im_start|>user\nHi<|im_end|>\n");
}

#[test]
fn responses_list_input_filters_items() {
    let body = r#"{"model":"m","instructions":"D","input":[
        {"role":"user","content":"a"},
        {"type":"message","role":"assistant","content":[{"type":"output_text","text":"b"}]},
        {"type":"","role":"user","content":[{"type":"input_text","text":"c"},{"type":"input_image"}]},
        {"type":"function_call","role":"assistant","content":"skip"},
        {"type":"message","role":"","content":"empty role skipped"},
        {"type":"message","content":"no role"},
        {"role":"user","content":7},
        "text item"
    ]}"#;
    assert_eq!(
        ok(body),
        "<|im_start|>developer\nD<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
    );
    assert_eq!(ok(r#"{"model":"m","input":[]}"#), "");
}

/// Kthena decodes the body into `map[string]interface{}` (`router/router.go` lines 268, 707-710
/// at 3cc0572) and reads `type` with a type assertion: `contentMap["type"].(string)` for a part
/// (`utils/utils.go` line 162: the kind check runs only when `ok`) and `itemMap["type"].(string)`
/// for a Responses item (line 124: skipped only when `ok` and neither `""` nor `"message"`). A
/// `type` that is not a string fails the assertion, so the part or item is kept exactly as if it
/// had no `type`; the `text`, `role` and `content` checks that follow still apply (lines
/// 127-134, 169-172).
#[test]
fn a_type_that_is_not_a_string_counts_as_absent_as_in_go() {
    use crate::prompt::{Rendering, render as render_value};
    for t in [
        "null",
        "0",
        "1.5",
        "true",
        "false",
        r#"["text"]"#,
        r#"{"type":"text"}"#,
    ] {
        let chat = format!(
            r#"{{"model":"m","system":[{{"type":{t},"text":"S"}}],"messages":[
            {{"role":"user","content":[{{"type":"text","text":"a"}},{{"type":{t},"text":"b"}},
                {{"type":{t}}},{{"type":{t},"text":7}}]}},
            {{"role":"user","content":[{{"type":{t}}}]}}]}}"#
        );
        let want = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n";
        let responses = format!(
            r#"{{"model":"m","input":[
            {{"type":{t},"role":"user","content":"kept"}},
            {{"type":{t},"role":"assistant","content":[{{"type":{t},"text":"part"}}]}},
            {{"type":{t},"role":"","content":"empty role"}},
            {{"type":{t},"content":"no role"}},
            {{"type":{t},"role":"user","content":[{{"type":{t}}}]}},
            {{"type":"function_call","role":"user","content":"a string type still filters"}}]}}"#
        );
        let want_responses =
            "<|im_start|>user\nkept<|im_end|>\n<|im_start|>assistant\npart<|im_end|>\n";
        for (body, want) in [(chat, want), (responses, want_responses)] {
            assert_eq!(ok(&body), want, "type {t}: {body}");
            // The same through `serde_json::Value`, and in the affinity mode's rendering, which
            // adds nothing for text-only parts and message items.
            let value: serde_json::Value = serde_json::from_str(&body).unwrap();
            let map = value.as_object().unwrap();
            assert_eq!(render_value(map, Rendering::Kthena).unwrap(), want, "{t}");
            let engine = render_value(map, Rendering::Engine).unwrap();
            if body.contains("function_call") {
                assert!(engine.starts_with(want), "type {t}: {engine}");
            } else {
                assert_eq!(engine, want, "type {t}");
            }
        }
    }
}

#[test]
fn escapes_and_invalid_text_decode_like_go() {
    assert_eq!(ok(r#"{"model":"m","prompt":"\ud800x"}"#), "\u{FFFD}x");
    assert_eq!(ok(r#"{"model":"m","prompt":"\ud83d\ude00"}"#), "\u{1F600}");
    let body = b"{\"model\":\"m\",\"prompt\":\"\xE2\x82A\"}";
    assert_eq!(
        InferenceRequest::parse(body).unwrap().prompt.unwrap(),
        "\u{FFFD}\u{FFFD}A"
    );
}

#[test]
fn duplicate_keys_last_wins_and_keys_are_case_sensitive() {
    assert_eq!(ok(r#"{"model":"m","prompt":"a","prompt":"b"}"#), "b");
    assert_eq!(
        render(r#"{"model":"m","Prompt":"a"}"#),
        Err(NoPrompt::NoPromptField)
    );
}
