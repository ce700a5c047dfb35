//! A throwaway PKI for tests and benchmarks: a CA, a server certificate for `localhost`,
//! `127.0.0.1` and `::1`, and a client certificate, generated with rcgen and written to a
//! fresh temporary directory (removed on drop). No private key is ever committed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

/// A CA with a server and a client certificate, as PEM files in a temporary directory.
pub struct TestPki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
}

impl TestPki {
    /// Generates a CA and writes `ca.pem`, `server.pem`/`server.key` and
    /// `client.pem`/`client.key`.
    ///
    /// # Panics
    ///
    /// If generating or writing fails (a test cannot go on then).
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "velo-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let (ca, ca_key) = ca("velo test CA");
        let pki = Self { dir, ca, ca_key };
        write(&pki.path("ca.pem"), &pki.ca.pem());
        pki.issue_server("server");
        pki.issue_client("client");
        pki
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `dir/name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Dynamo's `DYN_TCP_TLS_*` variables for mutual TLS with these files: the frontend's
    /// certificate and key, the CA its workers verify it with, the workers' client
    /// certificate and key, and the CA the frontend verifies them with.
    pub fn mutual_tls_env(&self) -> Vec<(&'static str, String)> {
        let p = |name: &str| self.path(name).display().to_string();
        vec![
            ("DYN_TCP_TLS_CERT_PATH", p("server.pem")),
            ("DYN_TCP_TLS_KEY_PATH", p("server.key")),
            ("DYN_TCP_TLS_CA_CERT_PATH", p("ca.pem")),
            ("DYN_TCP_TLS_CLIENT_CERT_PATH", p("client.pem")),
            ("DYN_TCP_TLS_CLIENT_KEY_PATH", p("client.key")),
            ("DYN_TCP_TLS_CLIENT_CA_CERT_PATH", p("ca.pem")),
        ]
    }

    /// Issues a new server certificate and key to `name.pem` / `name.key` (overwriting: a
    /// rotation). Returns the certificate in DER form.
    pub fn issue_server(&self, name: &str) -> Vec<u8> {
        self.issue(name, server_params())
    }

    /// Issues a client certificate to `name.pem` / `name.key`.
    pub fn issue_client(&self, name: &str) -> Vec<u8> {
        self.issue(name, client_params())
    }

    /// Writes a second, unrelated CA with its own server and client certificates under
    /// `prefix-*`: a peer another PKI vouches for.
    pub fn foreign(&self, prefix: &str) {
        let (other, other_key) = ca("foreign CA");
        write(&self.path(&format!("{prefix}-ca.pem")), &other.pem());
        let server = server_params();
        issue(
            &self.dir,
            &format!("{prefix}-server"),
            server,
            &other,
            &other_key,
        );
        let client = client_params();
        issue(
            &self.dir,
            &format!("{prefix}-client"),
            client,
            &other,
            &other_key,
        );
    }

    fn issue(&self, name: &str, params: CertificateParams) -> Vec<u8> {
        issue(&self.dir, name, params, &self.ca, &self.ca_key)
    }
}

fn server_params() -> CertificateParams {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("valid names");
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()));
    params
}

fn client_params() -> CertificateParams {
    CertificateParams::new(vec!["velo-worker".to_owned()]).expect("valid name")
}

fn issue(
    dir: &Path,
    name: &str,
    params: CertificateParams,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
) -> Vec<u8> {
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, ca, ca_key).expect("signed");
    write(&dir.join(format!("{name}.pem")), &cert.pem());
    write(&dir.join(format!("{name}.key")), &key.serialize_pem());
    cert.der().to_vec()
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        // Best effort: a leftover temporary directory harms nothing.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::new()).expect("no names");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("self-signed");
    (cert, key)
}

fn write(path: &Path, pem: &str) {
    std::fs::write(path, pem).expect("write PEM");
}
