//! The io_uring data plane: one pinned worker per CPU, an acceptor per endpoint, bounded connection I/O.
//!
//! Public surface used by `ringstore serve` and by PID 1:
//! - [`Server::start`] binds every endpoint, chooses the NUMA node and CPUs, binds memory,
//!   builds the store and starts the workers;
//! - [`Server::ready_line`] is the exact `ready memcache=IP:PORT http=IP:PORT` line;
//! - [`Server::shutdown`] stops accepting, drains in-flight requests and joins the workers;
//! - [`TerminationSignals`] turns SIGTERM/SIGINT into a readable fd;
//! - [`topology`] and [`numa`] read the machine and choose the node (PID 1 uses them too).
//!
//! `unsafe` is denied here except in three modules that hand the kernel raw pointers into
//! memory whose lifetime only they know (ADR-0017 and its amendment): `bufring` (the
//! provided-buffer ring shared with the kernel), `engine::uring::sqe` (SQE pushes, accepted
//! descriptors) and `datapath::exanic::ffi` (libexanic, feature `exanic`; ADR 0021). Every
//! other syscall and mapping is a safe wrapper in `ringstore-sys`, imported as `sys`.
//!
//! [`datapath`] is the datapath interface memcache-over-UDP backends implement.

#![deny(unsafe_code)]

pub mod auth_files;
// The provided-buffer ring: memory shared with the kernel, written through raw pointers.
#[allow(
    unsafe_code,
    reason = "the ring's slots and tail are shared with the kernel; see the module doc"
)]
mod bufring;
mod clock;
mod connection;
pub mod datapath;
mod durable;
mod engine;
mod error;
mod handler;
mod lend;
mod memory_file;
pub mod numa;
pub mod numa_sub;
mod op;
mod placement;
mod plane;
mod ring;
mod server;
mod setup;
mod termination;
mod tls;
pub(crate) use ringstore_sys as sys;
pub mod topology;

#[cfg(test)]
mod tests;

pub use datapath::xdp::{prepare as prepare_xdp, XdpPrepared};
pub use error::RuntimeError;
pub use placement::listeners::LocalAddrs;
pub use ring::Features;
pub use server::Server;
pub use termination::TerminationSignals;
