use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use super::{MAX_DEPTH, fast, from_slice, same_short};

use crate::fuzzing::Item;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Unit;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Newtype(u32);

/// Every shape the fast reader decodes itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Wide {
    a: u8,
    b: i16,
    c: f32,
    d: bool,
    e: Vec<String>,
    f: BTreeMap<String, i64>,
    g: (u8, String),
    h: Unit,
    i: Newtype,
    j: char,
    k: Option<Option<u16>>,
    l: Option<Box<Item>>,
    m: (),
}

/// serde's attributes that buffer, rename or default what they read: the reader must agree
/// with `rmp_serde` through each of them.
#[expect(
    dead_code,
    reason = "read through Debug, which the agreement checks compare"
)]
#[derive(Debug, Deserialize)]
struct Attributes {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(alias = "k")]
    a: Option<u8>,
    #[serde(flatten)]
    extra: BTreeMap<String, serde_json::Value>,
}

#[expect(
    dead_code,
    reason = "read through Debug, which the agreement checks compare"
)]
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Untagged {
    Number(u32),
    Text(String),
    Bytes(Vec<u8>),
    Item(Item),
}

#[expect(
    dead_code,
    reason = "read through Debug, which the agreement checks compare"
)]
#[derive(Debug, Deserialize)]
#[serde(tag = "type", deny_unknown_fields)]
enum Tagged {
    X { a: u8 },
    Y { b: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Reason {
    Stop,
    Length,
}

fn named<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encodes")
}

fn positional<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec(value).expect("encodes")
}

fn item(i: u32) -> Item {
    Item {
        token_ids: vec![i, 151_935],
        text: Some(" streams".to_owned()),
        cum_log_probs: Some(-0.25 * f64::from(i)),
        finish_reason: (i == 7).then(|| "length".to_owned()),
        index: Some(i),
    }
}

/// Whatever the fast reader decodes, `rmp_serde` decodes to the same value.
fn agrees<T: DeserializeOwned + Debug>(bytes: &[u8]) {
    if let Some(value) = fast::<T>(bytes) {
        let reference = rmp_serde::from_slice::<T>(bytes);
        assert_eq!(
            format!("{:?}", Ok::<_, ()>(value)),
            format!("{:?}", reference.map_err(|_| ())),
            "the fast reader disagrees with rmp_serde on {bytes:02x?}"
        );
    }
}

#[test]
fn the_engines_items_are_decoded_by_the_fast_reader_in_either_encoding() {
    for i in 0..10 {
        let item = item(i);
        assert_eq!(fast::<Item>(&named(&item)), Some(item.clone()), "named");
        assert_eq!(fast::<Item>(&positional(&item)), Some(item), "positional");
    }
}

#[test]
fn every_shape_but_enums_is_decoded_by_the_fast_reader() {
    let wide = Wide {
        a: 200,
        b: -300,
        c: 1.5,
        d: true,
        e: vec!["é".to_owned(), String::new()],
        f: BTreeMap::from([("x".to_owned(), i64::MIN), ("y".to_owned(), 70_000)]),
        g: (9, "nine".to_owned()),
        h: Unit,
        i: Newtype(u32::MAX),
        j: 'λ',
        k: Some(Some(65_535)),
        l: Some(Box::new(item(7))),
        m: (),
    };
    assert_eq!(fast::<Wide>(&named(&wide)), Some(wide.clone()), "named");
    assert_eq!(fast::<Wide>(&positional(&wide)), Some(wide), "positional");
}

#[test]
fn items_the_fast_reader_does_not_mirror_are_decoded_by_rmp_serde() {
    let bytes = named(&(Reason::Length, 5u8));
    assert_eq!(fast::<(Reason, u8)>(&bytes), None, "enums are rmp_serde's");
    assert_eq!(
        from_slice::<(Reason, u8)>(&bytes).ok(),
        Some((Reason::Length, 5))
    );

    let deep = (0..MAX_DEPTH + 1).fold(named(&1u8), |inner, _| [&[0x91][..], &inner].concat());
    assert_eq!(
        fast::<serde_json::Value>(&deep),
        None,
        "nesting past MAX_DEPTH"
    );
    assert!(from_slice::<serde_json::Value>(&deep).is_ok());
}

