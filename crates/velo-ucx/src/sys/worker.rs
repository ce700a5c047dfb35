//! The worker's operations: set-up, listening, endpoints, sends, progress, teardown.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::mem::zeroed;
use std::net::SocketAddr;
use std::ptr::{null, null_mut};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use ucx1_sys as u;

use super::*;

impl Worker {
    /// Creates a context (`AM | WAKEUP`, `settings` applied over the `UCX_*` environment) and a
    /// `SERIALIZED` worker, registers the AM handler for `am_id`, and registers the worker's
    /// event fd with the current tokio runtime (which must be the one that drives it).
    pub(crate) fn new(settings: Settings<'_>, am_id: u32) -> Result<Self, InitError> {
        let ctx = create_context(settings)?;
        let mut raw: u::ucp_worker_h = null_mut();
        // SAFETY: params is a zeroed C struct with only THREAD_MODE set; `ctx` is a live
        // context; `raw` receives the worker on success.
        let status = unsafe {
            let mut p: u::ucp_worker_params_t = zeroed();
            p.field_mask = u::ucp_worker_params_field::UCP_WORKER_PARAM_FIELD_THREAD_MODE
                .0
                .into();
            p.thread_mode = u::ucs_thread_mode_t::UCS_THREAD_MODE_SERIALIZED;
            Status::of(u::ucp_worker_create(ctx, &p, &mut raw))
        };
        if !status.is_ok() {
            // SAFETY: the context is ours and nothing else uses it.
            unsafe { u::ucp_cleanup(ctx) };
            return Err(init_error("ucp_worker_create", status));
        }
        let shared = Box::new(Shared {
            eps: RefCell::new(EpTable::default()),
            events: RefCell::new(Vec::new()),
            arena: RefCell::new(BytesMut::new()),
            conn_requests: RefCell::new(Vec::new()),
            in_flight: Cell::new(0),
        });
        // From here on, Drop cleans up whatever fails.
        let mut w = Self {
            efd: None,
            listener: None,
            raw,
            ctx,
            shared,
        };
        // SAFETY: the handler's argument is `shared`, which outlives the worker (Drop
        // destroys the worker before the box is freed); on_am matches the callback type.
        let status = unsafe {
            let mut p: u::ucp_am_handler_param_t = zeroed();
            p.field_mask = (u::ucp_am_handler_param_field::UCP_AM_HANDLER_PARAM_FIELD_ID
                | u::ucp_am_handler_param_field::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | u::ucp_am_handler_param_field::UCP_AM_HANDLER_PARAM_FIELD_CB
                | u::ucp_am_handler_param_field::UCP_AM_HANDLER_PARAM_FIELD_ARG)
                .0
                .into();
            p.id = am_id;
            p.flags = u::ucp_am_cb_flags::UCP_AM_FLAG_WHOLE_MSG.0;
            p.cb = Some(on_am);
            p.arg = w.arg();
            Status::of(u::ucp_worker_set_am_recv_handler(w.raw, &p))
        };
        if !status.is_ok() {
            return Err(init_error("ucp_worker_set_am_recv_handler", status));
        }
        let mut fd: i32 = -1;
        // SAFETY: writes the worker's event fd into `fd`; needs UCP_FEATURE_WAKEUP (set).
        let status = Status::of(unsafe { u::ucp_worker_get_efd(w.raw, &mut fd) });
        if !status.is_ok() {
            return Err(init_error("ucp_worker_get_efd", status));
        }
        // SAFETY: the fd stays open until ucp_worker_destroy, and Drop deregisters (drops)
        // the AsyncFd before destroying the worker; nothing else closes it.
        let efd = unsafe { AsyncFd::register_with_interest(EventFd(fd), Interest::READABLE) }
            .map_err(|e| InitError {
                step: "registering the UCX event fd with tokio",
                status: e.to_string(),
            })?;
        w.efd = Some(efd);
        Ok(w)
    }

    fn arg(&self) -> *mut c_void {
        (&raw const *self.shared).cast_mut().cast()
    }

