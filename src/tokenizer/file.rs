//! A Hugging Face `tokenizer.json` loaded and run in process (feature `tokenizer-file`): text to
//! the ids the engine's tokenizer computes, without a network hop. [`FileSource`] is the
//! `file` source of `picker.tokenizer`: the `tokenizer.json` and the chat template beside it
//! ([`super::chat_template`]), asked as the engine's `/tokenize` is (chat rendered by the
//! template, then encoded without special tokens; text encoded with them).
//!
//! Built on the `tokenizers` crate without default features plus `fancy-regex` (pure Rust: no
//! Oniguruma, no C++ suffix arrays).

use std::path::{Path, PathBuf};

use thiserror::Error;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::chat_template::{ChatTemplate, TemplateError};
use super::known_prefix::{KnownPrefixes, join_points, point_digests};
use super::{Prompt, TokenizeError, TokenizeInput, Tokens};
use crate::prompt::stable_cut::continue_final_message;

/// A tokenizer read from a `tokenizer.json`.
pub struct FileTokenizer(tokenizers::Tokenizer);

impl std::fmt::Debug for FileTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTokenizer")
            .field("vocab_size", &self.0.get_vocab_size(true))
            .finish()
    }
}

/// A `tokenizer.json` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FileTokenizerError {
    #[error("cannot load the tokenizer {source_name}: {message}")]
    Load {
        source_name: String,
        message: String,
    },
    #[error("cannot encode with the tokenizer: {0}")]
    Encode(String),
}

impl FileTokenizer {
    /// Reads `path` (a `tokenizer.json`).
    pub fn from_file(path: &Path) -> Result<FileTokenizer, FileTokenizerError> {
        tokenizers::Tokenizer::from_file(path)
            .map(FileTokenizer)
            .map_err(|e| FileTokenizerError::Load {
                source_name: path.display().to_string(),
                message: e.to_string(),
            })
    }

    /// Parses the text of a `tokenizer.json`.
    pub fn from_json(json: &[u8]) -> Result<FileTokenizer, FileTokenizerError> {
        tokenizers::Tokenizer::from_bytes(json)
            .map(FileTokenizer)
            .map_err(|e| FileTokenizerError::Load {
                source_name: "(JSON text)".to_owned(),
                message: e.to_string(),
            })
    }

    /// The ids of `text`, with the post-processor's special tokens (a BOS, say) when
    /// `add_special_tokens`; special tokens written in the text are matched either way.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Tokens, FileTokenizerError> {
        let encoding = self
            .0
            .encode_fast(text, add_special_tokens)
            .map_err(|e| FileTokenizerError::Encode(e.to_string()))?;
        Ok(Tokens::from(encoding.get_ids().to_vec()))
    }
}

/// The `file` tokenizer source: a `tokenizer.json` and its model's chat template.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    tokenizer: FileTokenizer,
    /// `Err` when the directory has a template that does not load (chat then falls back).
    template: Result<ChatTemplate, TemplateError>,
    /// `Err` (why) when this tokenizer's tokens cannot be joined from parts: every text is
    /// then tokenized whole.
    joins: Result<Joins, String>,
    /// xxh3-64 of the files read: a reload compares it.
    digest: u64,
}

/// A tokenization: its tokens, and how many of them the tokenizer computed (the rest were
/// known: [`FileSource::tokenize_known`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tokenized {
    pub tokens: Tokens,
    pub computed: usize,
}