/// A field that recovers from any error with a default: a reader that raised an error there
/// would decode a different item than `rmp_serde`.
#[derive(Debug, PartialEq, Deserialize)]
struct Lenient {
    index: u32,
    #[serde(deserialize_with = "or_none")]
    reason: Option<Reason>,
}

fn or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Reason>, D::Error> {
    Ok(Option::<Reason>::deserialize(d).unwrap_or(None))
}

#[test]
fn an_error_the_item_recovers_from_still_sends_it_to_rmp_serde() {
    #[derive(Serialize)]
    struct Sent {
        index: u32,
        reason: Option<Reason>,
    }
    let bytes = named(&Sent {
        index: 3,
        reason: Some(Reason::Stop),
    });
    let expected = Lenient {
        index: 3,
        reason: Some(Reason::Stop),
    };
    assert_eq!(
        rmp_serde::from_slice::<Lenient>(&bytes).ok(),
        Some(expected)
    );
    assert_eq!(fast::<Lenient>(&bytes), None);
    assert_eq!(
        from_slice::<Lenient>(&bytes).ok(),
        Some(Lenient {
            index: 3,
            reason: Some(Reason::Stop)
        })
    );
}

#[test]
fn an_array_longer_than_its_struct_is_refused_as_rmp_serde_refuses_it() {
    let mut bytes = positional(&item(3));
    assert_eq!(bytes.first(), Some(&0x95), "a five-element fixarray");
    bytes[0] = 0x96;
    bytes.push(0xc0);
    assert_eq!(fast::<Item>(&bytes), None);
    assert!(rmp_serde::from_slice::<Item>(&bytes).is_err());
    assert!(from_slice::<Item>(&bytes).is_err());
}

#[test]
fn buffered_renamed_and_tagged_shapes_decode_as_rmp_serde_decodes_them() {
    let cases = [
        named(&serde_json::json!({"type": "t", "k": 3, "x": [1, "y"], "z": null})),
        named(
            &serde_json::json!([5, "five", [1, 2], {"token_ids": [1], "text": null,
            "cum_log_probs": null, "finish_reason": null, "index": 0}]),
        ),
        named(&serde_json::json!({"type": "Y", "b": "bee"})),
        named(&serde_json::json!({"type": "X", "a": 1, "b": "unknown here"})),
    ];
    for bytes in &cases {
        agrees::<Attributes>(bytes);
        agrees::<Vec<Untagged>>(bytes);
        agrees::<Option<Tagged>>(bytes);
    }
    assert!(
        fast::<Attributes>(&cases[0]).is_some(),
        "flatten is read by the fast reader"
    );
    // An untagged enum tries its variants in turn: a refused try is an error raised, so the
    // item goes to rmp_serde.
    assert!(fast::<Vec<Untagged>>(&cases[1]).is_none());
    assert!(from_slice::<Vec<Untagged>>(&cases[1]).is_ok());
    assert!(
        fast::<Option<Tagged>>(&cases[2]).is_some(),
        "and internally tagged"
    );
    assert!(
        from_slice::<Option<Tagged>>(&cases[3]).is_err(),
        "deny_unknown_fields"
    );
}

#[test]
fn a_cut_item_is_refused_as_rmp_serde_refuses_it() {
    let bytes = named(&item(7));
    for end in 0..bytes.len() {
        let cut = &bytes[..end];
        assert_eq!(fast::<Item>(cut), None, "cut at {end}");
        let ours = from_slice::<Item>(cut).map_err(|e| e.to_string());
        let theirs = rmp_serde::from_slice::<Item>(cut).map_err(|e| e.to_string());
        assert_eq!(ours, theirs, "cut at {end}");
    }
}