    /// Listens on `addr`; returns the bound port (`ucp_listener_query`).
    pub(crate) fn listen(&mut self, addr: SocketAddr) -> Result<u16, Status> {
        let (storage, len) = sockaddr(addr);
        let mut l: u::ucp_listener_h = null_mut();
        // SAFETY: the sockaddr is ours and valid during the call (UCX copies it); the conn
        // handler's argument is `shared`, which outlives the listener (destroyed in Drop
        // before the worker).
        let status = unsafe {
            let mut p: u::ucp_listener_params_t = zeroed();
            p.field_mask = (u::ucp_listener_params_field::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
                | u::ucp_listener_params_field::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER)
                .0
                .into();
            p.sockaddr.addr = (&raw const storage).cast();
            p.sockaddr.addrlen = len;
            p.conn_handler.cb = Some(on_conn);
            p.conn_handler.arg = self.arg();
            Status::of(u::ucp_listener_create(self.raw, &p, &mut l))
        };
        if !status.is_ok() {
            return Err(status);
        }
        self.listener = Some(l);
        // SAFETY: `l` is the live listener; the attr struct is ours.
        let (status, port) = unsafe {
            let mut a: u::ucp_listener_attr_t = zeroed();
            a.field_mask = u::ucp_listener_attr_field::UCP_LISTENER_ATTR_FIELD_SOCKADDR
                .0
                .into();
            let status = Status::of(u::ucp_listener_query(l, &mut a));
            // sockaddr_storage is large and aligned enough for either address family.
            let ss: &libc::sockaddr_storage = &*(&raw const a.sockaddr).cast();
            let port = match i32::from(ss.ss_family) {
                libc::AF_INET6 => {
                    u16::from_be((*(&raw const a.sockaddr).cast::<libc::sockaddr_in6>()).sin6_port)
                }
                _ => u16::from_be((*(&raw const a.sockaddr).cast::<libc::sockaddr_in>()).sin_port),
            };
            (status, port)
        };
        if !status.is_ok() {
            return Err(status);
        }
        Ok(port)
    }

    /// Stops listening: rejects connection requests not yet taken and destroys the listener.
    pub(crate) fn stop_listening(&mut self) {
        for req in self.take_conn_requests() {
            drop(req);
        }
        if let Some(l) = self.listener.take() {
            // SAFETY: `l` is our live listener; no conn request of it is pending (rejected
            // above, and callbacks only run inside calls on this worker).
            unsafe { u::ucp_listener_destroy(l) };
        }
    }

