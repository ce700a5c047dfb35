//! The OpenAI-compatible API surface: request parsing and checks ([`request`]), the prompt
//! tokenizer ([`tokenizer`]), the answer's chunks ([`chunk`]) and error objects ([`error`]).

pub mod chunk;
pub mod error;
pub mod request;
pub mod tokenizer;

pub use chunk::Shaper;
pub use error::ApiError;
pub use request::{Ending, Endpoint, Job, Limits};
