//! Decoding: golden payloads from msgspec (tests/wire/golden.txt, printed by
//! tests/wire/kv_events_wire.py; the integration test checks the script still prints them) and
//! random bytes.

use proptest::prelude::*;

use super::event::*;

const GOLDEN: &str = include_str!("../../tests/wire/golden.txt");

fn golden(name: &str) -> Vec<u8> {
    let hex = GOLDEN
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} missing from tests/wire/golden.txt"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn decode(name: &str) -> EventBatch {
    decode_batch(&golden(name), &Limits::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn hashes(h: &[u64]) -> Vec<EngineBlockHash> {
    h.iter().copied().map(EngineBlockHash).collect()
}

#[test]
fn block_stored_in_both_encodings() {
    for name in ["map_stored", "array_stored"] {
        let batch = decode(name);
        assert_eq!(batch.ts, 1.5, "{name}");
        assert_eq!(batch.data_parallel_rank, Some(0), "{name}");
        assert_eq!(batch.unknown_events, 0, "{name}");
        assert_eq!(
            batch.events,
            vec![KvEvent::BlockStored {
                block_hashes: hashes(&[1, u64::MAX]),
                parent: None,
                token_ids: vec![1, 2, 300, 70000],
                block_size: 2,
                lora_id: None,
                medium: Some("GPU".into()),
            }],
            "{name}"
        );
    }
}

#[test]
fn fields_newer_engines_append_are_skipped_and_bytes_hashes_folded() {
    for name in ["map_newer_fields", "array_newer_fields"] {
        let batch = decode(name);
        assert_eq!(batch.data_parallel_rank, Some(3), "{name}");
        assert_eq!(
            batch.events,
            vec![
                KvEvent::BlockStored {
                    block_hashes: vec![EngineBlockHash::from_bytes(&[1; 32])],
                    parent: Some(EngineBlockHash::from_bytes(&[2; 32])),
                    token_ids: vec![5, 6],
                    block_size: 2,
                    lora_id: Some(7),
                    medium: Some("CPU".into()),
                },
                // A negative int hash keeps its two's-complement bits.
                KvEvent::BlockRemoved {
                    block_hashes: hashes(&[(-5i64) as u64]),
                    medium: None,
                },
            ],
            "{name}"
        );
    }
    assert_eq!(
        EngineBlockHash::from_bytes(&[1; 32]),
        EngineBlockHash(xxhash_rust::xxh3::xxh3_64(&[1; 32]))
    );
}

#[test]
fn unknown_tags_are_skipped_and_counted() {
    for name in [
        "map_removed_cleared_unknown",
        "array_removed_cleared_unknown",
    ] {
        let batch = decode(name);
        assert_eq!(batch.data_parallel_rank, None, "{name}");
        assert_eq!(batch.unknown_events, 1, "{name}");
        assert_eq!(
            batch.events,
            vec![
                KvEvent::BlockRemoved {
                    block_hashes: hashes(&[9, 10]),
                    medium: Some("GPU".into()),
                },
                KvEvent::AllBlocksCleared,
            ],
            "{name}"
        );
    }
}

#[test]
fn the_first_layout_omits_medium_and_rank() {
    let batch = decode("v09_stored_removed");
    assert_eq!(batch.ts, 4.0);
    assert_eq!(batch.data_parallel_rank, None);
    assert_eq!(
        batch.events,
        vec![
            KvEvent::BlockStored {
                block_hashes: hashes(&[11, (-12i64) as u64]),
                parent: Some(EngineBlockHash(10)),
                token_ids: vec![1, 2],
                block_size: 1,
                lora_id: None,
                medium: None,
            },
            KvEvent::BlockRemoved {
                block_hashes: hashes(&[11]),
                medium: None,
            },
            KvEvent::AllBlocksCleared,
        ]
    );
}

#[test]
fn limits_refuse_before_decoding() {
    let payload = golden("map_removed_cleared_unknown");
    let tight = Limits {
        max_payload_bytes: payload.len() - 1,
        ..Limits::default()
    };
    assert_eq!(
        decode_batch(&payload, &tight),
        Err(DecodeError::PayloadTooLarge {
            len: payload.len(),
            limit: payload.len() - 1
        })
    );
    let few = Limits {
        max_events: 2,
        ..Limits::default()
    };
    assert_eq!(
        decode_batch(&payload, &few),
        Err(DecodeError::TooManyEvents { count: 3, limit: 2 })
    );
    // An events array declaring 2^32-1 elements in a tiny payload: refused by the limit, and
    // with the limit lifted, truncated -- nothing is preallocated from the declared length.
    let huge = [0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff];
    assert!(matches!(
        decode_batch(&huge, &Limits::default()),
        Err(DecodeError::TooManyEvents { .. })
    ));
    let unlimited = Limits {
        max_events: usize::MAX,
        ..Limits::default()
    };
    assert_eq!(
        decode_batch(&huge, &unlimited),
        Err(DecodeError::Truncated { at: 7 })
    );
}

/// A batch of one array-encoded `BlockStored` whose `token_ids` are `tokens` (each already
/// msgpack-encoded, `count` of them).
fn stored_with_tokens(count: u8, tokens: &[u8]) -> Vec<u8> {
    // {"ts": 1, "events": [["BlockStored", [1], nil, [tokens...], 2]]}
    let mut p = vec![0x82, 0xa2, b't', b's', 0x01, 0xa6];
    p.extend_from_slice(b"events");
    p.extend_from_slice(&[0x91, 0x95, 0xab]);
    p.extend_from_slice(b"BlockStored");
    p.extend_from_slice(&[0x91, 0x01, 0xc0, 0x90 | count]);
    p.extend_from_slice(tokens);
    p.push(0x02);
    p
}

#[test]
fn token_ids_are_read_in_every_unsigned_width() {
    let tokens = [
        0x05, // fixint 5
        0xcc, 0xc8, // u8 200
        0xcd, 0x30, 0x39, // u16 12345
        0xce, 0x00, 0x01, 0xf4, 0x00, // u32 128000
        0xce, 0xff, 0xff, 0xff, 0xff, // u32 max
        0xcf, 0, 0, 0, 0, 0, 0, 0, 0x07, // u64 7
        0xd0, 0x09, // i8 9: not a token id
    ];
    let batch = decode_batch(
        &stored_with_tokens(6, &tokens[..tokens.len() - 2]),
        &Limits::default(),
    )
    .expect("six unsigned ids");
    let [KvEvent::BlockStored { token_ids, .. }] = batch.events.as_slice() else {
        panic!("one BlockStored: {:?}", batch.events);
    };
    assert_eq!(token_ids, &[5, 200, 12345, 128_000, u32::MAX, 7]);
    let err = decode_batch(&stored_with_tokens(7, &tokens), &Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BlockStored.token_ids[6]: expected a token id, found integer 9"
    );
    // A u64 past u32::MAX, and an id cut short by the payload's end.
    let big = [0xcf, 0, 0, 0, 0x01, 0, 0, 0, 0];
    let err = decode_batch(&stored_with_tokens(1, &big), &Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BlockStored.token_ids[0]: expected a token id, found integer 4294967296"
    );
    let mut cut = stored_with_tokens(1, &[0xce, 0x00, 0x01]);
    cut.pop();
    assert!(matches!(
        decode_batch(&cut, &Limits::default()),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn errors_name_the_bad_value() {
    // {"ts": 1, "events": [["BlockStored", [1], nil, [1, "x"], 2]]}
    let mut p = vec![0x82, 0xa2, b't', b's', 0x01, 0xa6];
    p.extend_from_slice(b"events");
    p.extend_from_slice(&[0x91, 0x95, 0xab]);
    p.extend_from_slice(b"BlockStored");
    p.extend_from_slice(&[0x91, 0x01, 0xc0, 0x92, 0x01, 0xa1, b'x', 0x02]);
    let err = decode_batch(&p, &Limits::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "BlockStored.token_ids[1]: expected a token id, found string \"x\""
    );
    assert_eq!(
        decode_batch(&[0xa3, b'a', b'b', b'c'], &Limits::default())
            .unwrap_err()
            .to_string(),
        "batch: expected an array or a map, found string \"abc\""
    );
    let mut trailing = golden("array_stored");
    trailing.push(0xc0);
    assert_eq!(
        decode_batch(&trailing, &Limits::default()),
        Err(DecodeError::TrailingBytes { extra: 1 })
    );
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes, &Limits::default());
    }

    /// Corrupting a valid payload (one byte changed, or cut short) is an error or a batch,
    /// never a panic.
    #[test]
    fn corrupted_payloads_never_panic(which in 0usize..9, at in any::<prop::sample::Index>(),
                                      byte in any::<u8>(), cut in any::<bool>()) {
        let names = ["map_stored", "map_newer_fields", "map_removed_cleared_unknown",
            "array_stored", "array_newer_fields", "array_removed_cleared_unknown",
            "v09_stored_removed", "map_stored", "array_stored"];
        let mut p = golden(names[which]);
        let i = at.index(p.len());
        if cut { p.truncate(i) } else { p[i] = byte }
        let _ = decode_batch(&p, &Limits::default());
    }
}
