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
//!
//! A request's `cache_salt` (vLLM's per-tenant cache isolation, [`CacheSalt`]) extends the bytes
//! the first `prev` is hashed from, in both schemes: `model ++ 0x00 ++ salt` instead of `model`
//! (so Kthena's seed becomes `XXH64(model ++ 0x00 ++ salt, 0)`). Without a salt nothing changes.
//! Vectors in `docs/routing.md` ("Cache salts").

use std::fmt;

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

/// A request's `cache_salt`: a non-empty string that namespaces its chain, so prompts the engine
/// will not share across salts never match. Its `Debug` hides the value: a salt is a tenant's
/// secret and is never logged.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CacheSalt(String);

impl CacheSalt {
    /// A salt, or `None` for an empty string (vLLM refuses `""`; it namespaces nothing).
    pub fn new(salt: impl Into<String>) -> Option<CacheSalt> {
        let salt = salt.into();
        (!salt.is_empty()).then_some(CacheSalt(salt))
    }

    /// The salt's text, for hashing (never for a log line).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CacheSalt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CacheSalt(<redacted>)")
    }
}

/// The bytes a chain's first `prev` is hashed from: `model`, or `model ++ 0x00 ++ salt`.
fn with_seed_bytes<T>(model: &str, salt: Option<&CacheSalt>, f: impl FnOnce(&[u8]) -> T) -> T {
    match salt {
        None => f(model.as_bytes()),
        Some(salt) => {
            let mut bytes = Vec::with_capacity(model.len() + 1 + salt.0.len());
            bytes.extend_from_slice(model.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(salt.0.as_bytes());
            f(&bytes)
        }
    }
}

impl ChainScheme {
    /// The chain's first `prev`: `XXH64` (Kthena) or `XXH3` (seeded) of `model`, or of
    /// `model ++ 0x00 ++ salt` when the request has a salt.
    pub fn seed(self, model: &str, salt: Option<&CacheSalt>) -> u64 {
        with_seed_bytes(model, salt, |bytes| match self {
            ChainScheme::Kthena => xxh64(bytes, 0),
            ChainScheme::Seeded => xxh3_64_with_seed(bytes, 0),
        })
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
        self.hash_salted(ChainScheme::Kthena, model, None, prompt, out);
    }

    /// Kthena's chain from `prev` (the seed).
    fn kthena_from(&self, mut prev: u64, covered: &[u8], out: &mut Vec<BlockHash>) {
        // The buffer holds one block: never more than the prompt, whatever the configured size.
        let mut buf = Vec::with_capacity(20 + self.block_size.min(covered.len()));
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
        self.hash_salted(scheme, model, None, prompt, out);
    }

    /// Hashes `prompt` for `model` and the request's `salt` into `out` (cleared first) with
    /// `scheme`; without a salt, the same as [`BlockChain::hash_with`].
    pub fn hash_salted(
        &self,
        scheme: ChainScheme,
        model: &str,
        salt: Option<&CacheSalt>,
        prompt: &[u8],
        out: &mut Vec<BlockHash>,
    ) {
        out.clear();
        if prompt.is_empty() || self.block_size == 0 || self.max_blocks == 0 {
            return;
        }
        let covered = &prompt[..prompt.len().min(self.coverage())];
        out.reserve(covered.len().div_ceil(self.block_size));
        let seed = scheme.seed(model, salt);
        match scheme {
            ChainScheme::Kthena => self.kthena_from(seed, covered, out),
            ChainScheme::Seeded => {
                let mut prev = seed;
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
    fn a_block_size_past_any_prompt_hashes_it_as_one_block_without_reserving_the_size() {
        // `blockSizeToHash: 1000000000000` passes Kthena's lenient parsing; the buffer was once
        // reserved at the configured size and aborted the process on the first prompt.
        let huge = chain(usize::MAX / 2, 128).hash("test-model", b"Hello World");
        assert_eq!(huge, chain(64, 128).hash("test-model", b"Hello World"));
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

#[cfg(test)]
mod salt_tests {
    use super::*;

    const LONG: &[u8] =
        b"This is a longer prompt that should span multiple blocks based on the block size";

    fn salt(s: &str) -> CacheSalt {
        CacheSalt::new(s).unwrap()
    }

    fn hash(
        scheme: ChainScheme,
        salt: Option<&CacheSalt>,
        prompt: &[u8],
        block_size: usize,
    ) -> Vec<u64> {
        let chain = BlockChain {
            block_size,
            max_blocks: 128,
        };
        let mut out = Vec::new();
        chain.hash_salted(scheme, "test-model", salt, prompt, &mut out);
        out.into_iter().map(|h| h.0).collect()
    }

    /// The published vectors (docs/routing.md, "Cache salts"), also computed independently with
    /// python-xxhash 4.1.0.
    #[test]
    fn salted_vectors() {
        let a = salt("tenant-a");
        let b = salt("tenant-b");
        assert_eq!(
            ChainScheme::Kthena.seed("test-model", Some(&a)),
            13287527446802729876
        );
        assert_eq!(xxh64(b"test-model\0tenant-a", 0), 13287527446802729876);
        assert_eq!(
            ChainScheme::Kthena.seed("test-model", Some(&b)),
            17520345827515491585
        );
        assert_eq!(
            ChainScheme::Seeded.seed("test-model", Some(&a)),
            12075836082345028361
        );
        let kthena = ChainScheme::Kthena;
        assert_eq!(
            hash(kthena, Some(&a), b"Hello World", 64),
            [6447818609939814824]
        );
        assert_eq!(
            hash(kthena, Some(&b), b"Hello World", 64),
            [15564487492622865154]
        );
        assert_eq!(
            hash(kthena, Some(&a), LONG, 20),
            [
                15126298957882171758,
                7954115306578130989,
                16740251641848740211,
                7615991603394404393
            ]
        );
        let seeded = ChainScheme::Seeded;
        assert_eq!(
            hash(seeded, None, LONG, 20),
            [
                7148680427111760044,
                2723262065007942063,
                11415240876371371027,
                7146414074292079233
            ]
        );
        assert_eq!(
            hash(seeded, Some(&a), LONG, 20),
            [
                15646180716209337870,
                11566986798757205445,
                12594206405602097053,
                17838813379075059271
            ]
        );
        assert_eq!(
            hash(seeded, Some(&a), b"Hello World", 128),
            [5682365100187000960]
        );
    }

    #[test]
    fn no_salt_is_the_kthena_chain_unchanged() {
        for scheme in [ChainScheme::Kthena, ChainScheme::Seeded] {
            let chain = BlockChain {
                block_size: 20,
                max_blocks: 128,
            };
            let mut with = Vec::new();
            chain.hash_with(scheme, "test-model", LONG, &mut with);
            let with: Vec<u64> = with.into_iter().map(|h| h.0).collect();
            assert_eq!(hash(scheme, None, LONG, 20), with);
        }
        assert_eq!(
            ChainScheme::Kthena.seed("test-model", None),
            3725054772343846052
        );
        assert_eq!(
            hash(ChainScheme::Kthena, None, b"Hello World", 64),
            [1993528491812861608]
        );
    }

    /// Within one model, the seed bytes are `model` or `model ++ 0x00 ++ salt`: distinct salts
    /// give distinct bytes (and none equals the unsalted `model`), so distinct chains.
    #[test]
    fn salts_never_share_a_block() {
        let salts = [
            None,
            Some(salt("a")),
            Some(salt("b")),
            Some(salt("ab")),
            Some(salt("\0")),
            Some(salt("a\0")),
            Some(salt("test-model")),
        ];
        let prompt = "shared system prompt ".repeat(20);
        for scheme in [ChainScheme::Kthena, ChainScheme::Seeded] {
            let chains: Vec<Vec<u64>> = salts
                .iter()
                .map(|s| hash(scheme, s.as_ref(), prompt.as_bytes(), 16))
                .collect();
            for (i, x) in chains.iter().enumerate() {
                for y in &chains[i + 1..] {
                    assert!(
                        x.iter().all(|h| !y.contains(h)),
                        "{} {:?}",
                        scheme.as_str(),
                        salts[i]
                    );
                }
            }
        }
    }

    #[test]
    fn an_empty_salt_is_no_salt_and_debug_hides_the_salt() {
        assert_eq!(CacheSalt::new(""), None);
        let s = salt("tenant-secret-42");
        assert_eq!(s.expose(), "tenant-secret-42");
        assert_eq!(format!("{s:?}"), "CacheSalt(<redacted>)");
        assert!(!format!("{:?}", Some(&s)).contains("secret"));
    }
}
