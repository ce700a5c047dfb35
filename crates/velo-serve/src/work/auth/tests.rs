//! The handshake between two in-memory ends: every pairing of secrets, and peers that lie,
//! replay, reflect or say nothing. Loopback stories are in `tests/request_auth.rs`.

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

use super::*;

const SECRET: &[u8] = b"the velo-serve unit tests' secret";
const OTHER: &[u8] = b"another secret, just as long....";

fn secret(bytes: &[u8]) -> RequestAuth {
    RequestAuth::with_secret(bytes).expect("a valid secret")
}

/// Both sides' outcomes: the frontend's, then the worker's.
type Outcomes = (Result<(), HandshakeError>, Result<(), HandshakeError>);

/// Runs a frontend under `frontend` and a worker under `worker` against each other.
async fn pair(frontend: &RequestAuth, worker: &RequestAuth) -> Outcomes {
    let (mut f, mut w) = duplex(1024);
    tokio::join!(
        frontend_handshake(&mut f, frontend),
        worker_handshake(&mut w, worker)
    )
}

/// `check(frontend, worker, expect)`: the two outcomes, as `Ok` or the error's Display.
async fn check(frontend: &RequestAuth, worker: &RequestAuth, expect: [Result<(), &str>; 2]) {
    let (f, w) = pair(frontend, worker).await;
    let show = |r: Result<(), HandshakeError>| r.map_err(|e| e.to_string());
    let got = [show(f), show(w)];
    for (side, (got, want)) in ["frontend", "worker"].iter().zip(got.iter().zip(expect)) {
        match (got, want) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) if got.contains(want) => {}
            _ => panic!("{side}: got {got:?}, want {want:?}"),
        }
    }
}

#[tokio::test]
async fn peers_with_the_same_secret_or_none_both_succeed() {
    check(&secret(SECRET), &secret(SECRET), [Ok(()), Ok(())]).await;
    check(&RequestAuth::open(), &RequestAuth::open(), [Ok(()), Ok(())]).await;
}

#[tokio::test]
async fn different_secrets_are_refused_by_the_worker_and_reported_by_both() {
    check(
        &secret(OTHER),
        &secret(SECRET),
        [
            Err("the worker refused this frontend's proof: the two hold different cluster secrets"),
            Err("the frontend's proof does not match this worker's cluster secret"),
        ],
    )
    .await;
}

#[tokio::test]
async fn a_secret_on_one_side_only_is_an_error_on_both_naming_the_side_without_it() {
    check(
        &RequestAuth::open(),
        &secret(SECRET),
        [
            Err("the worker requires a cluster secret, but this frontend has none"),
            Err("the frontend has no cluster secret, but this worker requires one"),
        ],
    )
    .await;
    check(
        &secret(SECRET),
        &RequestAuth::open(),
        [
            Err("the worker has no cluster secret, but this frontend requires one"),
            Err("the frontend requires a cluster secret, but this worker has none"),
        ],
    )
    .await;
}

/// A peer that writes a request frame at once (no greeting) is refused at the frame's first
/// byte: the worker reads nothing more of it.
#[tokio::test]
async fn a_frame_without_a_greeting_is_refused_at_its_first_byte() {
    let (mut peer, mut w) = duplex(1024);
    peer.write_all(&[0, 0, 0, 2, b'{', b'}']).await.unwrap();
    let err = worker_handshake(&mut w, &RequestAuth::open())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::NotAGreeting {
                peer: Side::Frontend
            }
        ),
        "{err}"
    );
    drop(peer);
    let mut rest = Vec::new();
    w.read_to_end(&mut rest).await.unwrap();
    assert_eq!(
        rest,
        [0, 0, 2, b'{', b'}'],
        "the worker read past the first byte"
    );
}

/// The worker's own greeting sent back to it is a worker's greeting, not a frontend's.
#[tokio::test]
async fn a_greeting_reflected_back_to_its_sender_is_refused() {
    let (mut peer, mut w) = duplex(1024);
    let auth = secret(SECRET);
    let (r, ()) = tokio::join!(worker_handshake(&mut w, &auth), async {
        let mut theirs = [0; GREETING_LEN];
        peer.read_exact(&mut theirs).await.unwrap();
        peer.write_all(&theirs).await.unwrap();
    });
    let err = r.unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::WrongRole {
                peer: Side::Frontend,
                got: Side::Worker
            }
        ),
        "{err}"
    );
}

