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
//! `unsafe` is denied here except in the io_uring ring and buffer code (`bufring`, `worker`),
//! which hands the kernel raw pointers into memory whose lifetime only that code knows, and
//! in `datapath::kernel_udp` (a zeroed `msghdr`) and `datapath::exanic` (libexanic FFI,
//! feature `exanic`; ADR 0021); every syscall wrapper is in `ringstore-sys`, imported as
//! `sys` (ADR-0017).
//!
//! [`datapath`] is the datapath interface memcache-over-UDP backends implement.

#![deny(unsafe_code)]

mod acceptor;
// The provided-buffer ring: an mmap shared with the kernel, written through raw pointers.
#[allow(unsafe_code)]
mod bufring;
mod clock;
mod conn;
mod data;
pub mod datapath;
mod durable;
mod error;
mod handler;
mod inbox;
mod linger;
mod listeners;
pub mod numa;
mod op;
mod plane;
mod ring;
mod server;
mod signals;
pub(crate) use ringstore_sys as sys;
pub mod topology;
// Pushes SQEs whose buffer pointers must outlive their completions, and takes ownership of
// the descriptors accept completions return.
#[allow(unsafe_code)]
mod worker;

#[cfg(test)]
mod tests;

pub use datapath::xdp::{prepare as prepare_xdp, XdpPrepared};
pub use error::RuntimeError;
pub use listeners::LocalAddrs;
pub use ring::Features;
pub use server::Server;
pub use signals::TerminationSignals;
