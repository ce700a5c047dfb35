//! Helpers shared by the mux story tests.
#![allow(dead_code, unreachable_pub)]

use bytes::BytesMut;
use velo_mux::testing::{Pair, default_configs};
use velo_mux::{LaneError, LaneId, MuxConfig, Recv, Side, StreamEnd};
use velo_wire::{Batch, Frame, Record};

pub const PROLOGUE: &[u8] = br#"{"error":null}"#;

pub fn configs(
    worker: impl FnOnce(velo_mux::MuxConfigBuilder) -> velo_mux::MuxConfigBuilder,
) -> (MuxConfig, MuxConfig) {
    let w = worker(MuxConfig::builder(Side::Worker)).build().unwrap();
    let (_, f) = default_configs();
    (w, f)
}

pub fn items(recv: &[Recv]) -> Vec<&[u8]> {
    recv.iter()
        .filter_map(|r| match r {
            Recv::Item(b) => Some(&b[..]),
            Recv::End(_) => None,
        })
        .collect()
}

pub fn ends(recv: &[Recv]) -> Vec<&StreamEnd> {
    recv.iter()
        .filter_map(|r| match r {
            Recv::End(e) => Some(e),
            Recv::Item(_) => None,
        })
        .collect()
}

/// Feeds hand-made records to the frontend on `lane`, as if the worker had sent them.
pub fn inject(pair: &mut Pair, lane: LaneId, records: &[Record]) -> Result<(), LaneError> {
    let mut buf = BytesMut::new();
    Frame::Batch(Batch::from_records(records)).encode(&mut buf);
    let r = pair.frontend.handle_input(pair.now, lane, &mut buf);
    pair.step_now();
    r
}
