//! The cluster secret's challenge-response inside the HELLO exchange (`docs/protocol.md`,
//! section 3.4): each side's HELLO carries a fresh nonce, and each side proves the secret
//! with an AUTH frame holding HMAC-SHA256(secret, label || worker HELLO body || frontend
//! HELLO body). Both bodies hold both nonces and both instance ids, so a proof is good for
//! one lane's exchange only; the labels differ, so a frontend's proof cannot be reflected
//! as a worker's.

use std::sync::Arc;

use bytes::BytesMut;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use velo_wire::{AUTH_MAC_LEN, AUTH_NONCE_LEN, Auth, Hello, Role};

/// Shortest secret accepted, in bytes: 128 bits.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret accepted, in bytes (a file of that size is certainly not a secret).
pub const MAX_SECRET_LEN: usize = 4096;

/// The label a worker's proof starts with.
const WORKER_LABEL: &[u8] = b"velo v3 worker proof";
/// The label a frontend's proof starts with.
const FRONTEND_LABEL: &[u8] = b"velo v3 frontend proof";

/// A secret shared by every frontend and worker of a cluster. Cheap to clone; never printed;
/// two are equal when their bytes are (compared in constant time).
#[derive(Clone)]
pub struct ClusterSecret {
    key: Arc<hmac::Key>,
    bytes: Arc<[u8]>,
}

/// Why bytes are not a usable secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a cluster secret must be {MIN_SECRET_LEN}..={MAX_SECRET_LEN} bytes, got {len}")]
pub struct SecretError {
    /// The length offered.
    pub len: usize,
}

impl ClusterSecret {
    /// A secret from `bytes` (`MIN_SECRET_LEN..=MAX_SECRET_LEN` of them).
    ///
    /// # Errors
    ///
    /// [`SecretError`] for a shorter or longer one.
    pub fn new(bytes: &[u8]) -> Result<Self, SecretError> {
        if !(MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&bytes.len()) {
            return Err(SecretError { len: bytes.len() });
        }
        Ok(Self {
            key: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, bytes)),
            bytes: bytes.into(),
        })
    }

    /// The proof `prover` sends for the exchange of `worker` and `frontend` HELLOs.
    pub fn proof(&self, prover: Role, worker: &Hello, frontend: &Hello) -> Auth {
        let tag = hmac::sign(&self.key, &transcript(prover, worker, frontend));
        let mut mac = [0; AUTH_MAC_LEN];
        mac.copy_from_slice(tag.as_ref());
        Auth { mac }
    }

    /// Whether `auth` is `prover`'s proof for this exchange, compared in constant time.
    pub fn verify(&self, prover: Role, worker: &Hello, frontend: &Hello, auth: &Auth) -> bool {
        hmac::verify(&self.key, &transcript(prover, worker, frontend), &auth.mac).is_ok()
    }

    /// HMAC-SHA256 under this secret over the concatenation of `parts`, for a protocol above
    /// the velo lanes that proves the secret its own way (velo-serve's request plane).
    ///
    /// The caller makes the MAC its own: `parts` starts with a label naming its protocol and
    /// version (no prefix of the HELLO proofs' labels, so no such MAC is ever a lane's proof),
    /// then the prover's role and fresh nonces of both sides (so a proof is good for one
    /// exchange, in one direction), and the concatenation is unambiguous (fixed-length parts,
    /// or parts carrying their own lengths).
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; AUTH_MAC_LEN] {
        let mut ctx = hmac::Context::with_key(&self.key);
        for part in parts {
            ctx.update(part);
        }
        let mut mac = [0; AUTH_MAC_LEN];
        mac.copy_from_slice(ctx.sign().as_ref());
        mac
    }

    /// Whether `mac` is [`mac`](Self::mac)`(parts)`, compared in constant time (a `mac` of
    /// another length is simply not).
    pub fn verify_mac(&self, parts: &[&[u8]], mac: &[u8]) -> bool {
        bool::from(subtle::ConstantTimeEq::ct_eq(&self.mac(parts)[..], mac))
    }
}

impl PartialEq for ClusterSecret {
    fn eq(&self, other: &Self) -> bool {
        // Constant time: comparing two secrets reveals nothing but whether they are equal.
        bool::from(subtle::ConstantTimeEq::ct_eq(&*self.bytes, &*other.bytes))
    }
}

impl Eq for ClusterSecret {}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// A fresh challenge nonce from the OS's generator (never all zeros, which the codec refuses).
///
/// # Panics
///
/// If the OS has no randomness to give (nothing can be authenticated then).
pub(crate) fn nonce() -> [u8; AUTH_NONCE_LEN] {
    let rng = SystemRandom::new();
    let mut n = [0; AUTH_NONCE_LEN];
    loop {
        rng.fill(&mut n).expect("the OS random generator works");
        if n != [0; AUTH_NONCE_LEN] {
            return n;
        }
    }
}

/// `label(prover) || worker HELLO body || frontend HELLO body`.
fn transcript(prover: Role, worker: &Hello, frontend: &Hello) -> BytesMut {
    let label = match prover {
        Role::Worker => WORKER_LABEL,
        Role::Frontend => FRONTEND_LABEL,
    };
    let mut t = BytesMut::with_capacity(label.len() + worker.body_len() + frontend.body_len());
    t.extend_from_slice(label);
    worker.encode_body(&mut t);
    frontend.encode_body(&mut t);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mac` is HMAC-SHA256 over the parts' concatenation, however they are split (RFC 4231,
    /// test case 1: a 20-byte key of 0x0b over "Hi There"), and `verify_mac` accepts that MAC
    /// and nothing else: not another message, MAC, length or secret.
    #[test]
    fn mac_is_hmac_sha256_over_the_parts_and_verify_mac_accepts_only_it() {
        let rfc4231_case1: [u8; AUTH_MAC_LEN] = [
            0xb0, 0x34, 0x4c, 0x61, 0xd8, 0xdb, 0x38, 0x53, 0x5c, 0xa8, 0xaf, 0xce, 0xaf, 0x0b,
            0xf1, 0x2b, 0x88, 0x1d, 0xc2, 0x00, 0xc9, 0x83, 0x3d, 0xa7, 0x26, 0xe9, 0x37, 0x6c,
            0x2e, 0x32, 0xcf, 0xf7,
        ];
        let s = ClusterSecret::new(&[0x0b; 20]).expect("20 bytes are a valid secret");
        assert_eq!(s.mac(&[b"Hi There"]), rfc4231_case1);
        assert_eq!(s.mac(&[b"Hi", b"", b" There"]), rfc4231_case1);
        assert!(s.verify_mac(&[b"Hi T", b"here"], &rfc4231_case1));

        let mut flipped = rfc4231_case1;
        flipped[31] ^= 1;
        assert!(!s.verify_mac(&[b"Hi There"], &flipped));
        assert!(!s.verify_mac(&[b"Hi there"], &rfc4231_case1));
        assert!(!s.verify_mac(&[b"Hi There"], &rfc4231_case1[..31]));
        assert!(!s.verify_mac(&[b"Hi There"], &[]));
        let other = ClusterSecret::new(&[0x0c; 20]).expect("a valid secret");
        assert!(!other.verify_mac(&[b"Hi There"], &rfc4231_case1));
    }
}
