//! The simulator's tokenizer: a deterministic stand-in for a BPE tokenizer on English text.
//!
//! The rendered prompt is first cut into pieces the way GPT-2-style pre-tokenizers do: a word
//! with its leading space (` alpha`), a run of punctuation with its optional leading space
//! (` <|`), or a run of whitespace (its last space goes to the word that follows). Each piece is
//! then cut greedily from its start into tokens of at most [`MAX_TOKEN_BYTES`] bytes (never
//! inside a UTF-8 character). On the benchmark vocabulary that gives ~4 bytes per token, and
//! token boundaries fall anywhere relative to the router's 64-byte hash blocks.
//!
//! Prefix property (what a KV prefix cache needs): pieces depend on at most one byte of
//! lookahead, so a prompt that extends another has all the shorter one's tokens except possibly
//! its last (a word cut in the middle, or trailing whitespace that joins the next word).
//!
//! [`SimTokenizer`] chooses between this built-in tokenizer (the default, which the benchmarks
//! are measured with), its dense variant (`--tokenizer dense`: the same pieces cut into tokens
//! of at most [`DENSE_TOKEN_BYTES`] bytes, ~3.1 bytes per token on the benchmark's chat
//! prompts instead of ~4.1: an engine whose vocabulary the router was not tuned on) and a
//! Hugging Face `tokenizer.json` (`--tokenizer-json`, [`crate::tokenizer_json`]), whose ids the
//! picker's `file` tokenizer source computes too. Neither built-in one can be written as a
//! `tokenizer.json` (their ids are a hash of the token's bytes), so the `file` source goes with
//! `--tokenizer-json` only.

use std::ops::Range;
use std::sync::Arc;

/// Longest token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 6;

/// Longest token of the dense variant (`--tokenizer dense`), in bytes.
pub const DENSE_TOKEN_BYTES: usize = 4;

/// Vocabulary size of the token ids (`token_id`).
pub const VOCAB: u32 = 150_000;

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b >= 0x80
}

fn is_space(b: u8) -> bool {
    b.is_ascii_whitespace()
}

/// The byte ranges of the pieces (pre-tokens) of `text`.
fn pieces(text: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(text.len() / 5 + 1);
    let n = text.len();
    let mut i = 0;
    let run = |mut j: usize, f: fn(u8) -> bool| {
        while j < n && f(text[j]) {
            j += 1;
        }
        j
    };
    while i < n {
        let b = text[i];
        let end = if b == b' ' && i + 1 < n && !is_space(text[i + 1]) {
            // A space joins the word or punctuation run that follows.
            let next = text[i + 1];
            if is_word(next) {
                run(i + 1, is_word)
            } else {
                run(i + 1, |c| !is_word(c) && !is_space(c))
            }
        } else if is_space(b) {
            let mut j = run(i, is_space);
            // Leave the run's last space to a following word (` word`), as GPT-2 does.
            if j < n && j - i > 1 && text[j - 1] == b' ' {
                j -= 1;
            }
            j
        } else if is_word(b) {
            run(i, is_word)
        } else {
            run(i, |c| !is_word(c) && !is_space(c))
        };
        out.push(i..end);
        i = end;
    }
    out
}

/// The byte ranges of the tokens of `text`, in order, covering it exactly.
pub fn tokenize(text: &[u8]) -> Vec<Range<usize>> {
    tokenize_at_most(text, MAX_TOKEN_BYTES)
}

/// [`tokenize`] with tokens of at most `max_bytes` bytes (a character longer than that stays
/// whole).
pub fn tokenize_at_most(text: &[u8], max_bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    for piece in pieces(text) {
        let mut start = piece.start;
        while start < piece.end {
            let mut end = (start + max_bytes.max(1)).min(piece.end);
            // Never cut a UTF-8 character: move to the next character boundary.
            while end < piece.end && (text[end] & 0xC0) == 0x80 {
                end += 1;
            }
            out.push(start..end);
            start = end;
        }
    }
    out
}

/// The dense variant's special tokens: each is one token wherever it appears, as a Hugging Face
/// tokenizer matches its added tokens before it pre-tokenizes (Llama 3's, then ChatML's).
pub const DENSE_SPECIAL_TOKENS: [&str; 6] = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
];

