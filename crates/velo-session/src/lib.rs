//! Async glue shared by velo transports: shared mux state, stream handles, lane pumps, peer cache