/// A frontend's proof recorded on one connection is worthless on the next: the worker's
/// nonce is new.
#[tokio::test]
async fn a_recorded_proof_replayed_on_a_new_connection_is_refused() {
    let auth = secret(SECRET);
    // Record a genuine frontend's greeting and proof.
    let (mut f, mut w) = duplex(1024);
    let (frontend_side, recorded) = tokio::join!(frontend_handshake(&mut f, &auth), async {
        let mut theirs = [0; GREETING_LEN];
        w.read_exact(&mut theirs).await.unwrap();
        w.write_all(&greeting(Side::Worker, &auth)).await.unwrap();
        let mut proof = [0; PROOF_LEN];
        w.read_exact(&mut proof).await.unwrap();
        drop(w);
        (theirs, proof)
    });
    assert!(frontend_side.is_err(), "the recorder gave no proof back");
    // Replay both to a real worker.
    let (mut replayer, mut w) = duplex(1024);
    let (r, ()) = tokio::join!(worker_handshake(&mut w, &auth), async {
        replayer.write_all(&recorded.0).await.unwrap();
        replayer.write_all(&recorded.1).await.unwrap();
    });
    let err = r.unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::BadProof {
                peer: Side::Frontend
            }
        ),
        "{err}"
    );
}

/// A "worker" that claims a secret and accepts any proof but cannot prove one itself is
/// refused by the frontend.
#[tokio::test]
async fn a_worker_that_cannot_prove_the_secret_is_refused_by_the_frontend() {
    let auth = secret(SECRET);
    let (mut f, mut impostor) = duplex(1024);
    let (r, ()) = tokio::join!(frontend_handshake(&mut f, &auth), async {
        let mut their = [0; GREETING_LEN + PROOF_LEN];
        impostor
            .write_all(&greeting(Side::Worker, &secret(OTHER)))
            .await
            .unwrap();
        impostor.read_exact(&mut their).await.unwrap();
        let mut accept = [7; 1 + PROOF_LEN];
        accept[0] = VERDICT_ACCEPTED;
        impostor.write_all(&accept).await.unwrap();
    });
    let err = r.unwrap_err();
    assert!(
        matches!(err, HandshakeError::BadProof { peer: Side::Worker }),
        "{err}"
    );
}

/// A "worker" that answers the frontend's proof with that same proof (it cannot make its
/// own) is refused: each proof covers its prover's role.
#[tokio::test]
async fn a_frontends_proof_reflected_back_to_it_is_refused() {
    let auth = secret(SECRET);
    let (mut f, mut reflector) = duplex(1024);
    let (r, ()) = tokio::join!(frontend_handshake(&mut f, &auth), async {
        reflector
            .write_all(&greeting(Side::Worker, &auth))
            .await
            .unwrap();
        let mut theirs = [0; GREETING_LEN + PROOF_LEN];
        reflector.read_exact(&mut theirs).await.unwrap();
        let mut answer = vec![VERDICT_ACCEPTED];
        answer.extend_from_slice(&theirs[GREETING_LEN..]);
        reflector.write_all(&answer).await.unwrap();
    });
    let err = r.unwrap_err();
    assert!(
        matches!(err, HandshakeError::BadProof { peer: Side::Worker }),
        "{err}"
    );
}

/// A frontend that means worker instance A and reaches worker B (a stale or forged
/// discovery entry, or a relay), both with the secret: both sides refuse, naming both.
#[tokio::test]
async fn a_frontend_meaning_another_instance_is_refused_by_both_sides() {
    let want = "the frontend means worker instance a, but reached instance b";
    check(
        &secret(SECRET).with_instance(0xa),
        &secret(SECRET).with_instance(0xb),
        [Err(want), Err(want)],
    )
    .await;
    // Either side naming none checks nothing.
    check(
        &secret(SECRET),
        &secret(SECRET).with_instance(0xb),
        [Ok(()), Ok(())],
    )
    .await;
    check(
        &secret(SECRET).with_instance(0xa),
        &secret(SECRET),
        [Ok(()), Ok(())],
    )
    .await;
    check(
        &secret(SECRET).with_instance(0xb),
        &secret(SECRET).with_instance(0xb),
        [Ok(()), Ok(())],
    )
    .await;
}

