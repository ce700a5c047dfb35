//! Shared response-plane service, env config, metrics, startup and bounded shutdown
