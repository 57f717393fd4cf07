//! Decoding: both event encodings and all three batch shapes give the same events; block
//! hashes of every msgpack form normalise to the same u64; bad payloads are typed errors.

mod common;

use cohort_kv_events::decode::{decode, BlockRemoved, BlockStored, DecodeError, KvEvent};
use common::*;
use rmpv::Value;

fn sample_events(tagging: Tagging) -> Vec<Value> {
    vec![
        stored(tagging, &[11, 12], None, &tokens(100, 2, 4), 4),
        stored(tagging, &[13], Some(12), &tokens(108, 1, 4), 4),
        removed(tagging, &[11]),
        cleared(tagging),
    ]
}

fn expected() -> Vec<KvEvent> {
    let stored = |hashes: Vec<u64>, parent, tokens| {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes,
            parent,
            token_ids: tokens,
            block_size: 4,
            medium: Some("GPU".into()),
            group_idx: Some(0),
            spec_kind: Some("full_attention".into()),
            ..BlockStored::default()
        })
    };
    vec![
        stored(vec![11, 12], None, tokens(100, 2, 4)),
        stored(vec![13], Some(12), tokens(108, 1, 4)),
        KvEvent::Removed(BlockRemoved {
            block_hashes: vec![11],
            medium: Some("GPU".into()),
            group_idx: Some(0),
        }),
        KvEvent::AllCleared,
    ]
}

#[test]
fn both_encodings_and_every_batch_shape_decode_to_the_same_events() {
    for tagging in [Tagging::Array, Tagging::Map] {
        for shape in [Shape::Triple, Shape::Pair, Shape::Map] {
            let bytes = encode(&batch_value(shape, 1.25, sample_events(tagging), Some(3)));
            let batch = decode(&bytes).unwrap_or_else(|e| panic!("{tagging:?} {shape:?}: {e}"));
            assert_eq!(batch.events, expected(), "{tagging:?} {shape:?}");
            assert_eq!(batch.ts, 1.25);
            let rank = match shape {
                Shape::Pair => None,
                _ => Some(3),
            };
            assert_eq!(batch.dp_rank, rank, "{tagging:?} {shape:?}");
            assert_eq!(batch.skipped.unknown_events, 0);
            assert_eq!(batch.skipped.unknown_fields, 0);
        }
    }
}

#[test]
fn trailing_fields_may_be_absent_in_the_array_form() {
    // vLLM 0.8-era: ["BlockStored", hashes, parent, tokens, block_size, lora_id], no medium.
    let event = Value::Array(vec![
        s("BlockStored"),
        Value::Array(vec![Value::from(5u64)]),
        Value::Nil,
        Value::Array((0..4u32).map(Value::from).collect()),
        Value::from(4),
        Value::Nil,
    ]);
    let batch = decode(&payload(vec![event])).unwrap();
    let KvEvent::Stored(stored) = &batch.events[0] else {
        panic!("{:?}", batch.events)
    };
    assert_eq!(stored.block_hashes, vec![5]);
    assert_eq!(stored.medium, None);
    assert_eq!(stored.group_idx, None);
}

/// `[1.0, [["BlockRemoved", [<hashes>], "GPU"]], nil]` with the hashes' msgpack written
/// byte by byte, so every integer width is exercised (an encoder picks the shortest).
fn removed_with_raw_hashes(raw: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![0x93, 0xcb];
    out.extend_from_slice(&1.0f64.to_be_bytes());
    out.extend_from_slice(&[0x91, 0x93, 0xac]);
    out.extend_from_slice(b"BlockRemoved");
    out.push(0xdc);
    out.extend_from_slice(&(raw.len() as u16).to_be_bytes());
    for hash in raw {
        out.extend_from_slice(hash);
    }
    out.extend_from_slice(&[0xa3, b'G', b'P', b'U', 0xc0]);
    out
}

#[test]
fn block_hashes_of_every_width_sign_and_bytes_normalise_to_u64() {
    let mut digest = [0u8; 32];
    for (i, b) in digest.iter_mut().enumerate() {
        *b = i as u8;
    }
    let mut bin32 = vec![0xc4, 32];
    bin32.extend_from_slice(&digest);
    let u64_bytes = [0xcf, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10];
    let i64_bytes = {
        let mut v = vec![0xd3];
        v.extend_from_slice(&(-2i64).to_be_bytes());
        v
    };
    let raw: Vec<&[u8]> = vec![
        &[0x07],                         // positive fixint
        &[0xcc, 0xff],                   // uint8
        &[0xcd, 0x12, 0x34],             // uint16
        &[0xce, 0x12, 0x34, 0x56, 0x78], // uint32
        &u64_bytes,                      // uint64
        &[0xd0, 0xff],                   // int8 -1
        &i64_bytes,                      // int64 -2
        &[0xff],                         // negative fixint -1
        &bin32,                          // 32 raw bytes (sha256 digest)
        &[0xc4, 0x02, 0x01, 0x02],       // short bytes
    ];
    let batch = decode(&removed_with_raw_hashes(&raw)).unwrap();
    let KvEvent::Removed(removed) = &batch.events[0] else {
        panic!("{:?}", batch.events)
    };
    assert_eq!(
        removed.block_hashes,
        vec![
            7,
            255,
            0x1234,
            0x1234_5678,
            0xfedc_ba98_7654_3210,
            u64::MAX,
            u64::MAX - 1,
            u64::MAX,
            // The digest's last 8 bytes, big-endian: what vLLM's int form keeps.
            u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31]),
            0x0102,
        ]
    );
}

