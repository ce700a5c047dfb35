//! The hostile-peer suite, small: every attack gets the answer it must get, and the
//! legitimate worker streaming alongside loses no request. (Its ITL against a quiet run is a
//! timing figure: `cargo xtask hostile` reports it; a test on a loaded machine does not
//! assert it.)

use velo_bench::hostile::{Attack, Scale, Target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_is_refused_or_closed_and_the_legitimate_worker_loses_nothing() {
    let target = Target::start(Scale::smoke()).await;
    let report = target.run(&Attack::ALL).await;
    target.shutdown().await;
    println!("{}", report.table());
    let expect = |attack: Attack, words: &[&str]| {
        let row = report
            .rows
            .iter()
            .find(|r| r.attack == attack.name())
            .expect("a row per attack");
        for w in words {
            assert!(
                row.outcome.contains(w),
                "{}: {:?} lacks {w:?}",
                row.attack,
                row.outcome
            );
        }
        assert_eq!(
            row.legit.failed, 0,
            "{}: legitimate requests failed",
            row.attack
        );
        assert!(
            row.legit.ok > 0,
            "{}: no legitimate request completed",
            row.attack
        );
    };
    expect(Attack::RandomBytes, &["closed ("]);
    expect(Attack::NoSecret, &["closed (unauthenticated)"]);
    expect(Attack::WrongSecret, &["closed (unauthenticated)"]);
    expect(Attack::PlaintextToTls, &["closed (bad_handshake)"]);
    expect(Attack::TlsToPlaintext, &["frontend answered in plaintext"]);
    expect(Attack::Silent, &["closed (limit)"]);
    expect(Attack::Slowloris, &["closed (bad_handshake)"]);
    expect(Attack::WrongWorker, &["refused (CANCEL refused) x16 of 16"]);
    expect(Attack::OpenFlood, &["closed (churn_limit)"]);
    expect(Attack::TinyIdle, &["closed (bad_handshake)"]);
    expect(Attack::BigPrologue, &["CANCEL protocol_error"]);
    expect(Attack::BigFrame, &["closed (frame_too_large)"]);
    assert_eq!(report.quiet.legit.failed, 0);
}
