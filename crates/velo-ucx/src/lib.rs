//! Velo response plane transport over UCX active messages
