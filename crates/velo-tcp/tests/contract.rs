//! The transport contract (`velo_session::contract`) over TCP on loopback sockets.

mod common;

use common::Tcp;

velo_session::transport_contract!(tcp => Tcp);