/// A MessagePack value, to be encoded with any marker width that holds it.
#[derive(Debug, Clone)]
enum Tree {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    Str(String),
    RawStr(Vec<u8>),
    Bin(Vec<u8>),
    Ext(i8, Vec<u8>),
    Array(Vec<Self>),
    Map(Vec<(Self, Self)>),
}

fn tree() -> impl Strategy<Value = Tree> {
    let field = prop::sample::select(vec![
        "token_ids",
        "text",
        "cum_log_probs",
        "finish_reason",
        "index",
        "a",
        "k",
        "other",
        "type",
        "X",
        "Y",
        "b",
        "extra",
        "secs",
        "nanos",
    ]);
    let leaf = prop_oneof![
        Just(Tree::Nil),
        any::<bool>().prop_map(Tree::Bool),
        prop_oneof![0..300u64, any::<u64>()].prop_map(Tree::Uint),
        prop_oneof![-300..0i64, any::<i64>()].prop_map(Tree::Int),
        any::<f32>().prop_map(Tree::F32),
        any::<f64>().prop_map(Tree::F64),
        field.prop_map(|f| Tree::Str(f.to_owned())),
        ".{0,40}".prop_map(Tree::Str),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Tree::RawStr),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Tree::Bin),
        (any::<i8>(), prop::collection::vec(any::<u8>(), 0..5)).prop_map(|(t, d)| Tree::Ext(t, d)),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Tree::Array),
            prop::collection::vec((inner.clone(), inner), 0..6).prop_map(Tree::Map),
        ]
    })
}

/// Encodes `tree`, choosing each marker's width from `widths` (any width the value fits).
fn encode(tree: &Tree, widths: &mut impl Iterator<Item = u8>, out: &mut Vec<u8>) {
    let mut wide = || widths.next().unwrap_or(0) % 3;
    match tree {
        Tree::Nil => out.push(0xc0),
        Tree::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Tree::Uint(n) => match (u8::try_from(*n), wide()) {
            (Ok(n @ 0..=0x7f), 0) => out.push(n),
            (Ok(n), 1) => out.extend([0xcc, n]),
            _ => {
                out.push(0xcf);
                out.extend(n.to_be_bytes());
            }
        },
        Tree::Int(n) => match (i8::try_from(*n), wide()) {
            (Ok(n @ -32..=-1), 0) => out.extend(n.to_be_bytes()),
            (Ok(n), 1) => out.extend([0xd0, n.to_be_bytes()[0]]),
            _ => {
                out.push(0xd3);
                out.extend(n.to_be_bytes());
            }
        },
        Tree::F32(f) => {
            out.push(0xca);
            out.extend(f.to_be_bytes());
        }
        Tree::F64(f) => {
            out.push(0xcb);
            out.extend(f.to_be_bytes());
        }
        Tree::Str(s) => sized(out, [0xa0, 0xd9, 0xda, 0xdb], 31, s.as_bytes(), wide()),
        Tree::RawStr(b) => sized(out, [0xa0, 0xd9, 0xda, 0xdb], 31, b, wide()),
        Tree::Bin(b) => sized(out, [0xc4, 0xc4, 0xc5, 0xc6], 0, b, wide() + 1),
        Tree::Ext(t, d) => {
            out.extend([0xc7, u8::try_from(d.len()).unwrap_or(0), t.to_be_bytes()[0]]);
            out.extend(d);
        }
        Tree::Array(items) => {
            header(out, [0x90, 0xdc, 0xdd], items.len(), wide());
            for t in items {
                encode(t, widths, out);
            }
        }
        Tree::Map(entries) => {
            header(out, [0x80, 0xde, 0xdf], entries.len(), wide());
            for (k, v) in entries {
                encode(k, widths, out);
                encode(v, widths, out);
            }
        }
    }
}

