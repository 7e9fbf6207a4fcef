//! The sim as a Hugging Face model directory: a `tokenizer.json` the sim can run
//! (`--tokenizer-json`) and the picker's `file` tokenizer source can load, and a
//! `tokenizer_config.json` whose `chat_template` renders chat exactly as the sim does
//! (`model-sim --write-tokenizer DIR` writes both).
//!
//! The default `tokenizer.json` ([`default_tokenizer_json`]) is a deterministic byte-level BPE
//! (GPT-2's pre-tokenizer, no normalizer, no post-processor): `<|im_start|>` (0) and
//! `<|im_end|>` (1) as special tokens, the 256 byte symbols, then one token per merge. The merges
//! spell each word of [`VOCABULARY`] (the benchmark's words and the chat roles) left to right,
//! with and without its leading space; the merges of words with a leading space rank first, so
//! such a word is one token. Other text falls back to shorter pieces, down to single bytes.
//!
//! The built-in tokenizer ([`crate::tokenizer`]) cannot be written as a `tokenizer.json` (its
//! tokens are any 1-6 bytes, its ids a hash of them), so a sim that must agree with the picker's
//! `file` source runs this one instead; the default sim keeps the built-in one.

use std::path::Path;

use serde_json::{Map, Value, json};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::tokenizer::SimTokenizer;

/// The words the default `tokenizer.json` has tokens for: prefix-bench's vocabulary
/// (`prefix_bench::workload`) and the chat roles.
pub const VOCABULARY: [&str; 67] = [
    "alpha",
    "bravo",
    "cache",
    "delta",
    "engine",
    "fabric",
    "gamma",
    "harbor",
    "index",
    "jungle",
    "kernel",
    "ledger",
    "matrix",
    "nebula",
    "orbit",
    "prefix",
    "quartz",
    "router",
    "signal",
    "tensor",
    "update",
    "vector",
    "window",
    "xenon",
    "yield",
    "zephyr",
    "amber",
    "basalt",
    "cobalt",
    "dune",
    "ember",
    "fjord",
    "granite",
    "hollow",
    "ivory",
    "jasper",
    "kiln",
    "lumen",
    "mesa",
    "nickel",
    "onyx",
    "pylon",
    "quill",
    "ridge",
    "slate",
    "timber",
    "umber",
    "valley",
    "willow",
    "yarrow",
    "azure",
    "birch",
    "cedar",
    "delta",
    "elm",
    "fern",
    "grove",
    "heath",
    "iris",
    "juniper",
    "kelp",
    "lotus",
    "maple",
    "nectar",
    "system",
    "user",
    "assistant",
];

/// The sim's chat rendering as a Jinja chat template (Hugging Face's conventions): each message
/// whose `role` is a string and whose content is a string, or a list with text parts (joined by
/// `\n`), as `<|im_start|>{role}\n{content}<|im_end|>\n`; no generation prompt; `tools`
/// ignored. Exactly the sim's rendering of a chat request without a top-level `system`.
pub const CHAT_TEMPLATE: &str = include_str!("chat_template.jinja");

/// The special tokens, in id order.
const SPECIAL: [&str; 2] = ["<|im_start|>", "<|im_end|>"];

/// The default `tokenizer.json` (see the module header); the same text on every call.
pub fn default_tokenizer_json() -> String {
    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort_unstable();
    let mut vocab = Map::new();
    for (id, s) in SPECIAL.iter().enumerate() {
        vocab.insert((*s).to_owned(), json!(id));
    }
    for c in &alphabet {
        vocab.insert(c.to_string(), json!(vocab.len()));
    }
    let merges = merges();
    for (a, b) in &merges {
        vocab.insert(format!("{a}{b}"), json!(vocab.len()));
    }
    let added: Vec<Value> = SPECIAL
        .iter()
        .enumerate()
        .map(|(id, s)| {
            json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<Value>>(),
        },
    })
    .to_string()
}

/// The merges that spell each word left to right: those of `Ġword` (a word after a space)
/// first, then those of the bare words; each group by the length of what it makes, then
/// alphabetically. No merge twice.
fn merges() -> Vec<(String, String)> {
    let mut words: Vec<&str> = VOCABULARY.to_vec();
    words.sort_unstable();
    words.dedup();
    let mut out: Vec<(String, String)> = Vec::new();
    for prefix in ["Ġ", ""] {
        let mut group: Vec<(String, String)> = Vec::new();
        for w in &words {
            let word = format!("{prefix}{w}");
            let chars: Vec<char> = word.chars().collect();
            let mut left = chars[0].to_string();
            for c in &chars[1..] {
                group.push((left.clone(), c.to_string()));
                left.push(*c);
            }
        }
        group.sort_by(|a, b| {
            let (la, lb) = (a.0.len() + a.1.len(), b.0.len() + b.1.len());
            la.cmp(&lb).then_with(|| a.cmp(b))
        });
        group.dedup();
        for m in group {
            let made = format!("{}{}", m.0, m.1);
            if !out.iter().any(|(a, b)| format!("{a}{b}") == made) {
                out.push(m);
            }
        }
    }
    out
}

