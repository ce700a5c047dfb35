//! The fault proxy over real loopback sockets. Every test waits on socket events, never on
//! time: a fault set before bytes are written is applied before they are read (the relay's
//! select is biased towards fault changes).

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use velo_faults::proxy::{Direction, Fault, FaultProxy, Faults, ProxyConfig, ProxyError};

/// An upstream listener, a proxy in front of it, and one client connected through both.
struct Path {
    proxy: FaultProxy,
    client: TcpStream,
    upstream: TcpStream,
}

async fn path(config: ProxyConfig, faults: Faults) -> Path {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = FaultProxy::bind(listener.local_addr().unwrap(), config)
        .await
        .unwrap();
    proxy.set_both(faults);
    let client = TcpStream::connect(proxy.local_addr()).await.unwrap();
    let (upstream, _) = listener.accept().await.unwrap();
    Path {
        proxy,
        client,
        upstream,
    }
}

async fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    got
}

/// Sends `bytes` one way and checks they arrive (the relay is running).
async fn exchange(from: &mut TcpStream, to: &mut TcpStream, bytes: &[u8]) {
    from.write_all(bytes).await.unwrap();
    let mut got = vec![0; bytes.len()];
    to.read_exact(&mut got).await.unwrap();
    assert_eq!(got, bytes);
}

#[tokio::test]
async fn pass_forwards_both_ways_and_passes_the_end_of_stream_on() {
    let mut p = path(ProxyConfig::default(), Faults::PASS).await;
    exchange(&mut p.client, &mut p.upstream, b"hello").await;
    exchange(&mut p.upstream, &mut p.client, b"world").await;
    p.client.shutdown().await.unwrap();
    assert!(read_all(&mut p.upstream).await.is_empty());
    assert_eq!(p.proxy.stats().accepted, 1);
    assert!(p.proxy.shutdown().await);
}

#[tokio::test]
async fn a_cut_forwards_exactly_n_bytes_then_closes_both_sides() {
    let cut = Faults {
        to_upstream: Fault::CutAfter(5),
        to_client: Fault::Pass,
    };
    let mut p = path(ProxyConfig::default(), cut).await;
    p.client.write_all(b"0123456789").await.unwrap();
    assert_eq!(read_all(&mut p.upstream).await, b"01234");
    let mut rest = Vec::new();
    // The client sees the connection end (a FIN, or a RST if its bytes were still unread).
    let _ = p.client.read_to_end(&mut rest).await;
    assert!(rest.is_empty());
    assert_eq!(p.proxy.stats().cuts, 1);
}

#[tokio::test]
async fn a_reset_sends_a_rst_to_the_receiver_and_a_fin_to_the_sender() {
    let mut p = path(ProxyConfig::default(), Faults::PASS).await;
    exchange(&mut p.client, &mut p.upstream, b"up").await;
    p.proxy.set(Direction::ToClient, Fault::Reset);
    let mut buf = [0u8; 8];
    let err = p.client.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert!(read_all(&mut p.upstream).await.is_empty());
    assert_eq!(p.proxy.stats().resets, 1);
}

#[tokio::test]
async fn a_stall_forwards_nothing() {
    let mut p = path(ProxyConfig::default(), Faults::PASS).await;
    exchange(&mut p.client, &mut p.upstream, b"before").await;
    p.proxy.set(Direction::ToUpstream, Fault::Stall);
    p.client.write_all(b"held").await.unwrap();
    // Closing the connection now shows what the stall let through: nothing.
    p.proxy.set(Direction::ToUpstream, Fault::CutAfter(0));
    assert!(read_all(&mut p.upstream).await.is_empty());
}

#[tokio::test]
async fn bytes_held_by_a_stall_or_a_delay_arrive_in_order_afterwards() {
    let mut p = path(ProxyConfig::default(), Faults::PASS).await;
    p.proxy.set(Direction::ToUpstream, Fault::Stall);
    p.client.write_all(b"first ").await.unwrap();
    p.proxy.set(
        Direction::ToUpstream,
        Fault::Delay(Duration::from_millis(1)),
    );
    p.client.write_all(b"second").await.unwrap();
    p.client.shutdown().await.unwrap();
    assert_eq!(read_all(&mut p.upstream).await, b"first second");
}

#[tokio::test]
async fn new_connections_are_reset_while_a_reset_holds_or_past_the_limit() {
    let reset = Faults {
        to_upstream: Fault::Reset,
        to_client: Fault::Pass,
    };
    let config = ProxyConfig {
        max_connections: 1,
        ..ProxyConfig::default()
    };
    let mut p = path(config, Faults::PASS).await;
    exchange(&mut p.client, &mut p.upstream, b"one").await;
    let mut second = TcpStream::connect(p.proxy.local_addr()).await.unwrap();
    assert_connection_refused(&mut second).await;
    p.proxy.set_both(reset);
    assert_connection_refused(&mut p.client).await;
    assert_eq!(p.proxy.stats().refused, 1);
}

async fn assert_connection_refused(s: &mut TcpStream) {
    let mut buf = [0u8; 8];
    match s.read(&mut buf).await {
        Ok(0) => {}
        Ok(n) => panic!("read {n} bytes from a refused connection"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::ConnectionReset),
    }
}

#[tokio::test]
async fn the_proxy_forwards_only_to_loopback() {
    let off_host: SocketAddr = "192.0.2.1:9".parse().unwrap();
    let err = FaultProxy::bind(off_host, ProxyConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ProxyError::NotLoopback(_)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = FaultProxy::bind(listener.local_addr().unwrap(), ProxyConfig::default())
        .await
        .unwrap();
    assert!(proxy.set_upstream(off_host).is_err());
}
