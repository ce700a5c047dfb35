//! Context creation and socket addresses.

use std::ffi::CString;
use std::mem::zeroed;
use std::net::SocketAddr;
use std::ptr::{null, null_mut};

use ucx1_sys as u;

use super::*;

pub(super) fn create_context(s: Settings<'_>) -> Result<u::ucp_context_h, InitError> {
    let mut config: *mut u::ucp_config_t = null_mut();
    // SAFETY: NULL prefix and file read the UCX_* environment; `config` receives the config.
    let status = Status::of(unsafe { u::ucp_config_read(null(), null(), &mut config) });
    if !status.is_ok() {
        return Err(init_error("ucp_config_read", status));
    }
    let result = (|| {
        for (name, value) in [("TLS", s.tls), ("NET_DEVICES", s.net_devices)] {
            let Some(value) = value else { continue };
            let (Ok(n), Ok(v)) = (CString::new(name), CString::new(value)) else {
                return Err(InitError {
                    step: "ucp_config_modify",
                    status: format!("UCX_{name}={value:?} contains a NUL byte"),
                });
            };
            // SAFETY: `config` is live; both strings are NUL-terminated and outlive the call.
            let status =
                Status::of(unsafe { u::ucp_config_modify(config, n.as_ptr(), v.as_ptr()) });
            if !status.is_ok() {
                return Err(InitError {
                    step: "ucp_config_modify",
                    status: format!("UCX_{name}={value}: {status}"),
                });
            }
        }
        let mut ctx: u::ucp_context_h = null_mut();
        // SAFETY: params is a zeroed C struct with FEATURES and NAME set (the name is a static
        // C string); `config` is live; `ctx` receives the context. ucp_init is a static inline
        // in ucp.h, so the versioned entry point is called directly.
        let status = unsafe {
            let mut p: u::ucp_params_t = zeroed();
            p.field_mask = (u::ucp_params_field::UCP_PARAM_FIELD_FEATURES
                | u::ucp_params_field::UCP_PARAM_FIELD_NAME)
                .0
                .into();
            p.features = (u::ucp_feature::UCP_FEATURE_AM | u::ucp_feature::UCP_FEATURE_WAKEUP)
                .0
                .into();
            p.name = c"velo-ucx".as_ptr();
            Status::of(u::ucp_init_version(
                u::UCP_API_MAJOR,
                u::UCP_API_MINOR,
                &p,
                config,
                &mut ctx,
            ))
        };
        if status.is_ok() {
            Ok(ctx)
        } else {
            Err(init_error("ucp_init", status))
        }
    })();
    // SAFETY: `config` is live and released exactly once.
    unsafe { u::ucp_config_release(config) };
    result
}

pub(super) fn init_error(step: &'static str, status: Status) -> InitError {
    InitError {
        step,
        status: status.to_string(),
    }
}

// The address family constants (2 and 10) fit `sa_family_t` (u16).
#[allow(clippy::cast_possible_truncation)]
const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
#[allow(clippy::cast_possible_truncation)]
const AF_INET6: libc::sa_family_t = libc::AF_INET6 as libc::sa_family_t;

/// `addr` as a C socket address and its length.
pub(super) fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, u::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid (unspecified) value.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = AF_INET;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe { &mut *(&raw mut storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = AF_INET6;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    #[allow(clippy::cast_possible_truncation)] // at most 28 bytes
    (storage, len as u::socklen_t)
}

/// A C socket address as a `SocketAddr` (IPv4 and IPv6 only).
pub(super) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in, which fits the storage.
            let sin = unsafe { &*(&raw const *ss).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::from((
                sin.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6, which fits the storage.
            let sin6 = unsafe { &*(&raw const *ss).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::from((
                sin6.sin6_addr.s6_addr,
                u16::from_be(sin6.sin6_port),
            )))
        }
        _ => None,
    }
}