/// The `tokenizer_config.json` beside the default tokenizer: the chat template and the special
/// tokens (Hugging Face's keys).
pub fn tokenizer_config_json() -> String {
    serde_json::to_string_pretty(&json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "model_max_length": crate::server::MAX_MODEL_LEN,
        "chat_template": CHAT_TEMPLATE,
    }))
    .expect("a JSON value serializes")
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if missing).
pub fn write(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tokenizer.json"), default_tokenizer_json())?;
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer_config_json())?;
    Ok(())
}

/// Loads a `tokenizer.json` for the sim; the error names the path.
pub fn load(path: &Path) -> anyhow::Result<SimTokenizer> {
    let t = tokenizers::Tokenizer::from_file(path)
        .map_err(|e| anyhow::anyhow!("cannot load the tokenizer {}: {e}", path.display()))?;
    Ok(SimTokenizer::Json(std::sync::Arc::new(t)))
}

/// The default tokenizer, in memory.
pub fn default_tokenizer() -> SimTokenizer {
    let t = tokenizers::Tokenizer::from_bytes(default_tokenizer_json())
        .expect("the default tokenizer.json loads");
    SimTokenizer::Json(std::sync::Arc::new(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::Tokens;
    use proptest::prelude::*;

    /// Built once: loading the JSON takes a few milliseconds.
    static TOKENIZER: std::sync::LazyLock<SimTokenizer> =
        std::sync::LazyLock::new(default_tokenizer);

    fn pieces(t: &SimTokenizer, text: &str) -> Vec<String> {
        t.strs(text.as_bytes())
    }

    #[test]
    fn a_vocabulary_word_after_a_space_is_one_token_and_special_tokens_are_whole() {
        let t = default_tokenizer();
        assert_eq!(
            pieces(&t, "alpha bravo juniper"),
            ["alp", "ha", "Ġbravo", "Ġjuniper"]
        );
        assert_eq!(
            pieces(&t, "<|im_start|>user\nhi<|im_end|>\n"),
            ["<|im_start|>", "user", "Ċ", "h", "i", "<|im_end|>", "Ċ"]
        );
        assert_eq!(default_tokenizer_json(), default_tokenizer_json());
        let ids = t.ids(b"<|im_start|>");
        assert_eq!(ids, [0]);
    }

    #[test]
    fn the_files_are_written_and_load() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path()).unwrap();
        let t = load(&dir.path().join("tokenizer.json")).unwrap();
        assert_eq!(
            t.ids(b" delta cedar"),
            default_tokenizer().ids(b" delta cedar")
        );
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["chat_template"], CHAT_TEMPLATE);
        let err = load(&dir.path().join("missing.json")).unwrap_err();
        assert!(err.to_string().contains("missing.json"), "{err}");
    }

    /// deploy/local/tokenizer holds what `--write-tokenizer` writes (the docs' `file` example
    /// and the chart's point at it).
    #[test]
    fn the_shipped_tokenizer_files_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/local/tokenizer");
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let hint = "run: model-sim --write-tokenizer deploy/local/tokenizer";
        assert_eq!(read("tokenizer.json"), default_tokenizer_json(), "{hint}");
        assert_eq!(
            read("tokenizer_config.json"),
            tokenizer_config_json(),
            "{hint}"
        );
    }

    proptest! {
        /// Ids and tokens agree, and a prompt and its continuation share all but the last
        /// tokens of the shorter one (what the sim's prefix cache relies on) on benchmark-like
        /// text.
        #[test]
        fn a_continuation_keeps_the_shorter_prompts_tokens_but_its_last_few(
            words in proptest::collection::vec(0..VOCABULARY.len(), 1..30),
            cut in 0usize..30,
        ) {
            let t = &*TOKENIZER;
            let text: String = words.iter().map(|&w| format!("{} ", VOCABULARY[w])).collect();
            let cut = cut.min(words.len());
            let short: String = words[..cut].iter().map(|&w| format!("{} ", VOCABULARY[w])).collect();
            let (Tokens::Ids(a), Tokens::Ids(b)) = (t.tokens(short.as_bytes()), t.tokens(text.as_bytes())) else {
                panic!("a tokenizer.json gives ids");
            };
            prop_assert_eq!(&b, &t.ids(text.as_bytes()));
            let keep = a.len().saturating_sub(2);
            prop_assert_eq!(&a[..keep], &b[..keep]);
        }
    }
}
