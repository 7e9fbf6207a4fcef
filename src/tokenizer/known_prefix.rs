//! Tokens of texts tokenized before, kept at their *join points*, so that a text that extends
//! one is tokenized from the last join point it shares instead of whole (issue 55: tokenize
//! what is new, once).
//!
//! A join point `p` of a text is a position where its tokens split: the tokens of `text[..p]`
//! followed by those of `text[p..]` (encoded without special tokens) are the tokens of the
//! whole. Two kinds ([`join_points`]):
//! - right before an added token the chat template writes (`<|im_start|>`, `<|eot_id|>`): a
//!   `tokenizer.json` splits added tokens out of the text before anything else, so the text on
//!   either side is normalized and pre-tokenized on its own in the whole text as in the parts;
//! - a stable cut ([`crate::prompt::stable_cut`]: a space after an ASCII letter or digit, near
//!   every 512th byte), where the engines' pre-tokenizers end a pre-token whatever follows.
//!
//! A text's points are hashed as one chain (xxh3 of the text up to each point, the state
//! carried from one to the next), so a point's digest names the whole prefix before it.
//! [`KnownPrefixes`] maps the digests of texts tokenized before to their tokens up to there;
//! the longest known point of a new text gives its known prefix, and only the rest is
//! tokenized. Whether the join holds is the tokenizer's property, checked by its owner (the
//! `file` source checks it at load and on a sample of joins, and tokenizes whole otherwise).
//!
//! Memory: at most `max_texts` texts and `max_tokens` token ids (4 bytes each) plus one map
//! entry (~24 bytes) per point; the oldest text is dropped first, with its points.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::Xxh3;

use crate::prompt::stable_cut::stable_cuts;

/// The join points of `text`, in order, each in `1..text.len()`: before every occurrence of
/// one of `splits` (added tokens), and every stable cut.
pub fn join_points(text: &str, splits: &[String]) -> Vec<usize> {
    let bytes = text.as_bytes();
    let mut points: Vec<usize> = stable_cuts(bytes, 0, bytes.len()).collect();
    for split in splits.iter().filter(|s| !s.is_empty()) {
        points.extend(memchr::memmem::find_iter(bytes, split.as_bytes()));
    }
    points.retain(|&p| p > 0 && p < bytes.len());
    points.sort_unstable();
    points.dedup();
    points
}

/// The digest of `text` up to each of `points` (in order), seeded by `seed` (the tokenizer and
/// its flags): one pass over the text.
pub fn point_digests(seed: u64, text: &str, points: &[usize]) -> Vec<u64> {
    let bytes = text.as_bytes();
    let mut h = Xxh3::with_seed(seed);
    let mut at = 0;
    points
        .iter()
        .map(|&p| {
            h.update(&bytes[at..p]);
            at = p;
            h.digest()
        })
        .collect()
}

/// A known prefix of a text: the tokens of `text[..points[point]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownPrefix {
    /// Which of the text's points it ends at.
    pub point: usize,
    pub tokens: Vec<u32>,
}

/// Texts tokenized before, by the digests of their join points.
#[derive(Debug)]
pub struct KnownPrefixes {
    max_texts: usize,
    max_tokens: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// A point's digest -> the text holding it and its tokens up to there.
    points: HashMap<u64, Point>,
    texts: HashMap<u64, Text>,
    /// Text ids, oldest first.
    order: VecDeque<u64>,
    tokens: usize,
    next_id: u64,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    text: u64,
    tokens: usize,
}

#[derive(Debug)]
struct Text {
    id: u64,
    tokens: Arc<[u32]>,
    points: Vec<u64>,
}

impl KnownPrefixes {
    pub fn new(max_texts: usize, max_tokens: usize) -> KnownPrefixes {
        KnownPrefixes {
            max_texts: max_texts.max(1),
            max_tokens: max_tokens.max(1),
            inner: Mutex::default(),
        }
    }

