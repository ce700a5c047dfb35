//! The transport contract (`velo_session::contract`) over TCP on loopback sockets.

mod common;

use common::{Tcp, TcpTls};

velo_session::transport_contract!(tcp => Tcp);
velo_session::transport_contract!(tcp_tls => TcpTls);
