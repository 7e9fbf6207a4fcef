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
