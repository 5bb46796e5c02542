//! Binding every endpoint before anything else starts: one listener per TCP endpoint
//! (acceptor placement) or one per worker sharing the port (reuseport placement).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};

use ringstore_config::{Config, Placement};
use ringstore_service::Protocol;

use crate::RuntimeError;

/// The bound addresses, as the ready line reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalAddrs {
    pub memcache: Option<SocketAddr>,
    pub http: Option<SocketAddr>,
    pub udp: Option<SocketAddr>,
    pub memcache_tls: Option<SocketAddr>,
    pub https: Option<SocketAddr>,
}

impl LocalAddrs {
    /// `ready memcache=IP:PORT http=IP:PORT[ udp=IP:PORT][ memcache_tls=IP:PORT][ https=IP:PORT]`;
    /// endpoints that are off are omitted.
    pub fn ready_line(&self) -> String {
        let mut line = String::from("ready");
        for (name, addr) in [
            ("memcache", self.memcache),
            ("http", self.http),
            ("udp", self.udp),
            ("memcache_tls", self.memcache_tls),
            ("https", self.https),
        ] {
            if let Some(addr) = addr {
                line.push_str(&format!(" {name}={addr}"));
            }
        }
        line
    }
}

/// What a TCP listener serves: a protocol, in the clear or over TLS (ADR 0031).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub protocol: Protocol,
    pub tls: bool,
}

impl Endpoint {
    pub(crate) fn plain(protocol: Protocol) -> Endpoint {
        Endpoint {
            protocol,
            tls: false,
        }
    }
}

/// Every bound socket.
pub(crate) struct Bound {
    pub addrs: LocalAddrs,
    /// Per TCP endpoint: its listeners (1, or one per worker with reuseport).
    pub tcp: Vec<(Endpoint, Vec<OwnedFd>)>,
    /// memcache UDP: one socket per worker, an SO_REUSEPORT group (empty: off).
    pub udp: Vec<OwnedFd>,
}

fn bind_tcp(
    endpoint: &'static str,
    addr: SocketAddr,
    copies: usize,
) -> Result<(SocketAddr, Vec<OwnedFd>), RuntimeError> {
    let reuseport = copies > 1;
    let err = |source| RuntimeError::Bind {
        endpoint,
        addr,
        source,
    };
    // Acceptor placement polls its one listener; reuseport listeners are used only by io_uring.
    let first = crate::sys::bind_socket(addr, true, reuseport, !reuseport).map_err(err)?;
    let local = crate::sys::local_addr(first.as_raw_fd()).map_err(err)?;
    let mut fds = vec![first];
    for _ in 1..copies {
        // Port 0 resolved on the first bind; the others join that port.
        fds.push(crate::sys::bind_socket(local, true, true, false).map_err(err)?);
    }
    Ok((local, fds))
}

/// Binds the endpoints of `config`; `workers` listeners per endpoint with reuseport placement.
pub(crate) fn bind(config: &Config, workers: usize) -> Result<Bound, RuntimeError> {
    let copies = if config.placement == Placement::ReusePort {
        workers.max(1)
    } else {
        1
    };
    let mut bound = Bound {
        addrs: LocalAddrs::default(),
        tcp: Vec::new(),
        udp: Vec::new(),
    };
    if let Some(addr) = config.memcache {
        let (local, fds) = bind_tcp("memcache", addr, copies)?;
        bound.addrs.memcache = Some(local);
        bound.tcp.push((Endpoint::plain(Protocol::Memcache), fds));
    }
    if let Some(addr) = config.http {
        let (local, fds) = bind_tcp("http", addr, copies)?;
        bound.addrs.http = Some(local);
        bound.tcp.push((Endpoint::plain(Protocol::Http), fds));
    }
    for (endpoint, addr, protocol) in [
        ("memcache-tls", config.tls.memcache, Protocol::Memcache),
        ("https", config.tls.https, Protocol::Http),
    ] {
        if let Some(addr) = addr {
            let (local, fds) = bind_tcp(endpoint, addr, copies)?;
            match protocol {
                Protocol::Memcache => bound.addrs.memcache_tls = Some(local),
                Protocol::Http => bound.addrs.https = Some(local),
            }
            bound.tcp.push((
                Endpoint {
                    protocol,
                    tls: true,
                },
                fds,
            ));
        }
    }
    if let Some(addr) = config.udp {
        let err = |source| RuntimeError::Bind {
            endpoint: "udp",
            addr,
            source,
        };
        // Always one per worker (whatever the TCP placement): the kernel spreads datagrams
        // over the group by flow hash, and each worker's ring serves its own socket. Blocking:
        // used only through io_uring (see `sys::bind_socket`).
        let first = crate::sys::bind_socket(addr, false, true, false).map_err(err)?;
        let local = crate::sys::local_addr(first.as_raw_fd()).map_err(err)?;
        bound.addrs.udp = Some(local);
        bound.udp.push(first);
        for _ in 1..workers.max(1) {
            bound
                .udp
                .push(crate::sys::bind_socket(local, false, true, false).map_err(err)?);
        }
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_lists_bound_endpoints_only() {
        let addrs = LocalAddrs {
            memcache: Some("127.0.0.1:5".parse().unwrap()),
            http: None,
            udp: Some("127.0.0.1:7".parse().unwrap()),
            ..LocalAddrs::default()
        };
        assert_eq!(
            addrs.ready_line(),
            "ready memcache=127.0.0.1:5 udp=127.0.0.1:7"
        );
    }

    #[test]
    fn port_zero_resolves_and_reuseport_copies_share_it() {
        let config = Config::from_args([
            "--memcache",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--placement",
            "reuseport",
        ])
        .unwrap();
        let bound = bind(&config, 3).unwrap();
        assert_ne!(bound.addrs.memcache.unwrap().port(), 0);
        assert_eq!(bound.tcp.len(), 2);
        assert!(bound.tcp.iter().all(|(_, fds)| fds.len() == 3));
        assert_eq!(bound.addrs.ready_line().split(' ').count(), 3);
    }

    #[test]
    fn a_taken_port_is_a_bind_error() {
        let config = Config::from_args(["--memcache", "127.0.0.1:0", "--http", "off"]).unwrap();
        let first = bind(&config, 1).unwrap();
        let taken = Config::from_args([
            "--memcache",
            &first.addrs.memcache.unwrap().to_string(),
            "--http",
            "off",
        ])
        .unwrap();
        let err = bind(&taken, 1).err().unwrap().to_string();
        assert!(
            err.starts_with("cannot listen for memcache on 127.0.0.1:"),
            "{err}"
        );
    }
}