#[test]
fn unknown_events_and_fields_are_skipped_and_counted() {
    let mut events = sample_events(Tagging::Map);
    events.push(Value::Map(vec![
        (s("type"), s("BlockOffloaded")),
        (s("x"), Value::from(1)),
    ]));
    if let Value::Map(entries) = &mut events[0] {
        entries.push((s("remaining_copy_counts"), Value::Nil));
        entries.push((s("snapshot_version"), Value::from(2)));
    }
    let mut array_events = sample_events(Tagging::Array);
    array_events.push(Value::Array(vec![s("SomethingNew"), Value::from(1)]));
    if let Value::Array(items) = &mut array_events[2] {
        // BlockRemoved's three known fields are all there: these two are beyond them.
        items.push(Value::from(7));
        items.push(s("a field from the future"));
    }
    for (events, fields) in [(events, 2), (array_events, 2)] {
        let batch = decode(&payload(events)).unwrap();
        assert_eq!(batch.events.len(), 4);
        assert_eq!(batch.skipped.unknown_events, 1);
        assert_eq!(batch.skipped.unknown_fields, fields);
    }
}

#[test]
fn bad_payloads_are_typed_errors() {
    let truncated = {
        let bytes = payload(sample_events(Tagging::Map));
        bytes[..bytes.len() / 2].to_vec()
    };
    assert!(matches!(decode(&truncated), Err(DecodeError::Msgpack(_))));
    assert!(matches!(decode(&[]), Err(DecodeError::Msgpack(_))));
    assert_eq!(decode(&[0xc0]), Err(DecodeError::BatchShape));
    let mut trailing = payload(vec![]);
    trailing.push(0x01);
    assert_eq!(decode(&trailing), Err(DecodeError::Trailing(1)));
    // A token id that is a string, a hash that is a float, an untagged event.
    let bad_tokens = Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), Value::Array(vec![Value::from(1)])),
        (s("parent_block_hash"), Value::Nil),
        (s("token_ids"), Value::Array(vec![s("hello")])),
        (s("block_size"), Value::from(1)),
    ]);
    assert!(matches!(
        decode(&payload(vec![bad_tokens])),
        Err(DecodeError::Event {
            field: "token_ids",
            ..
        })
    ));
    let bad_hash = Value::Array(vec![s("BlockRemoved"), Value::Array(vec![Value::F64(1.0)])]);
    assert!(matches!(
        decode(&payload(vec![bad_hash])),
        Err(DecodeError::Event {
            field: "block_hashes",
            ..
        })
    ));
    assert_eq!(
        decode(&payload(vec![Value::from(3)])),
        Err(DecodeError::Untagged { index: 0 })
    );
    // Deep nesting is refused, not recursed into.
    let mut deep = vec![0x91u8; 10_000];
    deep.push(0xc0);
    assert!(decode(&deep).is_err());
    // A length that claims 4 G elements does not allocate them.
    assert!(decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
}

#[test]
fn the_committed_fixtures_decode_to_the_same_events() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let array = decode(&std::fs::read(dir.join("array-tagged.msgpack")).unwrap()).unwrap();
    let mut map = decode(&std::fs::read(dir.join("map-tagged.msgpack")).unwrap()).unwrap();
    // The newer encoding adds the group's fields; everything else is the same.
    for event in &mut map.events {
        match event {
            KvEvent::Stored(stored) => {
                assert_eq!(stored.group_idx, Some(0));
                assert_eq!(stored.spec_kind.as_deref(), Some("full_attention"));
                stored.group_idx = None;
                stored.spec_kind = None;
            }
            KvEvent::Removed(removed) => removed.group_idx = None,
            KvEvent::AllCleared => {}
        }
    }
    assert_eq!(array.events, map.events);
    assert_eq!(array.ts, map.ts);
    assert_eq!(array.dp_rank, Some(0));
    assert_eq!(array.events.len(), 4);
    assert!(matches!(array.events[3], KvEvent::AllCleared));
}
