//! velo-serve: an OpenAI-compatible streaming frontend on the response plane, with mock
//! workers found through discovery, the serving path a Dynamo user would recognise.
//!
//! - [`frontend`]: axum HTTP (`/v1/chat/completions`, `/v1/completions`, `/v1/models`,
//!   `/health`, `/metrics`), admission, routing to the least loaded worker, SSE.
//! - [`worker`]: velo-bench's mock engines (Dynamo's mocker timing model) answering on the
//!   response plane.
//! - [`wire`]: the items on the plane, Dynamo's `NetworkStreamWrapper<Annotated<LLMEngineOutput>>`.
//! - [`work`]: the request plane between them, authenticated by the cluster secret.
//! - [`discovery`]: Dynamo's file-backed discovery (`DYN_DISCOVERY_BACKEND=file`).
//! - [`openai`]: request parsing, the tokenizer, chunk and error shapes.
//! - [`client`] and [`load`]: an HTTP client with an SSE parser, and the load generator behind
//!   `cargo xtask serve-bench`.
//!
//! The response plane is chosen by `DYN_RESPONSE_PLANE` (`velo`, the default here, or `tcp`,
//! the classic plane), with every other setting the plane reads from the environment.
//!
//! # Layer contract
//!
//! An application on top of the library layers: it uses the response plane only through its
//! public API (and runtime-glue), velo-bench only for its mock engine, and velo-session only
//! for `ClusterSecret` (the request plane's handshake proves the response plane's secret).

#![allow(clippy::cast_precision_loss)] // figures are reported as f64; counts stay far below 2^52

pub mod cli;
pub mod client;
pub mod discovery;
pub mod frontend;
pub mod load;
pub mod openai;
pub mod wire;
pub mod work;
pub mod worker;
