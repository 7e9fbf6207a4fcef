//! The block hash chain: a prompt -> the hashes of its leading fixed-size byte blocks.
//!
//! ```text
//! prev = XXH64(model, seed 0)
//! for each block of `block_size` bytes (the last may be shorter), at most `max_blocks` blocks:
//!     cur = XXH64(decimal(prev) ++ block, seed 0); emit cur; prev = cur
//! ```
//! `decimal` is the base-10 text of the u64. Blocks are bytes (a UTF-8 character may be split);
//! text past `block_size * max_blocks` bytes is never read. An empty prompt has no hashes.
//! Knobs: `blockSizeToHash` (default 64) and `maxBlocksToMatch` (default 128) of the plugin args.
//! Hashing reuses one buffer per call: no allocation per block.
//!
//! The affinity mode's long-prompt chain ([`ChainScheme::Seeded`]) hashes each block with
//! XXH3-64 seeded by the previous hash (`prev = XXH3(model, 0)`, `cur = XXH3(block, prev)`):
//! the same chain property without the decimal text and the copy per block, about twice as fast
//! over a 220 KB prompt.

use xxhash_rust::xxh3::xxh3_64_with_seed;
use xxhash_rust::xxh64::xxh64;

/// How blocks are chained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChainScheme {
    /// Kthena's: `XXH64(decimal(prev) ++ block)`.
    #[default]
    Kthena,
    /// The affinity mode's: `XXH3(block, seed = prev)`.
    Seeded,
}

impl ChainScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            ChainScheme::Kthena => "kthena",
            ChainScheme::Seeded => "seeded",
        }
    }
}

/// One chained block hash (identifies a prompt prefix for one model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Block size and block count of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockChain {
    pub block_size: usize,
    pub max_blocks: usize,
}

impl BlockChain {
    /// Bytes of the prompt the chain covers (`block_size * max_blocks`).
    pub fn coverage(&self) -> usize {
        self.block_size.saturating_mul(self.max_blocks)
    }

    /// Hashes `prompt` for `model` into `out` (cleared first).
    pub fn hash_into(&self, model: &str, prompt: &[u8], out: &mut Vec<BlockHash>) {
        out.clear();
        if prompt.is_empty() || self.block_size == 0 || self.max_blocks == 0 {
            return;
        }
        let covered = &prompt[..prompt.len().min(self.coverage())];
        out.reserve(covered.len().div_ceil(self.block_size));
        let mut buf = Vec::with_capacity(20 + self.block_size);
        let mut prev = xxh64(model.as_bytes(), 0);
        for block in covered.chunks(self.block_size) {
            buf.clear();
            push_decimal(&mut buf, prev);
            buf.extend_from_slice(block);
            prev = xxh64(&buf, 0);
            out.push(BlockHash(prev));
        }
    }

    /// Hashes `prompt` for `model` into `out` (cleared first) with `scheme`.
    pub fn hash_with(
        &self,
        scheme: ChainScheme,
        model: &str,
        prompt: &[u8],
        out: &mut Vec<BlockHash>,
    ) {
        match scheme {
            ChainScheme::Kthena => self.hash_into(model, prompt, out),
            ChainScheme::Seeded => {
                out.clear();
                if prompt.is_empty() || self.block_size == 0 || self.max_blocks == 0 {
                    return;
                }
                let covered = &prompt[..prompt.len().min(self.coverage())];
                out.reserve(covered.len().div_ceil(self.block_size));
                let mut prev = xxh3_64_with_seed(model.as_bytes(), 0);
                for block in covered.chunks(self.block_size) {
                    prev = xxh3_64_with_seed(block, prev);
                    out.push(BlockHash(prev));
                }
            }
        }
    }

    /// Hashes `prompt` for `model` into a new vector.
    pub fn hash(&self, model: &str, prompt: &[u8]) -> Vec<BlockHash> {
        let mut out = Vec::new();
        self.hash_into(model, prompt, &mut out);
        out
    }
}

