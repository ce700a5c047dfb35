//! Building TLS configurations from files: every half-broken input is an error naming the
//! file, and a reload serves the new certificate to new connections only.

use std::sync::Arc;
use std::time::Duration;

use rustls::{ClientConnection, ServerConnection};
use rustls_pki_types::ServerName;
use velo_tls::testing::TestPki;
use velo_tls::{ClientIdentity, ClientTls, ServerTls, TlsError, Trust};

const T: Duration = Duration::from_secs(3);

fn server(pki: &TestPki, client_ca: Option<&str>) -> Result<ServerTls, TlsError> {
    ServerTls::new(
        pki.path("server.pem"),
        pki.path("server.key"),
        client_ca.map(|n| pki.path(n)),
        T,
    )
}

fn client(pki: &TestPki, ca: &str, identity: Option<&str>) -> ClientTls {
    let identity = identity.map(|n| ClientIdentity {
        cert: pki.path(&format!("{n}.pem")),
        key: pki.path(&format!("{n}.key")),
    });
    ClientTls::new(Trust::Ca(pki.path(ca)), None, identity, T).unwrap()
}

/// Runs a whole TLS handshake in memory; returns the server certificate the client saw.
fn handshake(server: &ServerTls, client: &ClientTls) -> Result<Vec<u8>, rustls::Error> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(client.connector().config().clone(), name)?;
    let mut s = ServerConnection::new(server.acceptor().config().clone())?;
    for _ in 0..16 {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
        }
        s.process_new_packets()?;
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
        }
        c.process_new_packets()?;
        if !c.is_handshaking() && !s.is_handshaking() {
            let certs = c.peer_certificates().unwrap();
            return Ok(certs[0].to_vec());
        }
    }
    panic!("handshake did not finish in 16 rounds");
}

#[test]
fn a_missing_key_file_is_an_error_naming_it() {
    let pki = TestPki::new();
    std::fs::remove_file(pki.path("server.key")).unwrap();
    let err = server(&pki, None).unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(err.to_string().contains("server.key"), "{err}");
}

#[test]
fn an_empty_certificate_file_is_an_error_not_an_empty_chain() {
    let pki = TestPki::new();
    std::fs::write(pki.path("server.pem"), "").unwrap();
    let err = server(&pki, None).unwrap_err();
    assert!(matches!(err, TlsError::Pem { .. }), "{err}");
    assert!(err.to_string().contains("server.pem"), "{err}");
}

#[test]
fn a_key_that_does_not_match_its_certificate_is_refused() {
    let pki = TestPki::new();
    std::fs::copy(pki.path("client.key"), pki.path("server.key")).unwrap();
    let err = server(&pki, None).unwrap_err();
    assert!(matches!(err, TlsError::Rustls { .. }), "{err}");
}

#[test]
fn a_server_name_that_is_no_name_is_refused() {
    let pki = TestPki::new();
    let err = ClientTls::new(
        Trust::Ca(pki.path("ca.pem")),
        Some("not a name!".into()),
        None,
        T,
    )
    .unwrap_err();
    assert!(matches!(err, TlsError::ServerName(_)), "{err}");
}

#[test]
fn a_client_trusting_the_ca_completes_a_handshake_and_a_foreign_ca_does_not() {
    let pki = TestPki::new();
    pki.foreign("rogue");
    let s = server(&pki, None).unwrap();
    handshake(&s, &client(&pki, "ca.pem", None)).unwrap();
    let err = handshake(&s, &client(&pki, "rogue-ca.pem", None)).unwrap_err();
    assert!(matches!(err, rustls::Error::InvalidCertificate(_)), "{err}");
}

#[test]
fn mutual_tls_refuses_clients_without_a_certificate_from_the_client_ca() {
    let pki = TestPki::new();
    pki.foreign("rogue");
    let s = server(&pki, Some("ca.pem")).unwrap();
    assert!(s.requires_client_cert());
    handshake(&s, &client(&pki, "ca.pem", Some("client"))).unwrap();
    assert!(handshake(&s, &client(&pki, "ca.pem", None)).is_err());
    assert!(handshake(&s, &client(&pki, "ca.pem", Some("rogue-client"))).is_err());
}

#[test]
fn a_reload_serves_the_new_certificate_and_a_failed_one_keeps_the_old() {
    let pki = TestPki::new();
    let s = server(&pki, None).unwrap();
    let c = client(&pki, "ca.pem", None);
    let before = handshake(&s, &c).unwrap();
    let rotated = pki.issue_server("server");
    assert_eq!(handshake(&s, &c).unwrap(), before, "no reload, no change");
    s.reload().unwrap();
    let after = handshake(&s, &c).unwrap();
    assert_eq!(after, rotated);
    assert_ne!(after, before);

    std::fs::write(pki.path("server.key"), "garbage").unwrap();
    assert!(s.reload().is_err());
    assert_eq!(
        handshake(&s, &c).unwrap(),
        rotated,
        "a failed reload keeps serving"
    );
    let _: Arc<_> = s.acceptor().config().clone();
}

#[test]
fn an_insecure_client_accepts_a_certificate_no_ca_vouches_for() {
    let pki = TestPki::new();
    pki.foreign("rogue");
    let s = ServerTls::new(
        pki.path("rogue-server.pem"),
        pki.path("rogue-server.key"),
        None,
        T,
    )
    .unwrap();
    let insecure = ClientTls::new(Trust::Insecure, None, None, T).unwrap();
    handshake(&s, &insecure).unwrap();
}