/// The dense variant's tokens of `text`: each special token ([`DENSE_SPECIAL_TOKENS`]) whole,
/// the text between them by [`tokenize_at_most`] with [`DENSE_TOKEN_BYTES`]. So a turn that
/// ends in `<|eot_id|>` keeps its tokens when the next one starts with `<|start_header_id|>`
/// (the built-in default would cut `|><|` as one punctuation run).
pub fn tokenize_dense(text: &[u8]) -> Vec<Range<usize>> {
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    let mut from = 0;
    let mut at = 0;
    while let Some(i) = text[at..].windows(2).position(|w| w == b"<|") {
        let start = at + i;
        match DENSE_SPECIAL_TOKENS
            .iter()
            .find(|s| text[start..].starts_with(s.as_bytes()))
        {
            Some(special) => {
                let end = start + special.len();
                out.extend(
                    tokenize_at_most(&text[from..start], DENSE_TOKEN_BYTES)
                        .into_iter()
                        .map(|r| r.start + from..r.end + from),
                );
                out.push(start..end);
                (from, at) = (end, end);
            }
            None => at = start + 1,
        }
    }
    out.extend(
        tokenize_at_most(&text[from..], DENSE_TOKEN_BYTES)
            .into_iter()
            .map(|r| r.start + from..r.end + from),
    );
    out
}

/// The number of tokens of `text`.
pub fn count(text: &[u8]) -> usize {
    tokenize(text).len()
}

/// A token's id: a hash of its bytes, below [`VOCAB`].
pub fn token_id(token: &[u8]) -> u32 {
    (xxhash_rust::xxh64::xxh64(token, 0x70C3) % u64::from(VOCAB)) as u32
}

/// The token ids of `text`.
pub fn token_ids(text: &[u8]) -> Vec<u32> {
    tokenize(text)
        .into_iter()
        .map(|r| token_id(&text[r]))
        .collect()
}

/// `--tokenizer`: which built-in tokenizer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Builtin {
    /// Tokens of at most [`MAX_TOKEN_BYTES`] bytes (~4.1 bytes per token on the benchmark).
    #[default]
    Default,
    /// Tokens of at most [`DENSE_TOKEN_BYTES`] bytes, special tokens whole (~3.1 bytes per
    /// token on the benchmark).
    Dense,
}

impl Builtin {
    /// Its tokenizer.
    pub fn tokenizer(self) -> SimTokenizer {
        match self {
            Builtin::Default => SimTokenizer::Builtin,
            Builtin::Dense => SimTokenizer::Dense,
        }
    }
}

/// The sim's tokenizer: the built-in one above, its dense variant, or a `tokenizer.json`.
#[derive(Debug, Clone, Default)]
pub enum SimTokenizer {
    #[default]
    Builtin,
    /// The built-in tokenizer cut at [`DENSE_TOKEN_BYTES`], special tokens whole
    /// ([`tokenize_dense`]).
    Dense,
    /// A Hugging Face tokenizer; the sim encodes without special tokens (as the built-in one).
    Json(Arc<tokenizers::Tokenizer>),
}

/// A text's tokens as the KV cache cuts and hashes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tokens {
    /// The built-in tokenizer's byte ranges (a block hashes their bytes; ids by [`token_id`]).
    Spans(Vec<Range<usize>>),
    /// A `tokenizer.json`'s ids (a block hashes them).
    Ids(Vec<u32>),
}

