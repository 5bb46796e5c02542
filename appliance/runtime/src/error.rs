//! The runtime's typed errors: each Display is one line an operator can act on.

use std::net::SocketAddr;

/// Why the data plane could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A listening endpoint could not be bound.
    #[error("cannot listen for {endpoint} on {addr}: {source}")]
    Bind {
        endpoint: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The NUMA node could not be chosen (ARCHITECTURE.md, "NUMA placement"); the message lists every interface and the usable values.
    #[error("{0}")]
    Numa(String),
    /// `--cores` asks for more CPUs than the node has.
    #[error(
        "--cores {requested} is more than the {available} usable CPUs of NUMA node {node} ({cpus})"
    )]
    Cores {
        requested: usize,
        available: usize,
        node: u32,
        cpus: String,
    },
    /// The keyspace could not be built.
    #[error("cannot build the store: {0}")]
    Store(#[from] ringstore_store::StoreError),
    /// A system call the runtime needs failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The data device holds something ringstore must not overwrite (or cannot use): a usage error.
    #[error("{0}")]
    DataRefused(String),
    /// The data device could not be opened, recovered or checkpointed.
    #[error("{0}")]
    Data(String),
    /// The `--auth-file` cannot be read or is not `user:password` lines: a usage error.
    #[error("{0}")]
    AuthFile(String),
    /// The TLS certificates could not be read (a usage error: the files given).
    #[error("{0}")]
    Tls(String),
    /// `--io io_uring` where no ring with the needed features can be set up: the reason, the
    /// likely causes and the remedies, in one line.
    #[error("{0}")]
    IoUring(String),
    /// Something the chosen I/O runtime does not serve (the epoll runtime and `--data`,
    /// `--udp`, `--xdp`): a usage error.
    #[error("{0}")]
    Unsupported(String),
    /// A worker thread panicked or could not be joined.
    #[error("worker {0} failed")]
    Worker(usize),
}

impl RuntimeError {
    /// Wraps an OS error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> RuntimeError {
        RuntimeError::Io {
            what: what.into(),
            source,
        }
    }
}
