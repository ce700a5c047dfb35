//! Velo response plane transport over TCP lanes (tokio)
