//! Tokens joined from parts equal the whole text's ([`super::Joins`]), and
//! [`FileSource::tokenize_known`] tokenizes only what follows a known prefix: for the GPT-2
//! and Llama 3 pre-tokenizer patterns (as their `tokenizer.json` files write them) and
//! model-sim's `tokenizer.json` with its chat template.

use proptest::prelude::*;
use serde_json::json;

use super::tests::{PIECES, TINY_MERGES, pattern_tokenizer_jsons, tokenizer_json};
use super::*;
use crate::prompt::stable_cut::is_stable_cut;

/// A `file` source of `tokenizer_json` alone (no chat template: text prompts).
fn source_of(tokenizer_json: &str) -> (tempfile::TempDir, FileSource) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tokenizer_json).unwrap();
    let source = FileSource::load(&path).unwrap();
    (dir, source)
}

/// model-sim's `tokenizer.json` and chat template, as the suite's file rows load them.
fn sim_source() -> (tempfile::TempDir, FileSource) {
    let dir = tempfile::tempdir().unwrap();
    model_sim::tokenizer_json::write(dir.path()).unwrap();
    let source = FileSource::load(&dir.path().join("tokenizer.json")).unwrap();
    assert!(source.template_error().is_none());
    (dir, source)
}

/// Every tokenizer the join is claimed for, with the added tokens a text may be split before.
fn checked_tokenizers() -> Vec<(&'static str, FileTokenizer, Vec<String>)> {
    let tiny_splits = vec!["<s>".to_owned(), "</s>".to_owned()];
    let mut all: Vec<_> = pattern_tokenizer_jsons()
        .into_iter()
        .map(|(name, json)| {
            let t = FileTokenizer::from_json(json.as_bytes()).unwrap();
            (name, t, tiny_splits.clone())
        })
        .collect();
    let (_dir, sim) = sim_source();
    let splits = sim.joins.as_ref().unwrap().splits.clone();
    assert_eq!(splits, ["<|im_end|>", "<|im_start|>"]);
    let sim_json = model_sim::tokenizer_json::default_tokenizer_json();
    all.push((
        "model-sim",
        FileTokenizer::from_json(sim_json.as_bytes()).unwrap(),
        splits,
    ));
    all
}

/// Every position a text may be split at: each stable cut (not only those near every 512th
/// byte) and before each of `splits`.
fn every_point(text: &str, splits: &[String]) -> Vec<usize> {
    let mut points: Vec<usize> = (1..text.len())
        .filter(|&q| is_stable_cut(text.as_bytes(), q))
        .collect();
    for s in splits {
        points.extend(text.match_indices(s.as_str()).map(|(at, _)| at));
    }
    points.retain(|&p| p > 0 && p < text.len());
    points.sort_unstable();
    points.dedup();
    points
}

fn pieces() -> impl Strategy<Value = String> {
    const CHAT: [&str; 6] = [
        "<|im_start|>",
        "<|im_end|>",
        "<s>",
        "user\n",
        "assistant",
        "\n",
    ];
    let all: Vec<&'static str> = PIECES.iter().chain(CHAT.iter()).copied().collect();
    proptest::collection::vec(proptest::sample::select(all), 1..150).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A text's tokens joined from its parts at every join point are its tokens whole, and
    /// the tokens before each point are those of the text up to it (what a later text that
    /// shares that prefix reuses).
    #[test]
    fn tokens_joined_at_join_points_are_the_whole_texts(text in pieces()) {
        for (name, t, splits) in checked_tokenizers() {
            let points = every_point(&text, &splits);
            let mut joined = Vec::new();
            let counts = encode_parts(&t, &text, 0, &points, &mut joined).unwrap();
            let whole = t.encode(&text, false).unwrap();
            prop_assert_eq!(&joined[..], &whole[..], "{} on {:?}", name, text);
            for (&p, &n) in points.iter().zip(&counts) {
                let part = t.encode(&text[..p], false).unwrap();
                prop_assert_eq!(&whole[..n], &part[..], "{} before {} of {:?}", name, p, text);
            }
        }
    }

    /// A text tokenized after a text it extends (a longer document, a conversation's next
    /// turn) gets the tokens it has whole, with and without special tokens.
    #[test]
    fn a_text_after_its_prefix_gets_its_whole_tokens(first in pieces(), more in pieces()) {
        let sources: Vec<_> = pattern_tokenizer_jsons()
            .into_iter()
            .map(|(_, json)| source_of(&json))
            .chain([sim_source()])
            .collect();
        let longer = format!("{first}{more}");
        for (_dir, source) in &sources {
            prop_assert!(source.join_error().is_none());
            for special in [true, false] {
                let input = |t| TokenizeInput::text(t).with_add_special_tokens(special);
                source.tokenize_known(&input(&first)).unwrap();
                let got = source.tokenize_known(&input(&longer)).unwrap();
                prop_assert_eq!(got.tokens, source.tokenize(&input(&longer)).unwrap());
            }
            prop_assert!(source.join_error().is_none(), "no sampled join differed");
        }
    }
}

