//! The io_uring data plane: one pinned worker per CPU, an acceptor per endpoint, bounded connection I/O.
//!
//! Public surface used by `ringstore serve` and by PID 1:
//! - [`Server::start`] binds every endpoint, chooses the NUMA node and CPUs, binds memory,
//!   builds the store and starts the workers;
//! - [`Server::ready_line`] is the exact `ready memcache=IP:PORT http=IP:PORT` line;
//! - [`Server::shutdown`] stops accepting, drains in-flight requests and joins the workers.
