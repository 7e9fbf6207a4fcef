//! kvcache-aware's hashes, keys and scores against `tests/wire/kvcache_vectors.py`, which
//! computes them independently with Python's `hashlib` (the Runtime's standardized hash) and a
//! transcription of Kthena's scoring: a partial last block, a match broken in the middle, an
//! owner older than its pod's start, a non-candidate owner, the block cap, extreme token ids.
//! Run with the `.venv-wire` Python (`$WIRE_PYTHON`, stdlib only for this script).

use std::collections::BTreeMap;

use prefix_picker::prefix_index::PodSlot;
use prefix_picker::scheduler::affinity::RecentPicks;
use prefix_picker::scheduler::kvcache_aware::{KvBlockOwners, block_hashes, block_key, score};
use prefix_picker::scheduler::{Candidate, EngineStats};
use serde::Deserialize;

use crate::harness::root;

#[derive(Deserialize)]
struct Vectors {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    model: String,
    tokens: Vec<u32>,
    block_size: usize,
    max_blocks: usize,
    hashes: Vec<u64>,
    keys: Vec<String>,
    redis: BTreeMap<String, BTreeMap<String, String>>,
    candidates: Vec<Owner>,
    scores: BTreeMap<String, u32>,
    longest: usize,
}

#[derive(Deserialize)]
struct Owner {
    owner: String,
    started: Option<i64>,
    #[serde(skip)]
    recent: RecentPicks,
}

impl Candidate for Owner {
    fn slot(&self) -> PodSlot {
        PodSlot(0)
    }
    fn inflight(&self) -> i64 {
        0
    }
    fn stats(&self) -> EngineStats {
        EngineStats::default()
    }
    fn recent(&self) -> &RecentPicks {
        &self.recent
    }
    fn rendezvous(&self) -> u64 {
        0
    }
    fn label(&self) -> &str {
        &self.owner
    }
    fn cache_owner(&self) -> Option<&str> {
        Some(&self.owner)
    }
    fn containers_started(&self) -> Option<i64> {
        self.started
    }
}

#[test]
fn hashes_keys_and_scores_match_pythons() {
    let python = crate::kv_events::wire_python();
    let out = std::process::Command::new(python)
        .arg(root().join("tests/wire/kvcache_vectors.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let vectors: Vectors = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(vectors.cases.len(), 6);
    for c in vectors.cases {
        let hashes = block_hashes(&c.tokens, c.block_size, c.max_blocks);
        let ours: Vec<u64> = hashes.iter().map(|h| h.0).collect();
        assert_eq!(ours, c.hashes, "{}: hashes", c.name);
        let keys: Vec<String> = hashes.iter().map(|&h| block_key(&c.model, h)).collect();
        assert_eq!(keys, c.keys, "{}: keys", c.name);
        // What the lookup would read: each key's fields (none for a key not written).
        let owners = KvBlockOwners {
            owners: keys
                .iter()
                .map(|k| {
                    c.redis
                        .get(k)
                        .map(|f| f.iter().map(|(o, w)| (o.clone(), w.clone())).collect())
                        .unwrap_or_default()
                })
                .collect(),
            hashes,
        };
        let s = score(&owners, &c.candidates);
        let ours: BTreeMap<String, u32> = c
            .candidates
            .iter()
            .zip(&s.scores)
            .map(|(o, &v)| (o.owner.clone(), v))
            .collect();
        assert_eq!(ours, c.scores, "{}: scores", c.name);
        assert_eq!(s.longest, c.longest, "{}: longest match", c.name);
    }
}
