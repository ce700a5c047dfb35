//! The frontend's UCX listener, as velo-session's accept loop takes lanes from it: the lanes
//! the driver connected from the listener's connection requests.

use std::io;
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use velo_session::{LaneListener, RawLane};

use crate::lane::Lane;

pub(crate) struct UcxLaneListener(pub(crate) mpsc::Receiver<Lane>);

impl LaneListener for UcxLaneListener {
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Box<dyn RawLane>>>> {
        // `None` once the driver stopped listening.
        self.0
            .poll_recv(cx)
            .map(|lane| lane.map(|l| Ok(Box::new(l) as Box<dyn RawLane>)))
    }
}