/// Appends the base-10 text of `n` (Go's `strconv.FormatUint(n, 10)`, as Kthena writes it).
fn push_decimal(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(block_size: usize, max_blocks: usize) -> BlockChain {
        BlockChain {
            block_size,
            max_blocks,
        }
    }

    fn raw(hashes: Vec<BlockHash>) -> Vec<u64> {
        hashes.into_iter().map(|h| h.0).collect()
    }

    #[test]
    fn model_seed_vector() {
        assert_eq!(xxh64(b"test-model", 0), 3725054772343846052);
    }

    #[test]
    fn semantics_vectors() {
        assert_eq!(
            raw(chain(64, 128).hash("test-model", b"Hello World")),
            [1993528491812861608]
        );
        assert_eq!(
            raw(chain(20, 128).hash(
                "test-model",
                b"This is a longer prompt that should span multiple blocks based on the block size"
            )),
            [
                8626393537367828840,
                16829149375953976751,
                13000309909902416355,
                4164474810863779859
            ]
        );
        let prompt = format!("A very long prompt {}", "test ".repeat(100));
        assert_eq!(
            raw(chain(10, 3).hash("test-model", prompt.as_bytes())),
            [
                16111477285489601796,
                3196756824981370828,
                16885010878743789486
            ]
        );
    }

    #[test]
    fn empty_prompt_has_no_hashes() {
        assert!(chain(64, 128).hash("m", b"").is_empty());
    }

    #[test]
    fn decimal_is_unpadded() {
        let mut values = vec![0u64, 7, 10, 12345, u64::MAX, u64::MAX - 1];
        for p in 1..20 {
            let ten = 10u64.pow(p);
            values.extend([ten - 1, ten, ten + 1, ten.saturating_mul(9)]);
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.extend([x, x >> (x % 64)]);
        }
        for n in values {
            let mut buf = Vec::new();
            push_decimal(&mut buf, n);
            assert_eq!(buf, n.to_string().as_bytes());
        }
    }

    #[test]
    fn multibyte_utf8_is_split_by_bytes() {
        // "é" is two bytes: a block size of 3 splits the second character.
        let h = chain(3, 8).hash("m", "éé".as_bytes());
        assert_eq!(h.len(), 2);
        let mut manual = Vec::new();
        let first = xxh64(
            format!("{}", xxh64(b"m", 0))
                .as_bytes()
                .iter()
                .chain(&[0xC3, 0xA9, 0xC3])
                .copied()
                .collect::<Vec<u8>>()
                .as_slice(),
            0,
        );
        manual.push(first);
        assert_eq!(h[0].0, manual[0]);
    }

    #[test]
    fn models_do_not_share_hashes() {
        assert_ne!(chain(64, 4).hash("a", b"x"), chain(64, 4).hash("b", b"x"));
    }
}

#[cfg(test)]
mod seeded_tests {
    use super::*;

    #[test]
    fn the_seeded_chain_is_a_chain_and_not_kthenas() {
        let chain = BlockChain {
            block_size: 4,
            max_blocks: 8,
        };
        let hash = |scheme, prompt: &str| {
            let mut out = Vec::new();
            chain.hash_with(scheme, "m", prompt.as_bytes(), &mut out);
            out
        };
        let long = hash(ChainScheme::Seeded, "aaaabbbbccccdd");
        let short = hash(ChainScheme::Seeded, "aaaabbbbcccc");
        assert_eq!(long.len(), 4);
        assert_eq!(&long[..3], &short[..]);
        assert_ne!(hash(ChainScheme::Seeded, "Xaaabbbbcccc")[2], short[2]);
        assert_ne!(hash(ChainScheme::Kthena, "aaaabbbbcccc"), short);
        assert_ne!(
            short,
            {
                let mut out = Vec::new();
                chain.hash_with(ChainScheme::Seeded, "other", b"aaaabbbbcccc", &mut out);
                out
            },
            "the model seeds the chain"
        );
        // The vector: XXH3(model) seeds the first block.
        let first = xxh3_64_with_seed(b"aaaa", xxh3_64_with_seed(b"m", 0));
        assert_eq!(short[0], BlockHash(first));
    }
}