    /// Connection requests that arrived since the last call.
    pub(crate) fn take_conn_requests(&self) -> Vec<ConnRequest<'_>> {
        std::mem::take(&mut *self.shared.conn_requests.borrow_mut())
            .into_iter()
            .map(|raw| ConnRequest { raw, worker: self })
            .collect()
    }

    /// Starts a client-server connection to `addr` with peer-failure handling. UCX reports
    /// failures to connect later, as an [`Event::EpError`].
    pub(crate) fn connect(&self, addr: SocketAddr) -> Result<EpId, Status> {
        let (storage, len) = sockaddr(addr);
        // SAFETY: the sockaddr is ours and valid during the call (UCX copies it); the error
        // handler's argument is `shared`, which outlives every endpoint.
        unsafe {
            let mut p: u::ucp_ep_params_t = zeroed();
            p.field_mask = (u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_FLAGS
                | u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_SOCK_ADDR
                | u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLER)
                .0
                .into();
            p.flags = u::ucp_ep_params_flags_field::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER.0;
            p.sockaddr.addr = (&raw const storage).cast();
            p.sockaddr.addrlen = len;
            self.create_ep(p)
        }
    }

    /// # Safety
    ///
    /// `p` must be valid `ucp_ep_create` parameters whose pointers live during the call.
    unsafe fn create_ep(&self, mut p: u::ucp_ep_params_t) -> Result<EpId, Status> {
        p.field_mask |= u64::from(
            (u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_ERR_HANDLER)
                .0,
        );
        p.err_mode = u::ucp_err_handling_mode_t::UCP_ERR_HANDLING_MODE_PEER;
        p.err_handler.cb = Some(on_ep_error);
        p.err_handler.arg = self.arg();
        let mut ep: u::ucp_ep_h = null_mut();
        // SAFETY: per this function's contract; `ep` receives the endpoint on success.
        let status = Status::of(unsafe { u::ucp_ep_create(self.raw, &p, &mut ep) });
        if !status.is_ok() {
            return Err(status);
        }
        let mut t = self.shared.eps.borrow_mut();
        let id = EpId(t.next);
        t.next += 1;
        t.by_id.insert(id, ep);
        t.by_raw.insert(ep as usize, id);
        Ok(id)
    }

    fn ep(&self, id: EpId) -> Result<u::ucp_ep_h, Status> {
        self.shared
            .eps
            .borrow()
            .by_id
            .get(&id)
            .copied()
            .ok_or_else(|| Status::of(u::ucs_status_t::UCS_ERR_NOT_CONNECTED))
    }

    /// Sends an active message `am_id` on `ep`: `header` (at most [`MAX_HEADER`] bytes) and the
    /// payload `chunks` (gathered, not copied), with the REPLY flag so the receiver knows the
    /// endpoint. The buffers are held until UCX is done; a pending send reports
    /// [`Event::SendDone`] with `token`.
    pub(crate) fn send(
        &self,
        ep: EpId,
        am_id: u32,
        header: &[u8],
        chunks: Vec<Bytes>,
        token: u64,
    ) -> Result<Started, Status> {
        let ep = self.ep(ep)?;
        let mut op = Box::new(SendOp {
            header: [0; MAX_HEADER],
            iov: chunks
                .iter()
                .map(|c| u::ucp_dt_iov {
                    buffer: c.as_ptr().cast_mut().cast(),
                    length: c.len() as u::size_t,
                })
                .collect(),
            _payload: chunks,
            token,
            shared: &raw const *self.shared,
        });
        let hlen = header.len().min(MAX_HEADER);
        op.header[..hlen].copy_from_slice(&header[..hlen]);
        let (buffer, count, datatype) = match op.iov.as_slice() {
            [] => (null(), 0, u::ucp_dt_make_contig(1)),
            [one] => (
                one.buffer.cast_const(),
                one.length,
                u::ucp_dt_make_contig(1),
            ),
            many => (
                many.as_ptr().cast(),
                many.len() as u::size_t,
                u::ucp_dt_type::UCP_DATATYPE_IOV as u::ucp_datatype_t,
            ),
        };
        let header_ptr = op.header.as_ptr().cast();
        let op = Box::into_raw(op);
        // SAFETY: `ep` is a live endpoint of this worker; header, payload and iov array live in
        // the boxed op until the callback (or the immediate result below) frees it; send_cb
        // matches the callback type and gets the op as user data.
        let r = unsafe {
            let mut p: u::ucp_request_param_t = zeroed();
            p.op_attr_mask = u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_FLAGS as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_DATATYPE as u32;
            p.flags = u::ucp_send_am_flags::UCP_AM_SEND_FLAG_REPLY.0;
            p.cb.send = Some(send_cb);
            p.user_data = op.cast();
            p.datatype = datatype;
            u::ucp_am_send_nbx(
                ep,
                am_id,
                header_ptr,
                hlen as u::size_t,
                buffer.cast(),
                count,
                &p,
            )
        };
        self.started(r, || {
            // SAFETY: no request was created, so the callback will not run: the op is ours.
            drop(unsafe { Box::from_raw(op) });
        })
    }

    /// Flushes `ep` (every send on it reaches the peer); reports [`Event::FlushDone`] with
    /// `token` when pending.
    pub(crate) fn flush(&self, ep: EpId, token: u64) -> Result<Started, Status> {
        let ep = self.ep(ep)?;
        let op = Box::into_raw(Box::new(DoneOp {
            token: Some(token),
            shared: &raw const *self.shared,
        }));
        // SAFETY: `ep` is live; the op lives until done_cb or the immediate result frees it.
        let r = unsafe {
            let mut p: u::ucp_request_param_t = zeroed();
            p.op_attr_mask = u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32;
            p.cb.send = Some(done_cb);
            p.user_data = op.cast();
            u::ucp_ep_flush_nbx(ep, &p)
        };
        self.started(r, || {
            // SAFETY: no request was created, so the callback will not run: the op is ours.
            drop(unsafe { Box::from_raw(op) });
        })
    }

    /// Closes `ep` at once (`UCP_EP_CLOSE_FLAG_FORCE`): its pending requests complete with
    /// `UCS_ERR_CANCELED`, the peer sees an endpoint error. Unknown ids are ignored.
    pub(crate) fn close(&self, id: EpId) {
        let ep = {
            let mut t = self.shared.eps.borrow_mut();
            let Some(ep) = t.by_id.remove(&id) else {
                return;
            };
            t.by_raw.remove(&(ep as usize));
            ep
        };
        let op = Box::into_raw(Box::new(DoneOp {
            token: None,
            shared: &raw const *self.shared,
        }));
        // SAFETY: `ep` was live and is now forgotten, so it is closed exactly once; the op
        // lives until done_cb or the immediate result frees it.
        let r = unsafe {
            let mut p: u::ucp_request_param_t = zeroed();
            p.op_attr_mask = u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_FLAGS as u32;
            p.flags = u::ucp_ep_close_flags_t::UCP_EP_CLOSE_FLAG_FORCE.0;
            p.cb.send = Some(done_cb);
            p.user_data = op.cast();
            u::ucp_ep_close_nbx(ep, &p)
        };
        if let Err(status) = self.started(r, || {
            // SAFETY: no request was created, so the callback will not run: the op is ours.
            drop(unsafe { Box::from_raw(op) });
        }) {
            tracing::debug!(%status, "force-closing a UCX endpoint failed");
        }
    }

    /// Turns a `*_nbx` result into [`Started`], running `free` unless a request was created.
    fn started(&self, r: u::ucs_status_ptr_t, free: impl FnOnce()) -> Result<Started, Status> {
        if r.is_null() {
            free();
            Ok(Started::Done)
        } else if ptr_is_err(r) {
            free();
            Err(Status::of_ptr(r))
        } else {
            self.shared.in_flight.set(self.shared.in_flight.get() + 1);
            Ok(Started::Pending)
        }
    }

    /// Runs UCX's progress once: callbacks run inside and queue events. Returns whether
    /// anything happened.
    pub(crate) fn progress(&self) -> bool {
        // SAFETY: the worker is live and used by one thread at a time; no Rust reference
        // into `shared` is held across the call (callbacks borrow its cells briefly).
        unsafe { u::ucp_worker_progress(self.raw) != 0 }
    }

    /// Arms the event fd, or says events are pending.
    pub(crate) fn arm(&self) -> Result<Arm, Status> {
        // SAFETY: the worker is live; arming needs UCP_FEATURE_WAKEUP (set).
        let status = Status::of(unsafe { u::ucp_worker_arm(self.raw) });
        match status {
            Status::OK => Ok(Arm::Armed),
            s if s == Status::of(u::ucs_status_t::UCS_ERR_BUSY) => Ok(Arm::Busy),
            s => Err(s),
        }
    }

    /// Waits until the armed event fd signals, then clears its readiness (before the next
    /// progress pass, so a signal during that pass is not lost). Borrows only the event fd, so
    /// the future is `Send`.
    pub(crate) fn readable(&self) -> impl Future<Output = std::io::Result<()>> + Send + '_ {
        let efd = self.efd.as_ref();
        async move {
            let Some(efd) = efd else {
                return std::future::pending().await;
            };
            let mut guard = efd.readable().await?;
            guard.clear_ready();
            Ok(())
        }
    }

    /// Hands every queued event to `f`, in the order the callbacks ran.
    pub(crate) fn drain_events(&self, mut f: impl FnMut(Event<'_>)) {
        loop {
            let raw = std::mem::take(&mut *self.shared.events.borrow_mut());
            if raw.is_empty() {
                return;
            }
            let mut arena = self.shared.arena.borrow_mut().split().freeze();
            for ev in raw {
                let ev = match ev {
                    RawEvent::Message { ep, header, body } => Event::Message {
                        ep,
                        header,
                        body: match body {
                            RawBody::Eager(n) => Body::Eager(arena.split_to(n)),
                            RawBody::Rndv { desc, len } => Body::Rndv(RndvDesc {
                                desc,
                                len,
                                worker: self,
                            }),
                        },
                    },
                    RawEvent::EpError { ep, status } => Event::EpError { ep, status },
                    RawEvent::SendDone { token, status } => Event::SendDone { token, status },
                    RawEvent::RecvDone {
                        token,
                        status,
                        data,
                    } => Event::RecvDone {
                        token,
                        status,
                        data,
                    },
                    RawEvent::FlushDone { token } => Event::FlushDone { token },
                };
                f(ev);
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop_listening();
        let eps: Vec<EpId> = self.shared.eps.borrow().by_id.keys().copied().collect();
        for ep in eps {
            self.close(ep);
        }
        // Let cancelled requests call back (and free their buffers), within bounds.
        let until = Instant::now() + TEARDOWN_TIME;
        for _ in 0..TEARDOWN_ROUNDS {
            if self.shared.in_flight.get() == 0 || Instant::now() >= until {
                break;
            }
            self.progress();
        }
        // Rendezvous descriptors still queued are released with the worker.
        self.shared.events.borrow_mut().clear();
        self.efd = None;
        // SAFETY: the listener and endpoints are gone, the event fd is deregistered; requests
        // still outstanding are purged by UCX (their callbacks, if any, find `shared` alive:
        // it is dropped after this body). Worker before context, as UCX requires.
        unsafe {
            u::ucp_worker_destroy(self.raw);
            u::ucp_cleanup(self.ctx);
        }
    }
}

impl RndvDesc<'_> {
    /// The payload's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Fetches the payload into a buffer of its own. `Ok(Some)` when it completed at once,
    /// `Ok(None)` when [`Event::RecvDone`] with `token` follows.
    pub(crate) fn receive(self, token: u64) -> Result<Option<Vec<u8>>, Status> {
        let this = std::mem::ManuallyDrop::new(self);
        let worker = this.worker;
        let len = this.len;
        let mut op = Box::new(RecvOp {
            buf: Vec::with_capacity(len),
            token,
            shared: &raw const *worker.shared,
        });
        let buf = op.buf.as_mut_ptr();
        let op = Box::into_raw(op);
        // SAFETY: `desc` is an unreleased rendezvous descriptor of this worker (the handler
        // returned UCS_INPROGRESS); UCX writes at most `len` bytes into the op's buffer, which
        // lives until recv_cb or the immediate result below frees it. After this call UCX owns
        // the descriptor, whatever the result.
        let r = unsafe {
            let mut p: u::ucp_request_param_t = zeroed();
            p.op_attr_mask = u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_CALLBACK as u32
                | u::ucp_op_attr_t::UCP_OP_ATTR_FIELD_USER_DATA as u32;
            p.cb.recv_am = Some(recv_cb);
            p.user_data = op.cast();
            u::ucp_am_recv_data_nbx(worker.raw, this.desc, buf.cast(), len as u::size_t, &p)
        };
        if r.is_null() {
            // SAFETY: completed at once: no callback will run, the op is ours, and UCX wrote
            // the whole payload (`len` bytes).
            let mut op = unsafe { Box::from_raw(op) };
            unsafe { op.buf.set_len(len) };
            return Ok(Some(std::mem::take(&mut op.buf)));
        }
        if ptr_is_err(r) {
            // SAFETY: no request was created: the op is ours.
            drop(unsafe { Box::from_raw(op) });
            return Err(Status::of_ptr(r));
        }
        worker
            .shared
            .in_flight
            .set(worker.shared.in_flight.get() + 1);
        Ok(None)
    }
}

impl Drop for RndvDesc<'_> {
    fn drop(&mut self) {
        // SAFETY: an unreleased rendezvous descriptor of this (live) worker; releasing it
        // tells the sender its message was dropped.
        unsafe { u::ucp_am_data_release(self.worker.raw, self.desc) };
    }
}