impl FileSource {
    /// Reads `path` (a `tokenizer.json`) and the chat template beside it. A missing or broken
    /// `tokenizer.json` is an error; a missing or broken template is not (see
    /// [`FileSource::template_error`]): text prompts still tokenize.
    pub fn load(path: &Path) -> Result<FileSource, FileTokenizerError> {
        let bytes = std::fs::read(path).map_err(|e| FileTokenizerError::Load {
            source_name: path.display().to_string(),
            message: e.to_string(),
        })?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
            .map(FileTokenizer)
            .map_err(|e| FileTokenizerError::Load {
                source_name: path.display().to_string(),
                message: e.to_string(),
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let template = ChatTemplate::from_dir(dir).and_then(|t| {
            t.ok_or_else(|| TemplateError::Missing {
                path: dir.join("tokenizer_config.json").display().to_string(),
            })
        });
        let mut digest = xxhash_rust::xxh3::Xxh3::new();
        digest.update(&bytes);
        for beside in ["tokenizer_config.json", "chat_template.jinja"] {
            if let Ok(b) = std::fs::read(dir.join(beside)) {
                digest.update(beside.as_bytes());
                digest.update(&b);
            }
        }
        let joins = Joins::check(&tokenizer, template.as_ref().ok());
        if let Err(why) = &joins {
            tracing::info!(path = %path.display(), %why, "the file tokenizer tokenizes every head whole");
        }
        Ok(FileSource {
            path: path.to_path_buf(),
            tokenizer,
            template,
            joins,
            digest: digest.digest(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why chat prompts cannot be rendered, if they cannot (no template, or one that does not
    /// parse).
    pub fn template_error(&self) -> Option<&TemplateError> {
        self.template.as_ref().err()
    }

    /// Why texts are tokenized whole, if they are (the tokenizer failed the join check).
    pub fn join_error(&self) -> Option<&str> {
        match &self.joins {
            Ok(j) if j.off.load(Ordering::Relaxed) => Some("a sampled join differed"),
            Ok(_) => None,
            Err(why) => Some(why),
        }
    }

    /// The files' digest (equal files, equal digests).
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// The ids the engine's `/tokenize` answers for `input`, the text tokenized whole.
    pub fn tokenize(&self, input: &TokenizeInput<'_>) -> Result<Tokens, TokenizeError> {
        let (text, special) = self.text_of(input)?;
        self.encode(&text, special)
    }

    /// [`FileSource::tokenize`], tokenizing only the text after the longest prefix known from
    /// an earlier call (up to its last join point: [`super::known_prefix`]); the text whole
    /// when this tokenizer's tokens cannot be joined.
    pub fn tokenize_known(&self, input: &TokenizeInput<'_>) -> Result<Tokenized, TokenizeError> {
        let (text, special) = self.text_of(input)?;
        let joins = match &self.joins {
            Ok(j) if !j.off.load(Ordering::Relaxed) => j,
            _ => {
                let tokens = self.encode(&text, special)?;
                let computed = tokens.len();
                return Ok(Tokenized { tokens, computed });
            }
        };
        // The text's join points, then its end: a later text that has a join point there
        // (an added token that starts the next message) continues it whole.
        let mut points = join_points(&text, &joins.splits);
        let interior = points.len();
        points.push(text.len());
        let digests = point_digests(0, &text, &points);
        let known = joins.known.longest(&digests);
        let from = known.as_ref().map(|k| k.point);
        let (start, mut core) = match known {
            Some(k) => (points[k.point], k.tokens),
            None => (0, Vec::new()),
        };
        let later = &points[from.map_or(0, |i| i + 1).min(interior)..interior];
        let before = core.len();
        let mut counts = encode_parts(&self.tokenizer, &text, start, later, &mut core)
            .map_err(|e| self.encode_error(e))?;
        counts.push(core.len());
        let mut computed = core.len() - before;
        let check =
            from.is_some() && joins.joined.fetch_add(1, Ordering::Relaxed) % VERIFY_EVERY == 0;
        if check {
            let whole = self.encode(&text, false)?;
            computed += whole.len();
            if whole[..] != core[..] {
                joins.off.store(true, Ordering::Relaxed);
                tracing::warn!(path = %self.path.display(), "a joined tokenization differed from the whole text's: tokenizing every head whole from now on");
                let tokens = self.encode(&text, special)?;
                computed += tokens.len();
                return Ok(Tokenized { tokens, computed });
            }
        }
        // The points from the known one on, with their counts (the known one's: `before`;
        // the text's end: all of them).
        let (kept, counts): (&[u64], Vec<usize>) = match from {
            None => (&digests[..], counts),
            Some(from) if from == interior => (&[], Vec::new()),
            Some(from) => (
                &digests[from..],
                std::iter::once(before).chain(counts).collect(),
            ),
        };
        joins.known.insert(kept, &counts, core.clone());
        let tokens = match special {
            true => [&joins.first[..], &core, &joins.last[..]].concat(),
            false => core,
        };
        Ok(Tokenized {
            tokens: Tokens::from(tokens),
            computed,
        })
    }

    fn encode(&self, text: &str, special: bool) -> Result<Tokens, TokenizeError> {
        self.tokenizer
            .encode(text, special)
            .map_err(|e| self.encode_error(e))
    }

    fn encode_error(&self, e: FileTokenizerError) -> TokenizeError {
        TokenizeError::Encode {
            path: self.path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// The text the engine encodes for `input`, and whether with special tokens.
    fn text_of<'a>(
        &self,
        input: &TokenizeInput<'a>,
    ) -> Result<(std::borrow::Cow<'a, str>, bool), TokenizeError> {
        let path = || self.path.display().to_string();
        match input.prompt() {
            Prompt::Text(text) => Ok((text.into(), input.add_special_tokens())),
            Prompt::Chat { messages, tools } => {
                let template = self
                    .template
                    .as_ref()
                    .map_err(|e| TokenizeError::Template {
                        path: path(),
                        message: e.to_string(),
                    })?;
                let template_error = |message: String| TokenizeError::Template {
                    path: path(),
                    message,
                };
                let mut rendered = template
                    .render(messages, tools, input.generation_prompt())
                    .map_err(|e| template_error(e.to_string()))?;
                if input.continue_final() {
                    let text = final_text(messages).ok_or_else(|| {
                        template_error(
                            "continue_final_message: the final message has no text".into(),
                        )
                    })?;
                    let cut = continue_final_message(&rendered, &text)
                        .ok_or_else(|| {
                            template_error(
                                "continue_final_message: the final message is not in the rendering"
                                    .into(),
                            )
                        })?
                        .len();
                    rendered.truncate(cut);
                }
                Ok((rendered.into(), input.add_special_tokens()))
            }
        }
    }
}

/// One joined tokenization in this many (the first included) is checked against the whole
/// text's; a difference turns joins off for good.
const VERIFY_EVERY: u64 = 256;
/// Texts whose tokens [`Joins`] keeps at their join points, and their tokens together (4
/// bytes each: 16 MiB).
const KNOWN_TEXTS: usize = 4096;
const KNOWN_TOKENS: usize = 4 << 20;

/// How a text's tokens are joined from parts, for a tokenizer that passed [`Joins::check`].
#[derive(Debug)]
struct Joins {
    /// Added tokens the chat template writes: a text is split before each.
    splits: Vec<String>,
    /// The post-processor's special tokens before a text's own tokens, and after.
    first: Vec<u32>,
    last: Vec<u32>,
    known: KnownPrefixes,
    /// Joined tokenizations so far (every [`VERIFY_EVERY`]th is checked).
    joined: AtomicU64,
    /// A checked join differed: tokenize whole.
    off: AtomicBool,
}

impl Joins {
    /// Whether `tokenizer`'s tokens join at [`join_points`] (an error says why not): no
    /// truncation or padding, special tokens only around the text, and a probe text's tokens
    /// joined from its parts equal to its tokens whole.
    fn check(tokenizer: &FileTokenizer, template: Option<&ChatTemplate>) -> Result<Joins, String> {
        let t = &tokenizer.0;
        if t.get_truncation().is_some() || t.get_padding().is_some() {
            return Err("the tokenizer.json truncates or pads".into());
        }
        let mut splits: Vec<String> = t
            .get_added_tokens_decoder()
            .into_values()
            .filter(|a| !a.lstrip && !a.rstrip && !a.single_word && !a.normalized)
            .map(|a| a.content)
            .filter(|c| !c.is_empty() && template.is_some_and(|t| t.writes(c)))
            .collect();
        splits.sort_unstable();
        let encode = |text: &str, special: bool| {
            tokenizer
                .encode(text, special)
                .map(|t| t.to_vec())
                .map_err(|e| e.to_string())
        };
        let (with, without) = (encode("a b", true)?, encode("a b", false)?);
        let at = (0..=with.len().saturating_sub(without.len()))
            .find(|&i| with[i..].starts_with(&without))
            .filter(|_| !without.is_empty())
            .ok_or("the special tokens are not around the text's own")?;
        let (first, last) = (with[..at].to_vec(), with[at + without.len()..].to_vec());
        let probe = probe_text(&splits);
        let whole = encode(&probe, false)?;
        let mut joined = Vec::new();
        encode_parts(
            tokenizer,
            &probe,
            0,
            &join_points(&probe, &splits),
            &mut joined,
        )
        .map_err(|e| e.to_string())?;
        if joined != whole {
            return Err(
                "a probe text's tokens joined from its parts differ from its tokens whole".into(),
            );
        }
        if encode(&probe, true)? != [&first[..], &whole, &last[..]].concat() {
            return Err("the special tokens of a probe text are not around its own".into());
        }
        Ok(Joins {
            splits,
            first,
            last,
            known: KnownPrefixes::new(KNOWN_TEXTS, KNOWN_TOKENS),
            joined: AtomicU64::new(0),
            off: AtomicBool::new(false),
        })
    }
}

/// A text that crosses every kind of join point: words, digits, punctuation, whitespace runs,
/// newlines, non-ASCII, and each of `splits` between parts.
fn probe_text(splits: &[String]) -> String {
    const PART: &str = "Hello world, it's 2026: the  quick\tbrown fox's 12345 jumps.\n\nOver the lazy dog  \n caf\u{e9} \u{4e16}\u{754c} \u{2014} na\u{ef}ve words, 7 more words ";
    let mut text = String::new();
    for i in 0..12 {
        text.push_str(PART);
        if let Some(s) = splits.get(i % splits.len().max(1)) {
            text.push_str(s);
            text.push_str("user\n");
        }
    }
    text
}

/// Encodes `text[start..]` without special tokens, part by part at `points` (each after
/// `start`), appending to `tokens`; the count of `tokens` at each point.
fn encode_parts(
    tokenizer: &FileTokenizer,
    text: &str,
    start: usize,
    points: &[usize],
    tokens: &mut Vec<u32>,
) -> Result<Vec<usize>, FileTokenizerError> {
    let mut at = start;
    let mut counts = Vec::with_capacity(points.len());
    for &p in points.iter().chain([&text.len()]) {
        if p > at {
            tokens.extend_from_slice(&tokenizer.encode(&text[at..p], false)?);
            at = p;
        }
        if p < text.len() {
            counts.push(tokens.len());
        }
    }
    Ok(counts)
}

/// The final message's text, as Hugging Face reads it for `continue_final_message`: its
/// content when a string, else its last block with a `text`.
fn final_text(messages: &str) -> Option<String> {
    let messages: serde_json::Value = serde_json::from_str(messages).ok()?;
    match &messages.as_array()?.last()?["content"] {
        serde_json::Value::String(text) => Some(text.clone()),
        serde_json::Value::Array(blocks) => blocks
            .iter()
            .rev()
            .find_map(|b| b["text"].as_str().map(str::to_owned)),
        _ => None,
    }
}

#[cfg(test)]
mod join_tests;

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;

    use super::*;

    /// The merges of [`tiny_tokenizer_json`].
    pub(super) const TINY_MERGES: [(&str, &str); 12] = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("Ġwor", "l"),
        ("Ġworl", "d"),
        ("Ġ", "t"),
        ("Ġt", "h"),
        ("Ġth", "e"),
    ];

    /// A byte-level BPE (GPT-2 style): `<s>` (0) and `</s>` (1), the 256 byte symbols in code
    /// point order, then one token per merge; the post-processor puts `<s>` first.
    fn tiny_tokenizer_json() -> String {
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": true, "use_regex": true});
        tokenizer_json(byte_level, &TINY_MERGES)
    }

    /// [`tiny_tokenizer_json`]'s shape with another pre-tokenizer and other merges.
    pub(super) fn tokenizer_json(pre_tokenizer: Value, merges: &[(&str, &str)]) -> String {
        let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
        alphabet.sort_unstable();
        let mut vocab = serde_json::Map::new();
        vocab.insert("<s>".to_owned(), json!(0));
        vocab.insert("</s>".to_owned(), json!(1));
        let symbols = alphabet
            .iter()
            .map(char::to_string)
            .chain(merges.iter().map(|(a, b)| format!("{a}{b}")));
        for (i, s) in symbols.enumerate() {
            vocab.insert(s, json!(i + 2));
        }
        let special = |id: u32, content: &str| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        };
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                                "trim_offsets": true, "use_regex": false});
        let bos = json!({"SpecialToken": {"id": "<s>", "type_id": 0}});
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [special(0, "<s>"), special(1, "</s>")],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": pre_tokenizer,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}},
            },
            "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab,
                "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<Value>>(),
            },
        });
        tokenizer.to_string()
    }

    const TEXTS: [&str; 5] = [
        "hello world",
        "hello the world  \n",
        "<s>hello</s>",
        "he\u{301}llo 世界",
        "",
    ];

    /// Python `tokenizers` 0.23.3 on `tiny_tokenizer_json()` (tests/wire/tokenizer_ids.py).
    const WITH_SPECIAL: [&[u32]; 5] = [
        &[0, 261, 266],
        &[0, 261, 267, 258, 266, 222, 222, 200],
        &[0, 0, 261, 1],
        &[0, 73, 129, 104, 259, 80, 222, 162, 118, 246, 165, 245, 236],
        &[0],
    ];
    const WITHOUT_SPECIAL: [&[u32]; 5] = [
        &[261, 266],
        &[261, 267, 258, 266, 222, 222, 200],
        &[0, 261, 1],
        &[73, 129, 104, 259, 80, 222, 162, 118, 246, 165, 245, 236],
        &[],
    ];

    fn encode_all(t: &FileTokenizer, add_special_tokens: bool) -> Vec<Vec<u32>> {
        TEXTS
            .iter()
            .map(|text| t.encode(text, add_special_tokens).unwrap().to_vec())
            .collect()
    }

    #[test]
    fn the_ids_are_pythons() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tiny_tokenizer_json()).unwrap();
        let t = FileTokenizer::from_file(&path).unwrap();
        assert_eq!(encode_all(&t, true), WITH_SPECIAL.map(<[u32]>::to_vec));
        assert_eq!(encode_all(&t, false), WITHOUT_SPECIAL.map(<[u32]>::to_vec));
    }

    /// Python's ids computed now, when `scripts/tokenizer-tools.sh` installed them
    /// (`TOKENIZER_WIRE_PYTHON`): the golden vectors above still hold for this tokenizer.
    #[test]
    fn the_golden_ids_are_what_python_computes() {
        let Some(python) = std::env::var_os("TOKENIZER_WIRE_PYTHON") else {
            eprintln!(
                "TOKENIZER_WIRE_PYTHON unset: source scripts/tokenizer-tools.sh and run \
                       ensure_tokenizer_wire_tools to check against Python"
            );
            return;
        };
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/wire/tokenizer_ids.py");
        let mut child = std::process::Command::new(python)
            .arg(script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let request = json!({"tokenizer": tiny_tokenizer_json(), "texts": TEXTS});
        std::io::Write::write_all(
            child.stdin.as_mut().unwrap(),
            request.to_string().as_bytes(),
        )
        .unwrap();
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ids: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            ids["with_special"],
            json!(WITH_SPECIAL),
            "Python, with special tokens"
        );
        assert_eq!(
            ids["without_special"],
            json!(WITHOUT_SPECIAL),
            "Python, without"
        );
        let t = FileTokenizer::from_json(tiny_tokenizer_json().as_bytes()).unwrap();
        assert_eq!(
            json!(encode_all(&t, true)),
            ids["with_special"],
            "Rust, with"
        );
        assert_eq!(
            json!(encode_all(&t, false)),
            ids["without_special"],
            "Rust, without"
        );
    }

    #[test]
    fn a_bad_tokenizer_json_is_an_error() {
        let err = FileTokenizer::from_json(b"{\"model\": 3}").unwrap_err();
        assert!(matches!(err, FileTokenizerError::Load { .. }), "{err}");
        let err = FileTokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tokenizer.json"),
            "{err}"
        );
    }

    /// Llama 3's pre-tokenizer regex (its `tokenizer.json`), before its byte-level step.
    const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    /// GPT-2's and Llama 3's pre-tokenizers, as their `tokenizer.json` files write them, with
    /// merges that would join a word to the space after it (`dĠ`, `oĠ`, `5Ġ`) if a pre-token
    /// ever held both.
    pub(super) fn pattern_tokenizers() -> [(&'static str, FileTokenizer); 2] {
        pattern_tokenizer_jsons()
            .map(|(name, json)| (name, FileTokenizer::from_json(json.as_bytes()).unwrap()))
    }

    /// [`pattern_tokenizers`]' `tokenizer.json` texts.
    pub(super) fn pattern_tokenizer_jsons() -> [(&'static str, String); 2] {
        let mut merges = TINY_MERGES.to_vec();
        merges.extend([("d", "Ġ"), ("o", "Ġ"), ("5", "Ġ"), ("Ġ", "Ġ"), (".", "Ċ")]);
        let gpt2 = json!({"type": "ByteLevel", "add_prefix_space": false,
                          "trim_offsets": true, "use_regex": true});
        let llama3 = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
             "use_regex": false}]});
        [("gpt2", gpt2), ("llama3", llama3)].map(|(name, pre)| (name, tokenizer_json(pre, &merges)))
    }

    pub(super) const PIECES: [&str; 20] = [
        "hello", "world", " ", "  ", "the", "d", "12345", "7", ".", ",", "\n", "\n\n", "'s", "é",
        "世界", "\t", "</s>", "-", "wor", "o",
    ];

    proptest::proptest! {
        /// The tokens of a text cut at any stable cut are the first tokens of the whole text's
        /// (docs/engine-truth.md: what engine tokens a cut head has).
        #[test]
        fn a_stable_cut_keeps_every_token_before_it(
            pieces in proptest::collection::vec(proptest::sample::select(&PIECES[..]), 1..120)
        ) {
            let text = pieces.concat();
            for (name, t) in pattern_tokenizers() {
                let whole = t.encode(&text, true).unwrap();
                let cuts = (0..text.len())
                    .filter(|&q| crate::prompt::stable_cut::is_stable_cut(text.as_bytes(), q));
                for q in cuts {
                    let part = t.encode(&text[..q], true).unwrap();
                    proptest::prop_assert_eq!(
                        &whole[..part.len().min(whole.len())], &part[..],
                        "{} cut at {} of {:?}", name, q, text
                    );
                }
            }
        }
    }
}