/// A string or bin: markers for fix (up to `fix_max`), 8-, 16- and 32-bit lengths.
fn sized(out: &mut Vec<u8>, markers: [u8; 4], fix_max: usize, bytes: &[u8], wide: u8) {
    let len = u32::try_from(bytes.len()).unwrap_or(0);
    match wide {
        0 if bytes.len() <= fix_max => out.push(markers[0] | len.to_be_bytes()[3]),
        0 | 1 if len <= 0xff => out.extend([markers[1], len.to_be_bytes()[3]]),
        1 | 2 if len <= 0xffff => {
            out.push(markers[2]);
            out.extend(len.to_be_bytes()[2..].iter());
        }
        _ => {
            out.push(markers[3]);
            out.extend(len.to_be_bytes());
        }
    }
    out.extend(bytes);
}

fn header(out: &mut Vec<u8>, markers: [u8; 3], len: usize, wide: u8) {
    let len = u32::try_from(len).unwrap_or(0);
    match wide {
        0 if len <= 15 => out.push(markers[0] | len.to_be_bytes()[3]),
        0 | 1 => {
            out.push(markers[1]);
            out.extend(len.to_be_bytes()[2..].iter());
        }
        _ => {
            out.push(markers[2]);
            out.extend(len.to_be_bytes());
        }
    }
}

proptest! {
    #[test]
    fn any_value_the_fast_reader_decodes_is_the_value_rmp_serde_decodes(
        tree in tree(),
        widths in prop::collection::vec(any::<u8>(), 64),
        trailing in prop::collection::vec(any::<u8>(), 0..3),
    ) {
        let mut bytes = Vec::new();
        encode(&tree, &mut widths.into_iter().cycle(), &mut bytes);
        bytes.extend(trailing);
        agrees::<serde_json::Value>(&bytes);
        agrees::<Item>(&bytes);
        agrees::<Wide>(&bytes);
        agrees::<Vec<Option<String>>>(&bytes);
        agrees::<BTreeMap<String, (u8, f64)>>(&bytes);
        agrees::<serde::de::IgnoredAny>(&bytes);
        agrees::<Attributes>(&bytes);
        agrees::<Vec<Untagged>>(&bytes);
        agrees::<Option<Tagged>>(&bytes);
        agrees::<(std::time::Duration, std::net::IpAddr, Reason)>(&bytes);
    }

    #[test]
    fn random_bytes_decode_as_rmp_serde_decodes_them(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        agrees::<serde_json::Value>(&bytes);
        agrees::<Item>(&bytes);
        agrees::<Wide>(&bytes);
    }

    #[test]
    fn items_with_any_fields_round_trip_through_the_fast_reader(
        ids in prop::collection::vec(any::<u32>(), 0..4),
        text in proptest::option::of(".{0,24}"),
        cum in proptest::option::of(-1e9..1e9f64),
        reason in proptest::option::of("[a-z]{0,8}"),
        index in proptest::option::of(any::<u32>()),
    ) {
        let item = Item { token_ids: ids, text, cum_log_probs: cum, finish_reason: reason, index };
        prop_assert_eq!(fast::<Item>(&named(&item)), Some(item.clone()));
        prop_assert_eq!(fast::<Item>(&positional(&item)), Some(item));
    }
}

proptest! {
    /// Field names are compared eight bytes at a time: the same as comparing them byte by
    /// byte, whatever their lengths and wherever they differ.
    #[test]
    fn names_compare_as_their_bytes_do(
        a in proptest::collection::vec(any::<u8>(), 0..40),
        flip in any::<prop::sample::Index>(),
        grow in any::<bool>(),
    ) {
        prop_assert!(same_short(&a, &a));
        let mut b = a.clone();
        if grow {
            b.push(0);
        } else if !b.is_empty() {
            let i = flip.index(b.len());
            b[i] ^= 1;
        }
        prop_assert_eq!(same_short(&a, &b), a == b);
        prop_assert_eq!(same_short(&b, &a), a == b);
    }
}