impl Tokens {
    pub fn len(&self) -> usize {
        match self {
            Tokens::Spans(s) => s.len(),
            Tokens::Ids(i) => i.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `more`, the tokens of text that starts `at` bytes into this one's text (the two
    /// are of the same kind: one tokenizer made both).
    pub fn append(&mut self, more: Tokens, at: usize) {
        match (self, more) {
            (Tokens::Spans(s), Tokens::Spans(m)) => {
                s.extend(m.into_iter().map(|r| r.start + at..r.end + at));
            }
            (Tokens::Ids(i), Tokens::Ids(m)) => i.extend(m),
            (this, more) => unreachable!("one tokenizer's tokens: {this:?} and {more:?}"),
        }
    }
}

impl SimTokenizer {
    /// The tokens of `text`.
    pub fn tokens(&self, text: &[u8]) -> Tokens {
        match self {
            SimTokenizer::Builtin | SimTokenizer::Dense => Tokens::Spans(self.spans(text)),
            SimTokenizer::Json(t) => Tokens::Ids(json_ids(t, text)),
        }
    }

    /// The token ids of `text`.
    pub fn ids(&self, text: &[u8]) -> Vec<u32> {
        match self {
            SimTokenizer::Builtin | SimTokenizer::Dense => self
                .spans(text)
                .into_iter()
                .map(|r| token_id(&text[r]))
                .collect(),
            SimTokenizer::Json(t) => json_ids(t, text),
        }
    }

    /// A built-in tokenizer's byte ranges of `text` (none for a `tokenizer.json`).
    fn spans(&self, text: &[u8]) -> Vec<Range<usize>> {
        match self {
            SimTokenizer::Builtin => tokenize(text),
            SimTokenizer::Dense => tokenize_dense(text),
            SimTokenizer::Json(_) => Vec::new(),
        }
    }

    /// The tokens of `text` as strings (vLLM's `token_strs`).
    pub fn strs(&self, text: &[u8]) -> Vec<String> {
        match self {
            SimTokenizer::Builtin | SimTokenizer::Dense => self
                .spans(text)
                .into_iter()
                .map(|r| String::from_utf8_lossy(&text[r]).into_owned())
                .collect(),
            // `encode`, not `encode_fast`: only the former fills the tokens' strings.
            SimTokenizer::Json(t) => t
                .encode(String::from_utf8_lossy(text).as_ref(), false)
                .map(|e| e.get_tokens().to_vec())
                .unwrap_or_default(),
        }
    }
}

/// A `tokenizer.json`'s ids of `text` without special tokens; none if it cannot encode it (a
/// `tokenizer.json` whose model has no token for some input and no `unk_token`).
fn json_ids(t: &tokenizers::Tokenizer, text: &[u8]) -> Vec<u32> {
    t.encode_fast(String::from_utf8_lossy(text).as_ref(), false)
        .map(|e| e.get_ids().to_vec())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn strs(text: &str) -> Vec<&str> {
        tokenize(text.as_bytes())
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn words_keep_their_leading_space_and_long_ones_split() {
        assert_eq!(strs("the alpha juniper"), ["the", " alpha", " junip", "er"]);
        assert_eq!(strs("a,  b\n"), ["a", ",", " ", " b", "\n"]);
        assert_eq!(
            strs("<|im_start|>user\n"),
            ["<|", "im", "_", "start", "|>", "user", "\n"]
        );
        // Multi-byte characters stay whole.
        assert_eq!(strs("ééé"), ["ééé"]);
        assert_eq!(strs("éééé"), ["ééé", "é"]);
        assert!(strs("").is_empty());
    }

    #[test]
    fn the_dense_variant_cuts_the_same_pieces_shorter() {
        let text = b"<|im_start|>user\nthe alpha juniper<|eot_id|><|start_header_id|>x <|y|>";
        let dense: Vec<String> = SimTokenizer::Dense.strs(text);
        assert_eq!(
            dense,
            [
                "<|im_start|>",
                "user",
                "\n",
                "the",
                " alp",
                "ha",
                " jun",
                "iper",
                "<|eot_id|>",
                "<|start_header_id|>",
                "x",
                " <|",
                "y",
                "|>"
            ]
        );
        assert_eq!(SimTokenizer::Builtin.strs(b"<|im_start|>user").len(), 6);
        let ids = SimTokenizer::Dense.ids(text);
        assert_eq!(ids.len(), dense.len());
        assert_eq!(ids[4], token_id(b" alp"));
        // A turn's tokens are kept when the next turn follows it.
        let turn = b"<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>";
        let two = [&turn[..], &turn[..]].concat();
        assert_eq!(
            tokenize_dense(&two)[..tokenize_dense(turn).len()],
            tokenize_dense(turn)
        );
    }

    proptest! {
        #[test]
        fn a_longer_prompt_keeps_all_but_the_last_token_of_a_shorter_one(
            text in "[ab ,.\n<|>é]{0,60}",
            cut in 0usize..61,
            max in prop_oneof![Just(MAX_TOKEN_BYTES), Just(DENSE_TOKEN_BYTES)],
        ) {
            let cut = text
                .char_indices()
                .map(|(i, _)| i)
                .chain([text.len()])
                .rfind(|i| *i <= cut)
                .unwrap_or(0);
            let (short, long) = (
                tokenize_at_most(&text.as_bytes()[..cut], max),
                tokenize_at_most(text.as_bytes(), max),
            );
            let keep = short.len().saturating_sub(1);
            prop_assert_eq!(&short[..keep], &long[..keep]);
            // Tokens cover the text exactly, in order.
            let mut at = 0;
            for r in &long {
                prop_assert_eq!(r.start, at);
                prop_assert!(r.end > r.start);
                at = r.end;
            }
            prop_assert_eq!(at, text.len());
        }
    }

    proptest! {
        /// At a stable cut (the picker's cut heads, `prefix_picker::prompt::stable_cut`) no
        /// token is lost: the shorter text's tokens are all the longer one's first tokens.
        #[test]
        fn a_stable_cut_keeps_every_token_before_it(
            text in "[ab1 ,.\n<|>é]{0,80}",
            max in prop_oneof![Just(MAX_TOKEN_BYTES), Just(DENSE_TOKEN_BYTES)],
        ) {
            let long = tokenize_at_most(text.as_bytes(), max);
            let cuts = (0..text.len())
                .filter(|&q| prefix_picker::prompt::stable_cut::is_stable_cut(text.as_bytes(), q));
            for q in cuts {
                let short = tokenize_at_most(&text.as_bytes()[..q], max);
                prop_assert_eq!(&short[..], &long[..short.len()], "cut at {}", q);
            }
        }
    }
}
