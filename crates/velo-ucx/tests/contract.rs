//! The transport contract (`velo_session::contract`) over UCX (TCP on `lo`).

#![cfg(feature = "ucx")]

mod common;

use common::Ucx;

velo_session::transport_contract!(ucx => Ucx; except {
    a_frontend_restarted_under_a_new_instance_id_is_prepared_again:
        "rebinding a port in TIME_WAIT needs UCX_TCP_CM_REUSEADDR=y, which UCX reads only from \
         the environment: process.rs runs this story in a process of its own",
});