    /// The longest of `digests` (a text's points, in order) known, with its tokens.
    pub fn longest(&self, digests: &[u64]) -> Option<KnownPrefix> {
        let inner = self.inner.lock();
        let (point, found) = digests
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, d)| inner.points.get(d).map(|p| (i, *p)))?;
        let text = inner.texts.get(&found.text)?;
        Some(KnownPrefix {
            point,
            tokens: text.tokens.get(..found.tokens)?.to_vec(),
        })
    }

    /// Keeps `tokens`, a text's tokens, at its points: `digests[i]` ends after `counts[i]` of
    /// them. A text over `max_tokens` alone is not kept.
    pub fn insert(&self, digests: &[u64], counts: &[usize], tokens: Vec<u32>) {
        debug_assert_eq!(digests.len(), counts.len());
        if digests.is_empty() || tokens.len() > self.max_tokens {
            return;
        }
        let mut inner = self.inner.lock();
        while inner.texts.len() >= self.max_texts || inner.tokens + tokens.len() > self.max_tokens {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            let Some(old) = inner.texts.remove(&old) else {
                continue;
            };
            inner.tokens -= old.tokens.len();
            for d in old.points {
                if inner.points.get(&d).is_some_and(|p| p.text == old.id) {
                    inner.points.remove(&d);
                }
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        for (&d, &n) in digests.iter().zip(counts) {
            inner.points.insert(
                d,
                Point {
                    text: id,
                    tokens: n.min(tokens.len()),
                },
            );
        }
        inner.tokens += tokens.len();
        inner.order.push_back(id);
        inner.texts.insert(
            id,
            Text {
                id,
                tokens: Arc::from(tokens),
                points: digests.to_vec(),
            },
        );
    }

    /// Texts kept.
    pub fn len(&self) -> usize {
        self.inner.lock().texts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_fall_before_added_tokens_and_at_stable_cuts() {
        let text = format!(
            "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
            "word ".repeat(200)
        );
        let splits = vec!["<|im_start|>".to_owned(), "<|im_end|>".to_owned()];
        let points = join_points(&text, &splits);
        let second = text.rfind("<|im_start|>").unwrap();
        let end = text.find("<|im_end|>").unwrap();
        assert!(points.contains(&second) && points.contains(&end));
        assert!(!points.contains(&0), "never the start");
        assert!(points.windows(2).all(|w| w[0] < w[1]));
        assert!(points.iter().any(|&p| text.as_bytes()[p] == b' '));
    }

    #[test]
    fn the_longest_known_point_is_found_and_the_oldest_text_dropped() {
        let known = KnownPrefixes::new(2, 100);
        let text = "aaaa bbbb cccc";
        let digests = point_digests(7, text, &[4, 9]);
        known.insert(&digests, &[1, 2], vec![10, 11, 12]);
        // A text sharing both points finds the second; one sharing the first finds it.
        let longer = point_digests(7, "aaaa bbbb cccc dddd", &[4, 9, 14]);
        assert_eq!(
            known.longest(&longer),
            Some(KnownPrefix {
                point: 1,
                tokens: vec![10, 11]
            })
        );
        let other = point_digests(7, "aaaa zzzz", &[4]);
        assert_eq!(known.longest(&other).map(|k| k.tokens), Some(vec![10]));
        // Another seed (tokenizer or flags) shares nothing.
        assert_eq!(known.longest(&point_digests(8, text, &[4, 9])), None);
        // Two more texts: the first is dropped, with its points.
        known.insert(&point_digests(7, "x y", &[1]), &[1], vec![1]);
        known.insert(&point_digests(7, "z y", &[1]), &[1], vec![2]);
        assert_eq!(known.len(), 2);
        assert_eq!(known.longest(&longer), None);
    }

    #[test]
    fn tokens_are_bounded() {
        let known = KnownPrefixes::new(100, 10);
        known.insert(&[1], &[5], vec![0; 11]);
        assert!(known.is_empty(), "a text over the bound alone is not kept");
        known.insert(&[1], &[5], vec![0; 6]);
        known.insert(&[2], &[5], vec![0; 6]);
        assert_eq!(known.len(), 1);
        assert!(known.longest(&[1]).is_none() && known.longest(&[2]).is_some());
    }
}
