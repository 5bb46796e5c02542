//! The engines: one per I/O model, each a pinned worker loop that moves bytes and reports
//! completions to the connection machine ([`crate::connection::machine`]).
//!
//! - [`uring`]: io_uring, one `io_uring_enter` per loop iteration (the default);
//! - [`epoll`]: readiness, `epoll_wait` and nonblocking calls, where io_uring is not
//!   permitted or not there (ADR 0033).
//!
//! Neither decides what a connection does next: both ask the machine and carry out its step.

pub(crate) mod epoll;
pub(crate) mod uring;
pub(crate) mod worker;
