//! Stories of packed (LZ4) batches: negotiated in the HELLO, used only where the peer
//! accepts them, and invisible to the streams.

mod common;

use velo_mux::testing::Pair;
use velo_mux::{Compression, LaneId, MuxConfig, Side, StreamEnd};
use velo_wire::InstanceId;

use common::*;

/// An engine item as MessagePack with field names spells it: the same keys every token.
fn item(stream: usize, index: usize) -> Vec<u8> {
    let mut b = b"\x85\xa9token_ids\x91\xce".to_vec();
    b.extend_from_slice(
        &u32::try_from(stream * 7919 + index)
            .unwrap_or(0)
            .to_be_bytes(),
    );
    b.extend_from_slice(b"\xa4text\xa8 streams\xadcum_log_probs\xcb");
    b.extend_from_slice(&(-0.25 * index as f64).to_be_bytes());
    b.extend_from_slice(b"\xadfinish_reason\xc0\xa5index\xcc");
    b.push(u8::try_from(index).unwrap_or(0));
    b
}

/// Runs 64 streams of `n` items each, the frontend reading as they arrive; checks every item
/// arrived in order and each stream ended once. Returns the worker's bytes sent and batches
/// packed.
fn run(pair: &mut Pair, n: usize) -> (u64, u64) {
    let streams: Vec<_> = (0..64).map(|_| pair.open_stream(PROLOGUE)).collect();
    let mut got = vec![Vec::new(); streams.len()];
    let read = |pair: &mut Pair, got: &mut Vec<Vec<_>>| {
        for (k, (_, ticket)) in streams.iter().enumerate() {
            let f = pair.frontend_key(*ticket);
            got[k].extend(pair.frontend_read(f));
        }
    };
    for i in 0..n {
        for (k, (s, _)) in streams.iter().enumerate() {
            pair.worker_send(*s, &item(k, i));
        }
        pair.drive();
        read(pair, &mut got);
        pair.drive();
    }
    for (s, _) in &streams {
        pair.worker_finish(*s, b"");
    }
    pair.drive();
    read(pair, &mut got);
    for (k, got) in got.iter().enumerate() {
        let want: Vec<Vec<u8>> = (0..n).map(|i| item(k, i)).collect();
        assert_eq!(items(got), want.iter().map(|v| &v[..]).collect::<Vec<_>>());
        assert_eq!(ends(got), vec![&StreamEnd::Finished]);
    }
    assert!(pair.lane_errors.is_empty(), "{:?}", pair.lane_errors);
    let stats = pair.worker.stats();
    (stats.bytes_sent, stats.batches_packed)
}

fn packing_worker() -> (MuxConfig, MuxConfig) {
    configs(|w| w.compression(Compression::Lz4))
}

#[test]
fn a_worker_that_packs_sends_a_third_of_the_bytes_and_every_item_arrives() {
    let (plain_bytes, plain_packed) = run(&mut Pair::new(configs(|w| w)), 20);
    let mut pair = Pair::new(packing_worker());
    let (packed_bytes, packed) = run(&mut pair, 20);
    assert_eq!(plain_packed, 0);
    assert!(packed > 0, "no batch was packed");
    assert!(
        packed_bytes * 3 < plain_bytes,
        "packed {packed_bytes} bytes against {plain_bytes} plain"
    );
    let stats = pair.worker.stats();
    assert!(stats.packed_bytes_saved > 0);
    assert!(stats.batches_packed <= stats.batches_sent);
}

#[test]
fn a_peer_that_does_not_announce_packing_gets_plain_batches() {
    let mut pair = Pair::new(packing_worker());
    // The frontend's lanes come up again, its HELLOs without the capability (an older peer).
    let (wid, fid) = (InstanceId::from_u128(1), InstanceId::from_u128(2));
    for lane in 0..pair.worker.config().lanes() {
        let mut hello = pair.frontend.config().hello(lane, fid, wid);
        hello.capabilities &= !velo_wire::CAP_PACKED;
        pair.worker.handle_lane_up(pair.now, LaneId(lane), &hello);
    }
    pair.worker_events.clear();
    pair.lane_errors.clear();
    let (_, packed) = run(&mut pair, 20);
    assert_eq!(packed, 0);
}

#[test]
fn credit_does_not_shrink_so_a_packing_frontend_sends_it_plain_and_it_arrives() {
    // On one lane, the grants of 64 streams that read half a window at once share batches of
    // ~250 bytes, over `MIN_PACK_LEN`; but each CREDIT differs from the last in its slot byte,
    // under LZ4's 4-byte shortest match, so none shrinks: they go out as plain batches (why
    // the response plane packs on workers only).
    let one_lane = |side| {
        MuxConfig::builder(side)
            .lanes(1)
            .compression(Compression::Lz4)
            .build()
            .expect("valid")
    };
    let mut pair = Pair::new((one_lane(Side::Worker), one_lane(Side::Frontend)));
    // More items than a window: the worker sends the rest only if the grants arrive (`run`
    // checks every item did).
    run(&mut pair, 80);
    let stats = pair.frontend.stats();
    assert!(stats.grants_sent > 0);
    assert!(
        stats.bytes_sent / stats.batches_sent > velo_wire::MIN_PACK_LEN as u64,
        "batches long enough to try: {stats:?}"
    );
    assert_eq!(stats.batches_packed, 0, "{stats:?}");
}