/// The worker checks the instance by itself: a greeting naming another instance is refused
/// before any proof is read, whatever the frontend's side checks.
#[tokio::test]
async fn a_worker_refuses_a_greeting_meant_for_another_instance() {
    let (mut relay, mut w) = duplex(1024);
    let mut g = greeting(Side::Frontend, &secret(SECRET).with_instance(0xa));
    g[GREETING_LEN - 1] ^= 1;
    relay.write_all(&g).await.unwrap();
    let err = worker_handshake(&mut w, &secret(SECRET).with_instance(0xb))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            HandshakeError::WrongInstance {
                peer: Side::Frontend,
                meant: 0xa,
                actual: 0xb
            }
        ),
        "{err}"
    );
}

/// "TLS required" (mode 2) comes in plaintext, unauthenticated: a worker reports it as the
/// peer's claim, and takes it only from a frontend's greeting.
#[tokio::test]
async fn tls_required_is_a_frontends_claim_only() {
    let (mut peer, mut w) = duplex(1024);
    peer.write_all(&tls_required_greeting()).await.unwrap();
    let err = worker_handshake(&mut w, &RequestAuth::open())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the peer says it is a frontend requiring TLS on the request plane; this worker has \
         none (a frontend serves TLS when DYN_TCP_TLS_CERT_PATH is set, a worker speaks it when \
         DYN_TCP_TLS_CA_CERT_PATH or DYN_TCP_TLS_INSECURE is set)"
    );
    let (mut peer, mut f) = duplex(1024);
    peer.write_all(&greeting_with(Side::Worker, MODE_TLS_REQUIRED))
        .await
        .unwrap();
    let err = frontend_handshake(&mut f, &RequestAuth::open())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the worker sent 2 as its mode, which is not a valid value"
    );
}

/// Bytes the protocol does not define are refused, naming the field.
#[tokio::test]
async fn an_undefined_mode_is_refused() {
    let (mut peer, mut w) = duplex(1024);
    let mut g = greeting(Side::Frontend, &RequestAuth::open());
    g[MAGIC.len() + 1] = 9;
    peer.write_all(&g).await.unwrap();
    let err = worker_handshake(&mut w, &RequestAuth::open())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the frontend sent 9 as its mode, which is not a valid value"
    );
}

/// A peer that connects and says nothing ends the handshake at its bound, on both sides
/// (virtual time: the pipe is in memory).
#[tokio::test(start_paused = true)]
async fn a_silent_peer_ends_the_handshake_at_its_timeout() {
    for side in [Side::Frontend, Side::Worker] {
        let (mut us, _silent): (DuplexStream, DuplexStream) = duplex(1024);
        let start = tokio::time::Instant::now();
        let auth = secret(SECRET);
        let r = match side {
            Side::Frontend => frontend_handshake(&mut us, &auth).await,
            Side::Worker => worker_handshake(&mut us, &auth).await,
        };
        assert!(
            matches!(r, Err(HandshakeError::Timeout { bound, .. }) if bound == HANDSHAKE_TIMEOUT),
            "{side}: {r:?}"
        );
        assert_eq!(start.elapsed(), HANDSHAKE_TIMEOUT, "{side}");
    }
}

#[test]
fn a_secret_of_the_wrong_length_is_refused_and_never_printed() {
    let err = RequestAuth::with_secret(b"  short \n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "the cluster secret is 5 bytes: it must be 16..=4096"
    );
    let auth = secret(SECRET);
    assert_eq!(
        format!("{auth:?}"),
        "RequestAuth { secret: set, tls: none }"
    );
    assert_eq!(
        format!("{:?}", RequestAuth::open()),
        "RequestAuth { secret: none, tls: none }"
    );
}
