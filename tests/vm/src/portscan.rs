//! A TCP connect scan of a guest from inside a network namespace: scanning threads join the
//! namespace with setns(2) (a thread's network namespace is its own), then connect to every port
//! with a bounded number in flight and a per-connect time limit. A port is open (connected),
//! closed (refused: the guest answered RST) or unanswered (retried once, slowly).

use std::fs::File;
use std::net::{IpAddr, SocketAddr, SocketAddrV6, TcpStream};
use std::ops::RangeInclusive;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// What a scan found.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub open: Vec<u16>,
    /// Neither connected nor refused, even on the slow retry.
    pub unanswered: Vec<u16>,
    pub scanned: usize,
}

/// How a scan runs.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Scanning threads = connects in flight.
    pub threads: usize,
    /// Per-connect limit on the first pass.
    pub connect: Duration,
    /// Per-connect limit on the retry of unanswered ports.
    pub retry_connect: Duration,
    /// The whole scan, both passes.
    pub total: Duration,
}

/// What one scanning thread found.
#[derive(Default)]
struct Pass {
    open: Vec<u16>,
    unanswered: Vec<u16>,
    scanned: usize,
}

enum Outcome {
    Open,
    Closed,
    Unanswered,
}

fn probe(addr: SocketAddr, limit: Duration) -> Result<Outcome> {
    match TcpStream::connect_timeout(&addr, limit) {
        Ok(_) => Ok(Outcome::Open),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(Outcome::Closed),
        // No answer in time, or ARP gave up on the guest for a moment.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::HostUnreachable
            ) =>
        {
            Ok(Outcome::Unanswered)
        }
        Err(e) => Err(e).with_context(|| format!("connecting to {addr}")),
    }
}

/// Moves the calling thread into the network namespace at `netns` (a /run/netns/NAME file);
/// `None` stays where it is.
pub(super) fn enter(netns: Option<&Path>) -> Result<()> {
    let Some(netns) = netns else { return Ok(()) };
    let file = File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    // It changes only the calling thread's network namespace, which this scanning thread owns.
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
    .with_context(|| format!("setns {}", netns.display()))?;
    Ok(())
}

/// The address of `port` on `target`; `scope` is the interface index for an IPv6 link-local target.
fn endpoint(target: IpAddr, scope: u32, port: u16) -> SocketAddr {
    match target {
        IpAddr::V4(v4) => SocketAddr::from((v4, port)),
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope)),
    }
}

/// Connect-scans `target`'s TCP `ports` from inside the namespace at `netns` (`None`: this one);
/// `scope` is the interface index (in that namespace) for an IPv6 link-local target, else 0.
pub fn scan_tcp(
    netns: Option<&Path>,
    target: IpAddr,
    scope: u32,
    ports: RangeInclusive<u16>,
    limits: Limits,
) -> Result<Scan> {
    let deadline = Instant::now() + limits.total;
    let next = AtomicU32::new(u32::from(*ports.start()));
    let end = u32::from(*ports.end());
    let first_pass = || -> Result<Pass> {
        enter(netns)?;
        let mut pass = Pass::default();
        loop {
            let port = next.fetch_add(1, Ordering::Relaxed);
            if port > end {
                return Ok(pass);
            }
            if Instant::now() > deadline {
                bail!(
                    "the scan ran past {} s at port {port}",
                    limits.total.as_secs()
                );
            }
            let port = u16::try_from(port).context("port past 65535")?;
            match probe(endpoint(target, scope, port), limits.connect)? {
                Outcome::Open => pass.open.push(port),
                Outcome::Closed => {}
                Outcome::Unanswered => pass.unanswered.push(port),
            }
            pass.scanned += 1;
        }
    };
    let mut scan = Scan::default();
    let mut pending: Vec<u16> = Vec::new();
    let passes: Vec<Result<Pass>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..limits.threads.max(1))
            .map(|_| scope.spawn(first_pass))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a scanning thread panicked")))
            })
            .collect()
    });
    for pass in passes {
        let pass = pass?;
        scan.open.extend(pass.open);
        pending.extend(pass.unanswered);
        scan.scanned += pass.scanned;
    }
    pending.sort_unstable();
    // Unanswered ports get one more, slower, try on a single thread.
    let retry = || -> Result<(Vec<u16>, Vec<u16>)> {
        enter(netns)?;
        let (mut open, mut unanswered) = (Vec::new(), Vec::new());
        for &port in &pending {
            if Instant::now() > deadline {
                bail!(
                    "the scan ran past {} s retrying {} unanswered ports",
                    limits.total.as_secs(),
                    pending.len()
                );
            }
            match probe(endpoint(target, scope, port), limits.retry_connect)? {
                Outcome::Open => open.push(port),
                Outcome::Closed => {}
                Outcome::Unanswered => unanswered.push(port),
            }
        }
        Ok((open, unanswered))
    };
    if !pending.is_empty() {
        let (open, unanswered) = std::thread::scope(|scope| {
            scope
                .spawn(retry)
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the retrying thread panicked")))
        })?;
        scan.open.extend(open);
        scan.unanswered = unanswered;
    }
    scan.open.sort_unstable();
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn finds_exactly_the_listening_ports_on_loopback() {
        let listeners: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let ports: Vec<u16> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        let (lo, hi) = (*ports.iter().min().unwrap(), *ports.iter().max().unwrap());
        // A window around both listeners, small enough to be quick.
        let range = lo.saturating_sub(20)..=hi.saturating_add(20).max(lo.saturating_add(40));
        let limits = Limits {
            threads: 8,
            connect: Duration::from_secs(2),
            retry_connect: Duration::from_secs(2),
            total: Duration::from_secs(30),
        };
        let scan = scan_tcp(None, Ipv4Addr::LOCALHOST.into(), 0, range.clone(), limits).unwrap();
        assert_eq!(scan.scanned, range.count());
        for port in &ports {
            assert!(scan.open.contains(port), "{port} not found open: {scan:?}");
        }
        assert!(scan.unanswered.is_empty(), "{scan:?}");
    }

    #[test]
    fn a_missing_namespace_is_an_error() {
        let limits = Limits {
            threads: 2,
            connect: Duration::from_secs(1),
            retry_connect: Duration::from_secs(1),
            total: Duration::from_secs(5),
        };
        assert!(scan_tcp(
            Some(Path::new("/run/netns/ringstore-does-not-exist")),
            Ipv4Addr::LOCALHOST.into(),
            0,
            1..=2,
            limits
        )
        .is_err());
    }
}
