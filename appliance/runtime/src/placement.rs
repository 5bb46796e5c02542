//! Placement: where a connection is served. The listeners, the acceptor that hands each
//! accepted connection to the least-loaded worker, and each worker's inbox (ADR 0001).

pub(crate) mod acceptor;
pub(crate) mod inbox;
pub(crate) mod listeners;
