//! Reading PEM files: certificate chains, private keys, CA bundles. An empty file, or one
//! without the section expected, is an error naming the file, never an empty configuration.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// Every certificate in `path`, in order (leaf first for a chain).
pub(crate) fn certs(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, what, &e))?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: "no CERTIFICATE section".to_owned(),
        });
    }
    Ok(certs)
}

/// The private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn key(path: &Path, what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path, what)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| pem_error(path, what, &e))
}

/// A trust store holding every certificate of `path`.
pub(crate) fn roots(path: &Path, what: &'static str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(path, what)? {
        store
            .add(cert)
            .map_err(|source| TlsError::Rustls { what, source })?;
    }
    Ok(Arc::new(store))
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_owned(),
        source: Arc::new(e),
    })
}

fn pem_error(path: &Path, what: &'static str, e: &pem::Error) -> TlsError {
    let reason = match e {
        pem::Error::NoItemsFound => "no section of that kind".to_owned(),
        other => other.to_string(),
    };
    TlsError::Pem {
        what,
        path: path.to_owned(),
        reason,
    }
}
