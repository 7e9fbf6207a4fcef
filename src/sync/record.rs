//! The stream entry: one served request's record, in a compact binary encoding.
//!
//! Each record is one stream entry with a single field `r` holding (little-endian):
//! ```text
//! u8  version: the block scheme (1 = Kthena's decimal chain, 2 = the affinity mode's seeded
//!     XXH3 chain; the layout is the same)
//! u64 replica id          (random per process; a replica skips its own entries)
//! u32 blockSizeToHash     (a replica hashing differently ignores the entry)
//! u32 maxBlocksToMatch
//! u16 len + model name
//! u16 len + pod label     ("namespace/name")
//! u16 len + pod generation (the Kubernetes UID; a static pod's `generation:`, else its
//!                          engine's start time; empty while unknown)
//! u64 x n block hashes    (the rest of the payload)
//! ```
//! 8 bytes per block plus 23 bytes and the three strings (a 64-block record of the benchmark is
//! 550 bytes; decimal hashes in JSON would need up to 21 bytes per block). Decoding borrows from
//! the payload and never allocates except to fill the caller's hash buffer.

use thiserror::Error;

use crate::hashing::{BlockHash, ChainScheme};

/// The encoding version of Kthena-chained records (the seeded chain's is one more).
pub const VERSION: u8 = 1;
const SEEDED_VERSION: u8 = 2;
/// The stream entry's field name.
pub const FIELD: &str = "r";

const HEADER: usize = 1 + 8 + 4 + 4;

/// The hashing parameters a record was produced with; entries must match to be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashParams {
    pub block_size_to_hash: u32,
    pub max_blocks_to_match: u32,
    pub scheme: ChainScheme,
}

/// A decoded record, borrowing its strings from the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub replica: u64,
    pub params: HashParams,
    pub model: &'a str,
    pub pod: &'a str,
    pub generation: &'a str,
}

/// Why a payload could not be decoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("unsupported record version {0}")]
    Version(u8),
    #[error("record truncated at byte {0}")]
    Truncated(usize),
    #[error("record string at byte {0} is not UTF-8")]
    Utf8(usize),
    #[error("record hash list of {0} bytes is not a multiple of 8")]
    Hashes(usize),
}

/// Encodes one record.
pub fn encode(
    replica: u64,
    params: HashParams,
    model: &str,
    pod: &str,
    generation: &str,
    hashes: &[BlockHash],
) -> Vec<u8> {
    let strings = [model, pod, generation];
    let len = HEADER
        + strings
            .iter()
            .map(|s| 2 + s.len().min(0xFFFF))
            .sum::<usize>();
    let mut out = Vec::with_capacity(len + 8 * hashes.len());
    out.push(match params.scheme {
        ChainScheme::Kthena => VERSION,
        ChainScheme::Seeded => SEEDED_VERSION,
    });
    out.extend_from_slice(&replica.to_le_bytes());
    out.extend_from_slice(&params.block_size_to_hash.to_le_bytes());
    out.extend_from_slice(&params.max_blocks_to_match.to_le_bytes());
    for s in strings {
        // Names longer than 64 KiB cannot be Kubernetes names or served models; cut them at a
        // character boundary rather than fail the routing path.
        let mut end = s.len().min(0xFFFF);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        out.extend_from_slice(&(end as u16).to_le_bytes());
        out.extend_from_slice(&s.as_bytes()[..end]);
    }
    for h in hashes {
        out.extend_from_slice(&h.0.to_le_bytes());
    }
    out
}

/// Decodes a payload; the block hashes replace the contents of `hashes`.
pub fn decode<'a>(
    payload: &'a [u8],
    hashes: &mut Vec<BlockHash>,
) -> Result<RecordRef<'a>, DecodeError> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    let scheme = match r.take(1)?[0] {
        VERSION => ChainScheme::Kthena,
        SEEDED_VERSION => ChainScheme::Seeded,
        other => return Err(DecodeError::Version(other)),
    };
    let replica = u64::from_le_bytes(r.array()?);
    let params = HashParams {
        block_size_to_hash: u32::from_le_bytes(r.array()?),
        max_blocks_to_match: u32::from_le_bytes(r.array()?),
        scheme,
    };
    let model = r.string()?;
    let pod = r.string()?;
    let generation = r.string()?;
    let rest = &payload[r.pos..];
    if rest.len() % 8 != 0 {
        return Err(DecodeError::Hashes(rest.len()));
    }
    hashes.clear();
    hashes.extend(
        rest.chunks_exact(8)
            .map(|c| BlockHash(u64::from_le_bytes(c.try_into().expect("8 bytes")))),
    );
    Ok(RecordRef {
        replica,
        params,
        model,
        pod,
        generation,
    })
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos + n;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn string(&mut self) -> Result<&'a str, DecodeError> {
        let len = u16::from_le_bytes(self.array()?) as usize;
        let at = self.pos;
        std::str::from_utf8(self.take(len)?).map_err(|_| DecodeError::Utf8(at))
    }
}
