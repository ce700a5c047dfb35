//! The cluster secret's challenge-response is specified by a byte vector in
//! `docs/protocol.md` (section 7.6): this test reads the two HELLOs and the two AUTH frames
//! from the spec and checks that the proofs are what this crate computes from the spec's
//! secret, and that each proof verifies only for its own role.

use std::collections::BTreeMap;

use bytes::BytesMut;
use velo_session::ClusterSecret;
use velo_wire::{Auth, DEFAULT_MAX_FRAME_LEN, Frame, FrameDecoder, Hello, Role};

/// The secret section 7.6 names, as ASCII.
const SECRET: &[u8] = b"velo protocol v3 example secret!";

fn spec() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md is readable")
}

/// The frames of the spec's `hex` blocks, by vector name.
fn frames(doc: &str) -> BTreeMap<String, Frame> {
    let mut out = BTreeMap::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```hex" {
            continue;
        }
        let (mut name, mut bytes) = (String::new(), Vec::new());
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            if let Some(n) = line.trim().strip_prefix("# vector:") {
                name = n.trim().to_owned();
                continue;
            }
            let data = line.split('#').next().unwrap_or_default();
            bytes.extend(
                data.split_whitespace()
                    .map(|t| u8::from_str_radix(t, 16).unwrap()),
            );
        }
        let mut src = BytesMut::from(&bytes[..]);
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_FRAME_LEN);
        // The spec's PACKED example (section 7.7) too.
        decoder.accept_packed();
        let frame = decoder.decode(&mut src).unwrap().unwrap();
        out.insert(name, frame);
    }
    out
}

fn hello(frames: &BTreeMap<String, Frame>, name: &str) -> Hello {
    match &frames[name] {
        Frame::Hello(h) => *h,
        other => panic!("{name} is {other:?}"),
    }
}

fn auth(frames: &BTreeMap<String, Frame>, name: &str) -> Auth {
    match &frames[name] {
        Frame::Auth(a) => *a,
        other => panic!("{name} is {other:?}"),
    }
}

#[test]
fn the_spec_names_the_secret_of_its_vector() {
    let doc = spec();
    let quoted = format!("`{}`", std::str::from_utf8(SECRET).unwrap());
    assert!(
        doc.contains(&quoted),
        "section 7.6 names the secret {quoted}"
    );
}

#[test]
fn the_spec_proofs_are_the_hmacs_this_crate_computes() {
    let doc = spec();
    let f = frames(&doc);
    let worker = hello(&f, "hello-worker-auth");
    let frontend = hello(&f, "hello-frontend-auth");
    let secret = ClusterSecret::new(SECRET).unwrap();
    let front_proof = secret.proof(Role::Frontend, &worker, &frontend);
    let worker_proof = secret.proof(Role::Worker, &worker, &frontend);
    assert_eq!(
        front_proof,
        auth(&f, "auth-frontend"),
        "{:02x?}",
        front_proof.mac
    );
    assert_eq!(
        worker_proof,
        auth(&f, "auth-worker"),
        "{:02x?}",
        worker_proof.mac
    );
}

#[test]
fn a_proof_verifies_for_its_role_and_exchange_only() {
    let f = frames(&spec());
    let worker = hello(&f, "hello-worker-auth");
    let frontend = hello(&f, "hello-frontend-auth");
    let secret = ClusterSecret::new(SECRET).unwrap();
    let proof = auth(&f, "auth-worker");
    assert!(secret.verify(Role::Worker, &worker, &frontend, &proof));
    assert!(
        !secret.verify(Role::Frontend, &worker, &frontend, &proof),
        "reflected"
    );
    let mut replayed = frontend;
    replayed.auth_nonce = Some([0x55; 32]);
    assert!(
        !secret.verify(Role::Worker, &worker, &replayed, &proof),
        "another nonce"
    );
    let other = ClusterSecret::new(b"another secret of sixteen+ bytes").unwrap();
    assert!(
        !other.verify(Role::Worker, &worker, &frontend, &proof),
        "another secret"
    );
}
