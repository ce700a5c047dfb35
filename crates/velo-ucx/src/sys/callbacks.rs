//! The functions UCX calls back: they only queue events in the worker's `Shared`.

use std::ffi::c_void;

use ucx1_sys as u;

use super::*;

/// # Safety
///
/// Called by UCX inside a call on the worker whose `shared` is `arg`.
unsafe fn shared<'a>(arg: *const c_void) -> &'a Shared {
    // SAFETY: per the contract, `arg` is the live Shared box of the calling worker.
    unsafe { &*arg.cast::<Shared>() }
}

/// The AM handler: queues the message (eager bytes are copied now, a rendezvous descriptor is
/// kept for the driver by returning `UCS_INPROGRESS`).
pub(super) unsafe extern "C" fn on_am(
    arg: *mut c_void,
    header: *const c_void,
    header_length: u::size_t,
    data: *mut c_void,
    length: u::size_t,
    param: *const u::ucp_am_recv_param_t,
) -> u::ucs_status_t {
    // SAFETY: `arg` is our Shared (registered with the handler); UCX passes a valid param.
    let (shared, param) = unsafe { (shared(arg), &*param) };
    let rndv = param.recv_attr & u::ucp_am_recv_attr_t::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0;
    let has_ep =
        param.recv_attr & u::ucp_am_recv_attr_t::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0;
    let ep = has_ep
        .then(|| {
            shared
                .eps
                .borrow()
                .by_raw
                .get(&(param.reply_ep as usize))
                .copied()
        })
        .flatten();
    let Some(ep) = ep else {
        // Not one of our endpoints (closed meanwhile, or a foreign sender): drop the message
        // (for a rendezvous message, UCS_OK without receiving drops it too).
        return u::ucs_status_t::UCS_OK;
    };
    let mut h = Header {
        len: 0,
        bytes: [0; MAX_HEADER],
    };
    let hlen = usize::try_from(header_length).unwrap_or(usize::MAX);
    if hlen <= MAX_HEADER && hlen > 0 {
        // SAFETY: UCX passes `header_length` readable bytes at `header`.
        let src = unsafe { std::slice::from_raw_parts(header.cast::<u8>(), hlen) };
        h.bytes[..hlen].copy_from_slice(src);
        #[allow(clippy::cast_possible_truncation)] // at most MAX_HEADER
        {
            h.len = hlen as u8;
        }
    }
    let len = usize::try_from(length).unwrap_or(usize::MAX);
    let body = if rndv {
        RawBody::Rndv { desc: data, len }
    } else {
        if len > 0 {
            // SAFETY: an eager message's `length` bytes are readable at `data` during the
            // callback; they are copied before it returns.
            let src = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
            shared.arena.borrow_mut().extend_from_slice(src);
        }
        RawBody::Eager(len)
    };
    shared.events.borrow_mut().push(RawEvent::Message {
        ep,
        header: h,
        body,
    });
    if rndv {
        u::ucs_status_t::UCS_INPROGRESS
    } else {
        u::ucs_status_t::UCS_OK
    }
}

/// The listener's connection handler: keeps the request for the driver.
pub(super) unsafe extern "C" fn on_conn(req: u::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: `arg` is our Shared (registered with the listener).
    let shared = unsafe { shared(arg) };
    shared.conn_requests.borrow_mut().push(req);
}

/// An endpoint's error handler: queues the failure for the driver.
pub(super) unsafe extern "C" fn on_ep_error(
    arg: *mut c_void,
    ep: u::ucp_ep_h,
    status: u::ucs_status_t,
) {
    // SAFETY: `arg` is our Shared (registered with the endpoint).
    let shared = unsafe { shared(arg) };
    let id = shared.eps.borrow().by_raw.get(&(ep as usize)).copied();
    if let Some(ep) = id {
        shared.events.borrow_mut().push(RawEvent::EpError {
            ep,
            status: Status::of(status),
        });
    }
}

pub(super) unsafe extern "C" fn send_cb(
    req: *mut c_void,
    status: u::ucs_status_t,
    user: *mut c_void,
) {
    // SAFETY: `user` is the SendOp boxed by Worker::send, freed only here (the request was
    // pending); its `shared` is alive while the worker is.
    let op = unsafe { Box::from_raw(user.cast::<SendOp>()) };
    let shared = unsafe { shared(op.shared.cast()) };
    shared
        .in_flight
        .set(shared.in_flight.get().saturating_sub(1));
    shared.events.borrow_mut().push(RawEvent::SendDone {
        token: op.token,
        status: Status::of(status),
    });
    // SAFETY: the request completed; freeing it in its callback is allowed.
    unsafe { u::ucp_request_free(req) };
}

pub(super) unsafe extern "C" fn recv_cb(
    req: *mut c_void,
    status: u::ucs_status_t,
    length: u::size_t,
    user: *mut c_void,
) {
    // SAFETY: `user` is the RecvOp boxed by RndvDesc::receive, freed only here.
    let mut op = unsafe { Box::from_raw(user.cast::<RecvOp>()) };
    let shared = unsafe { shared(op.shared.cast()) };
    let status = Status::of(status);
    let got = if status.is_ok() {
        usize::try_from(length).unwrap_or(0).min(op.buf.capacity())
    } else {
        0
    };
    // SAFETY: on success UCX wrote `length` bytes (capped at the capacity) into the buffer.
    unsafe { op.buf.set_len(got) };
    shared
        .in_flight
        .set(shared.in_flight.get().saturating_sub(1));
    shared.events.borrow_mut().push(RawEvent::RecvDone {
        token: op.token,
        status,
        data: std::mem::take(&mut op.buf),
    });
    // SAFETY: the request completed; freeing it in its callback is allowed.
    unsafe { u::ucp_request_free(req) };
}

pub(super) unsafe extern "C" fn done_cb(
    req: *mut c_void,
    _status: u::ucs_status_t,
    user: *mut c_void,
) {
    // SAFETY: `user` is the DoneOp boxed by flush or close, freed only here.
    let op = unsafe { Box::from_raw(user.cast::<DoneOp>()) };
    let shared = unsafe { shared(op.shared.cast()) };
    shared
        .in_flight
        .set(shared.in_flight.get().saturating_sub(1));
    if let Some(token) = op.token {
        shared
            .events
            .borrow_mut()
            .push(RawEvent::FlushDone { token });
    }
    // SAFETY: the request completed; freeing it in its callback is allowed.
    unsafe { u::ucp_request_free(req) };
}
