//! `/tokenize` in vLLM's and SGLang's shapes, as Kthena's router tokenizer calls them: the
//! tokens are the ones the cache hashes for the same request.

use serde_json::{Value, json};

use crate::engine::{EngineConfig, EngineKind};
use crate::tests::{fast, post, start_named};

async fn tokenize(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = post(&format!("{base}{path}"), &body).await;
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn prompt_tokens(base: &str, path: &str, body: Value) -> Value {
    let r: Value = post(&format!("{base}{path}"), &body)
        .await
        .json()
        .await
        .unwrap();
    r["usage"]["prompt_tokens"].clone()
}

#[tokio::test]
async fn vllm_tokenize_counts_what_the_cache_counts() {
    let (base, _) = start_named("sim-0", fast()).await;
    let messages = json!([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is a prefix cache?"}
    ]);
    // Kthena's chat request to vLLM.
    let chat = json!({"model": "m", "messages": messages, "add_special_tokens": false,
        "add_generation_prompt": true, "return_token_strs": false});
    let (status, r) = tokenize(&base, "/tokenize", chat).await;
    assert_eq!(status, 200);
    let expected = prompt_tokens(
        &base,
        "/v1/chat/completions",
        json!({"model": "m", "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(r["count"], expected);
    assert_eq!(
        r["tokens"].as_array().unwrap().len(),
        r["count"].as_u64().unwrap() as usize
    );
    assert_eq!(r["max_model_len"], 131_072);
    assert_eq!(r["token_strs"], Value::Null);

    // Kthena's completion request, token strings asked for: they spell the prompt.
    let prompt = "The quick brown fox, again.";
    let completion = json!({"model": "m", "prompt": prompt, "add_special_tokens": true,
        "return_token_strs": true});
    let (_, r) = tokenize(&base, "/tokenize", completion).await;
    let expected = prompt_tokens(
        &base,
        "/v1/completions",
        json!({"model": "m", "prompt": prompt, "max_tokens": 1}),
    )
    .await;
    assert_eq!(r["count"], expected);
    let strs: Vec<String> = serde_json::from_value(r["token_strs"].clone()).unwrap();
    assert_eq!(strs.concat(), prompt);

    // `model` may be left out; another model is not served; a prompt is required.
    assert_eq!(
        tokenize(&base, "/tokenize", json!({"prompt": prompt}))
            .await
            .1["count"],
        expected
    );
    assert_eq!(
        tokenize(&base, "/tokenize", json!({"model": "x", "prompt": "a"}))
            .await
            .0,
        404
    );
    assert_eq!(
        tokenize(&base, "/tokenize", json!({"model": "m"})).await.0,
        400
    );
}

#[tokio::test]
async fn sglang_tokenize_has_sglangs_shape() {
    let (base, _) = start_named(
        "sim-0",
        EngineConfig {
            kind: EngineKind::Sglang,
            ..fast()
        },
    )
    .await;
    for path in ["/tokenize", "/v1/tokenize"] {
        let (status, r) = tokenize(
            &base,
            path,
            json!({"model": "m", "prompt": "a b c", "add_special_tokens": true}),
        )
        .await;
        assert_eq!(status, 200);
        let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["count", "max_model_len", "tokens"]);
        assert_eq!(r["count"], 3);
    }
    // A list of prompts: a list of token lists and of counts.
    let (_, r) = tokenize(
        &base,
        "/tokenize",
        json!({"model": "m", "prompt": ["a b", "c"]}),
    )
    .await;
    assert_eq!(r["count"], json!([2, 1]));
    assert_eq!(r["tokens"].as_array().unwrap().len(), 2);
    // Kthena also sends SGLang chat messages.
    let messages = json!([{"role": "user", "content": "hi there"}]);
    let (_, r) = tokenize(
        &base,
        "/tokenize",
        json!({"model": "m", "messages": messages, "add_special_tokens": false}),
    )
    .await;
    let expected = prompt_tokens(
        &base,
        "/v1/chat/completions",
        json!({"model": "m", "messages": messages, "max_tokens": 1}),
    )
    .await;
    assert_eq!(r["count"], expected);
}

/// An engine the router did not render for (`--chat-template llama3 --tokenizer dense`):
/// `/tokenize` answers the Llama 3 rendering in dense tokens, the cache and the usage count
/// the same tokens, and a follow-up turn hits the first turn's prompt and answer.
#[tokio::test]
async fn another_template_and_density_are_what_the_engine_caches_and_counts() {
    use crate::template::ChatTemplate;
    use crate::tokenizer::SimTokenizer;
    let (base, _) = start_named(
        "sim-0",
        EngineConfig {
            tokenizer: SimTokenizer::Dense,
            chat_template: ChatTemplate::Llama3,
            ..fast()
        },
    )
    .await;
    let system = "alpha harbor juniper cedar nebula ".repeat(20);
    let first = json!([{"role": "system", "content": system}, {"role": "user", "content": "What is a prefix cache?"}]);
    let rendered = format!(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{}<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nWhat is a prefix cache?<|eot_id|>",
        system.trim()
    );
    let (_, r) = tokenize(
        &base,
        "/tokenize",
        json!({"model": "m", "messages": first, "return_token_strs": true}),
    )
    .await;
    let strs: Vec<String> = serde_json::from_value(r["token_strs"].clone()).unwrap();
    assert_eq!(strs.concat(), rendered);
    assert_eq!(
        r["tokens"],
        json!(SimTokenizer::Dense.ids(rendered.as_bytes()))
    );
    // ~3.4 bytes per token on these words, against the default's ~4.2.
    let text = system.as_bytes();
    let (dense, default) = (
        SimTokenizer::Dense.ids(text).len(),
        SimTokenizer::Builtin.ids(text).len(),
    );
    assert!(
        text.len() < 35 * dense / 10 && text.len() > 4 * default,
        "{} bytes: {dense} dense tokens, {default} default ones",
        text.len()
    );
    let chat = |messages: &Value| json!({"model": "m", "messages": messages, "max_tokens": 4});
    let answer: Value = post(&format!("{base}/v1/chat/completions"), &chat(&first))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["usage"]["prompt_tokens"], r["count"]);
    let said = answer["choices"][0]["message"]["content"].clone();
    let mut next = first.as_array().unwrap().clone();
    next.extend([
        json!({"role": "assistant", "content": said}),
        json!({"role": "user", "content": "And?"}),
    ]);
    let again: Value = post(&format!("{base}/v1/chat/completions"), &chat(&json!(next)))
        .await
        .json()
        .await
        .unwrap();
    // The whole first prompt and answer are cached, in 16-token blocks (the last block of a
    // turn can be cut by the next one's tokens).
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let first_turn = SimTokenizer::Dense
        .ids(
            format!(
                "{rendered}{}",
                ChatTemplate::Llama3.assistant_turn(said.as_str().unwrap())
            )
            .as_bytes(),
        )
        .len() as u64;
    assert!(
        cached + 32 > first_turn && cached <= first_turn,
        "cached {cached} of {first_turn}"
    );
}

/// vLLM's `continue_final_message`: the chat rendered up to the final message's text, left
/// open; its tokens are the first tokens of the whole conversation's.
#[tokio::test]
async fn continuing_the_final_message_tokenizes_a_prefix_of_the_whole() {
    let (base, _) = start_named("sim-0", fast()).await;
    let whole = json!([
        {"role": "system", "content": "Read the document."},
        {"role": "user", "content": "alpha beta gamma delta and the question"}
    ]);
    let cut = json!([
        {"role": "system", "content": "Read the document."},
        {"role": "user", "content": "alpha beta gamma delta"}
    ]);
    let ask = |messages: &Value, continuing: bool| {
        json!({"model": "m", "messages": messages, "add_special_tokens": false,
               "add_generation_prompt": false, "continue_final_message": continuing})
    };
    let (_, all) = tokenize(&base, "/tokenize", ask(&whole, false)).await;
    let (status, part) = tokenize(&base, "/tokenize", ask(&cut, true)).await;
    assert_eq!(status, 200);
    let (all, part) = (
        all["tokens"].as_array().unwrap(),
        part["tokens"].as_array().unwrap(),
    );
    assert!(part.len() < all.len());
    assert_eq!(part[..], all[..part.len()]);
    // Closed, the same messages end with what closes the message: not a prefix.
    let (_, closed) = tokenize(&base, "/tokenize", ask(&cut, false)).await;
    assert!(closed["tokens"].as_array().unwrap().len() > part.len());
    // A final message with no text cannot be continued (vLLM answers 400).
    let empty = json!([{"role": "user", "content": "  "}]);
    let (status, _) = tokenize(&base, "/tokenize", ask(&empty, true)).await;
    assert_eq!(status, 400);
}
