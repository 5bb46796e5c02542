//! The io_uring data plane: one pinned worker per CPU, an acceptor per endpoint, bounded connection I/O.
//!
//! Public surface used by `ringstore serve` and by PID 1:
//! - [`Server::start`] binds every endpoint, chooses the NUMA node and CPUs, binds memory,
//!   builds the store and starts the workers;
//! - [`Server::ready_line`] is the exact `ready memcache=IP:PORT http=IP:PORT` line;
//! - [`Server::shutdown`] stops accepting, drains in-flight requests and joins the workers;
//! - [`TerminationSignals`] turns SIGTERM/SIGINT into a readable fd;
//! - [`topology`] and [`numa`] read the machine and choose the node (PID 1 uses them too).

mod acceptor;
mod bufring;
mod clock;
mod conn;
mod data;
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
mod sys;
pub mod topology;
mod udp;
mod worker;

#[cfg(test)]
mod tests;

pub use error::RuntimeError;
pub use listeners::LocalAddrs;
pub use ring::Features;
pub use server::Server;
pub use signals::TerminationSignals;
