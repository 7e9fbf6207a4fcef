//! What must hold for ANY request body, whatever bytes arrive: the property the fuzz target
//! (`fuzz/fuzz_targets/request.rs`, libFuzzer) checks, and the regression test replays over every
//! input in `fuzz/seeds/` and `fuzz/regressions/` (crashes the fuzzer found, kept forever).
//!
//! For a body of arbitrary bytes:
//! 1. parsing + rendering never panics, and gives the same result twice;
//! 2. where strict JSON (`serde_json`) accepts the body, the Go-lenient decoder gives the same value
//!    (leniency only ever widens what is accepted);
//! 3. a rendered prompt hashes to exactly `min(ceil(len / block), maxBlocks)` blocks, and the hashes
//!    of a prefix of the prompt are a prefix of its hashes (the chain property the index relies on);
//! 4. the hashing cost is bounded by the coverage: bytes past `block * maxBlocks` change nothing;
//! 5. the borrowed one-pass parse gives what the reference parse through a `serde_json::Value`
//!    gives, errors included.
//!
//! Each holds for both renderings, Kthena's and the affinity mode's ([`Rendering`]), and for a
//! body sent to an OpenAI path and to Anthropic's `/v1/messages` ([`Api`]).

use crate::hashing::BlockChain;
use crate::lenient_json;
use crate::prompt::Rendering;
use crate::request::{Api, InferenceRequest};

/// Panics (with the broken property) if any invariant fails for `body`.
pub fn check_request_body(body: &[u8]) {
    for api in [Api::ChatCompletions, Api::Messages] {
        for rendering in [Rendering::Kthena, Rendering::Engine] {
            check_rendering(body, api, rendering);
        }
    }
}

fn check_rendering(body: &[u8], api: Api, rendering: Rendering) {
    let first = InferenceRequest::parse_for(api, body, rendering);
    let again = InferenceRequest::parse_for(api, body, rendering);
    assert_eq!(
        first.as_ref().map_err(|e| e.to_string()),
        again.as_ref().map_err(|e| e.to_string()),
        "parsing is deterministic"
    );

    let reference = InferenceRequest::parse_by_value_for(api, body, rendering);
    assert_eq!(
        first.as_ref().map_err(|e| e.to_string()),
        reference.as_ref().map_err(|e| e.to_string()),
        "the borrowed parse equals the Value parse"
    );

    if let Ok(strict) = serde_json::from_slice::<serde_json::Value>(body) {
        let lenient = lenient_json::parse_value(body)
            .unwrap_or_else(|e| panic!("strict JSON accepted but the lenient decoder failed: {e}"));
        assert_eq!(lenient, strict, "lenient decoding changed a valid document");
    }

    let Ok(request) = first else { return };
    let Ok(prompt) = &request.prompt else { return };
    for chain in [
        BlockChain {
            block_size: 64,
            max_blocks: 128,
        },
        BlockChain {
            block_size: 3,
            max_blocks: 5,
        },
    ] {
        check_chain(chain, &request.model, prompt.as_bytes());
    }
}

fn check_chain(chain: BlockChain, model: &str, prompt: &[u8]) {
    let hashes = chain.hash(model, prompt);
    let expected = prompt
        .len()
        .div_ceil(chain.block_size)
        .min(chain.max_blocks);
    assert_eq!(hashes.len(), expected, "block count");

    // A prefix cut at a block boundary hashes to a prefix of the hashes.
    let cut = (prompt.len() / 2) / chain.block_size * chain.block_size;
    let prefix = chain.hash(model, &prompt[..cut]);
    assert_eq!(
        prefix[..],
        hashes[..prefix.len()],
        "chain property at {cut} bytes"
    );

    // Bytes past the coverage are never read.
    if prompt.len() > chain.coverage() {
        assert_eq!(chain.hash(model, &prompt[..chain.coverage()]), hashes);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::check_request_body;

    /// Every seed and every input the fuzzer ever crashed on.
    #[test]
    fn fuzz_seeds_and_regressions_hold() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut n = 0;
        for dir in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let body = std::fs::read(&path).unwrap();
                let result = std::panic::catch_unwind(|| check_request_body(&body));
                assert!(result.is_ok(), "{} breaks an invariant", path.display());
                n += 1;
            }
        }
        assert!(n >= 10, "the seed corpus is missing ({n} files)");
    }

    /// The hostile Messages seeds (issue 58) hold, and get the outcome a sender can rely on:
    /// routed with a prompt (invalid UTF-8 replaced, a huge tool input past the coverage, 100
    /// levels of nesting, wrong types skipped), and nesting past `serde_json`'s limit refused
    /// as not JSON, by both parsers alike.
    #[test]
    fn hostile_messages_bodies_get_defined_outcomes() {
        use crate::prompt::Rendering;
        use crate::request::{Api, InferenceRequest, RequestError};

        let seed = |name: &str| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fuzz/seeds")
                .join(name);
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let prompt = |body: &[u8]| {
            check_request_body(body);
            let r = InferenceRequest::parse_for(Api::Messages, body, Rendering::Engine).unwrap();
            assert_eq!(r.model, "m");
            r.prompt
        };
        let utf8 = prompt(&seed("messages-invalid-utf8.json")).unwrap();
        for text in [
            "sys\u{FFFD}",
            "a\u{FFFD}",
            "b\u{FFFD}",
            "r\u{FFFD}",
            "plain\u{FFFD}",
        ] {
            assert!(utf8.contains(text), "{text:?} in {utf8:?}");
        }
        let huge = prompt(&seed("messages-huge-tool-input.json")).unwrap();
        assert!(
            huge.len() > 30_000,
            "the input and the result: {}",
            huge.len()
        );
        assert!(huge.contains(&"z".repeat(20_000)) && huge.contains(&"r".repeat(12_000)));
        assert!(prompt(&seed("messages-deep.json")).is_ok());
        // Wrong types are skipped, the rest kept in order: the tools, the call (no name, no
        // input), its result, the document and the image; not the messages with no valid role.
        let wrong = prompt(&seed("messages-wrong-types-blocks.json")).unwrap();
        assert!(wrong.starts_with("<|tools:"), "{wrong}");
        let call = wrong.find("<|tool_call:|>{}").expect("the call");
        let result = wrong.find("<|im_start|>tool\n").expect("its result");
        assert!(
            call < result && wrong[result..].contains("<|part:image_url:"),
            "{wrong}"
        );
        assert!(!wrong.contains("no role"), "{wrong}");
        // Nesting past the limit, in a tool input: refused as not JSON (a 400), never a panic.
        let too_deep = format!(
            r#"{{"model":"m","messages":[{{"role":"assistant","content":[{{"type":"tool_use","name":"t","input":{}1{}}}]}}]}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        check_request_body(too_deep.as_bytes());
        for parsed in [
            InferenceRequest::parse_for(Api::Messages, too_deep.as_bytes(), Rendering::Engine),
            InferenceRequest::parse_by_value_for(
                Api::Messages,
                too_deep.as_bytes(),
                Rendering::Engine,
            ),
        ] {
            assert!(
                matches!(parsed, Err(RequestError::NotJson(_))),
                "{parsed:?}"
            );
        }
    }

    #[test]
    fn long_and_escaped_bodies_hold() {
        // Past the coverage of both chains, and a valid surrogate pair next to plain text.
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(9000));
        check_request_body(body.as_bytes());
        let strict_only = br#"{"model":"m","prompt":"\ud83d\ude00 ok"}"#;
        check_request_body(strict_only);
    }
}
