//! Where a prompt can be cut inside a message so that the engine's tokens of the part before
//! the cut are a prefix of its tokens of the whole: the engine tokens of a document, a few-shot
//! block or a tool result that later requests share up to somewhere inside their last message.
//!
//! A BPE tokenizer first splits text into pre-tokens, then merges bytes only inside each. The
//! pre-tokenizers of the engines' models never join an ASCII letter or digit to a space that
//! follows it: GPT-2's pattern (`'s|'t|... | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`)
//! gives a space to the word after it; Llama 3's (`[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|...`)
//! too; SentencePiece's metaspace starts each piece at a space (`▁word`); model-sim's tokenizer
//! cuts a word with its leading space. So a cut right before a space that follows an ASCII
//! letter or digit ends a pre-token in the shorter text and in the longer alike, every
//! pre-token before it is the same in both, and so are their tokens. docs/engine-truth.md says
//! how this was checked (a property test per tokenizer).
//!
//! Cuts are looked for every [`CUT_SPACING`] bytes from the start of the message's text, each
//! the last such space before its mark (none when the [`CUT_SPACING`] bytes before the mark
//! have none: a cut depends only on the text before its mark, so two prompts that share the
//! text up to a mark share the cut there).

/// Bytes of the message's text between two marks a cut is looked for before.
pub const CUT_SPACING: usize = 512;

/// The stable cuts of `text[start..end]` (offsets in `text`), shortest first: for each mark
/// `start + k * CUT_SPACING < end`, the last position `q` in the [`CUT_SPACING`] bytes before
/// the mark with `text[q] == b' '` and `text[q - 1]` an ASCII letter or digit.
pub fn stable_cuts(text: &[u8], start: usize, end: usize) -> impl Iterator<Item = usize> + '_ {
    let end = end.min(text.len());
    (1..)
        .map(move |k| start + k * CUT_SPACING)
        .take_while(move |&mark| mark < end)
        .filter_map(move |mark| {
            let window = mark + 1 - CUT_SPACING;
            (window.max(start + 1)..mark)
                .rev()
                .find(|&q| is_stable_cut(text, q))
        })
}

/// Whether `text` can be cut at `q`: a space there, after an ASCII letter or digit.
pub fn is_stable_cut(text: &[u8], q: usize) -> bool {
    q > 0 && text.get(q) == Some(&b' ') && text[q - 1].is_ascii_alphanumeric()
}

/// A chat rendering cut right after the final message's text, as Hugging Face's
/// `apply_chat_template(continue_final_message=True)` cuts it (vLLM's `continue_final_message`):
/// after the last occurrence of the text with its surrounding whitespace trimmed. `None` when
/// the rendering does not hold it (Hugging Face raises an error).
pub fn continue_final_message<'a>(rendered: &'a str, final_text: &str) -> Option<&'a str> {
    let text = final_text.trim();
    rendered.rfind(text).map(|at| &rendered[..at + text.len()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_ends_a_word_before_a_space_within_its_window() {
        let text = "word ".repeat(300);
        let cuts: Vec<usize> = stable_cuts(text.as_bytes(), 0, text.len()).collect();
        assert_eq!(cuts.len(), (text.len() - 1) / CUT_SPACING);
        for (k, &q) in cuts.iter().enumerate() {
            let mark = (k + 1) * CUT_SPACING;
            assert!(q < mark && q + CUT_SPACING > mark, "{q} near {mark}");
            assert_eq!(&text.as_bytes()[q - 4..=q], b"word ");
        }
    }

    #[test]
    fn a_cut_depends_only_on_the_text_before_its_mark() {
        let shared = "a shared document, ".repeat(60);
        let (one, two) = (
            format!("{shared}then one question"),
            format!("{shared}another"),
        );
        let a: Vec<usize> = stable_cuts(one.as_bytes(), 0, one.len()).collect();
        let b: Vec<usize> = stable_cuts(two.as_bytes(), 0, two.len()).collect();
        let within = shared.len() / CUT_SPACING;
        assert!(within >= 2);
        assert_eq!(a[..within], b[..within]);
    }

    #[test]
    fn continuing_the_final_message_drops_what_closes_it() {
        let rendered =
            "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>user\nread this<|im_end|>\n";
        assert_eq!(
            continue_final_message(rendered, "read this "),
            Some("<|im_start|>user\nhi there<|im_end|>\n<|im_start|>user\nread this")
        );
        assert_eq!(continue_final_message(rendered, "absent"), None);
    }

    #[test]
    fn text_without_a_word_and_a_space_has_no_cut() {
        let blob = "x".repeat(4 * CUT_SPACING);
        assert_eq!(stable_cuts(blob.as_bytes(), 0, blob.len()).count(), 0);
        let spaces = format!("{}{}", ". ".repeat(CUT_SPACING), "y".repeat(CUT_SPACING));
        assert_eq!(stable_cuts(spaces.as_bytes(), 0, spaces.len()).count(), 0);
        // Nothing before `start` is a cut, nor `start` itself.
        let text = format!("head {}", "z".repeat(2 * CUT_SPACING));
        assert_eq!(stable_cuts(text.as_bytes(), 4, text.len()).count(), 0);
    }
}