/// A tokenization with no known prefix, so that the join after it is not the first (which is
/// checked against the whole text, its tokens counted).
fn first_join_spent(source: &FileSource) {
    let text = "spent on the check ".repeat(40);
    source.tokenize_known(&TokenizeInput::text(&text)).unwrap();
    let more = format!("{text}and more");
    source.tokenize_known(&TokenizeInput::text(&more)).unwrap();
}

#[test]
fn a_head_extended_by_a_turn_tokenizes_only_the_new_turn() {
    let (_dir, source) = sim_source();
    first_join_spent(&source);
    let system = json!({"role": "system", "content": "You are a careful assistant. ".repeat(30)});
    let user = json!({"role": "user", "content": "What is the plan for today?"});
    let reply = json!({"role": "assistant", "content": "First the tests, then the numbers."});
    let next = json!({"role": "user", "content": "And after that, what comes next?"});
    let head = json!([system, user]).to_string();
    let turn = json!([system, user, reply, next]).to_string();
    let first = source
        .tokenize_known(&TokenizeInput::chat(&head, None).with_generation_prompt(false))
        .unwrap();
    assert_eq!(first.computed, first.tokens.len(), "nothing known yet");
    let input = TokenizeInput::chat(&turn, None);
    let got = source.tokenize_known(&input).unwrap();
    assert_eq!(got.tokens, source.tokenize(&input).unwrap());
    // The new turn's text: what the template renders after the head.
    let template = source.template.as_ref().unwrap();
    let (head_text, turn_text) = (
        template.render(&head, None, false).unwrap(),
        template.render(&turn, None, true).unwrap(),
    );
    let new = source
        .tokenizer
        .encode(&turn_text[head_text.len()..], false)
        .unwrap();
    assert!(!new.is_empty());
    assert_eq!(got.computed, new.len(), "only the new turn's tokens");
    assert_eq!(got.tokens[got.tokens.len() - new.len()..], new[..]);
}

#[test]
fn a_completion_past_a_known_cut_tokenizes_from_the_cut() {
    for (name, json) in pattern_tokenizer_jsons() {
        let (_dir, source) = source_of(&json);
        first_join_spent(&source);
        let document = "hello world, the world said hello 12345 times. ".repeat(60);
        let one = format!("{document}Question one?");
        let two = format!("{document}Another question, a longer one?");
        let first = source.tokenize_known(&TokenizeInput::text(&one)).unwrap();
        assert_eq!(
            first.computed + 1,
            first.tokens.len(),
            "{name}: all but <s>"
        );
        let got = source.tokenize_known(&TokenizeInput::text(&two)).unwrap();
        let whole = source.tokenize(&TokenizeInput::text(&two)).unwrap();
        assert_eq!(got.tokens, whole, "{name}");
        assert_eq!(got.tokens[0], 0, "{name}: <s> first");
        // At most the text after the last cut before the document's end (512 bytes apart),
        // and the new question.
        let after = "hello world, the world said hello 12345 times. ".repeat(11);
        let bound = source
            .tokenize(&TokenizeInput::text(&format!(
                "{after}Another question, a longer one?"
            )))
            .unwrap()
            .len();
        assert!(
            got.computed < bound && got.computed * 4 < whole.len(),
            "{name}: computed {} of {}",
            got.computed,
            whole.len()
        );
    }
}

#[test]
fn a_text_with_no_known_prefix_is_tokenized_whole() {
    let (_dir, source) = sim_source();
    first_join_spent(&source);
    let text = "an unrelated text, nothing like it seen ".repeat(30);
    let got = source.tokenize_known(&TokenizeInput::text(&text)).unwrap();
    assert_eq!(got.computed, got.tokens.len());
    assert_eq!(
        got.tokens,
        source.tokenize(&TokenizeInput::text(&text)).unwrap()
    );
    // The same text again is known whole: nothing to tokenize.
    let again = source.tokenize_known(&TokenizeInput::text(&text)).unwrap();
    assert_eq!((again.tokens, again.computed), (got.tokens, 0));
}

#[test]
fn a_tokenizer_whose_parts_do_not_join_tokenizes_whole() {
    // Llama 2's normalizer puts `▁` before every text: a part starting with a space gets two.
    let mut tokenizer: serde_json::Value = serde_json::from_str(&tokenizer_json(
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": true}),
        &TINY_MERGES,
    ))
    .unwrap();
    tokenizer["normalizer"] = json!({"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]});
    let (_dir, source) = source_of(&tokenizer.to_string());
    assert!(source.join_error().is_some());
    let document = "hello world, the world said hello. ".repeat(60);
    for text in [document.clone(), format!("{document}and more")] {
        let got = source.tokenize_known(&TokenizeInput::text(&text)).unwrap();
        assert_eq!(got.computed, got.tokens.len());
        assert_eq!(
            got.tokens,
            source.tokenize(&TokenizeInput::text(&text)).unwrap()
        );
    }
}