impl ConnRequest<'_> {
    /// The client's address, when UCX knows it.
    pub(crate) fn client(&self) -> Option<SocketAddr> {
        // SAFETY: the request is live (not yet accepted or rejected); the attr struct is ours
        // and sockaddr_storage is large and aligned enough for either family.
        unsafe {
            let mut a: u::ucp_conn_request_attr_t = zeroed();
            a.field_mask = u::ucp_conn_request_attr_field::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR
                .0
                .into();
            if !Status::of(u::ucp_conn_request_query(self.raw, &mut a)).is_ok() {
                return None;
            }
            let ss: &libc::sockaddr_storage = &*(&raw const a.client_address).cast();
            from_sockaddr(ss)
        }
    }

    /// Accepts the connection: an endpoint with peer-failure handling.
    pub(crate) fn accept(self) -> Result<EpId, Status> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the request is live and consumed here exactly once (no Drop runs).
        unsafe {
            let mut p: u::ucp_ep_params_t = zeroed();
            p.field_mask = u::ucp_ep_params_field::UCP_EP_PARAM_FIELD_CONN_REQUEST
                .0
                .into();
            p.conn_request = this.raw;
            this.worker.create_ep(p)
        }
    }
}

impl Drop for ConnRequest<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.worker.listener {
            // SAFETY: the request belongs to this live listener and is consumed here once.
            let status = Status::of(unsafe { u::ucp_listener_reject(l, self.raw) });
            if !status.is_ok() {
                tracing::debug!(%status, "rejecting a UCX connection request failed");
            }
        }
    }
}
