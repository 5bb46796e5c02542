//! The handshake cells: new TLS connections per server CPU-second, full or resumed.
//!
//! Each of `HS_THREADS` client threads (all pinned to the client CPU) opens a connection,
//! finishes the handshake, asks memcache `version` (so the server has taken the client's
//! Finished and answered on the session), sends close_notify and closes, again and again.
//! Resumed cells keep rustls' client session store (TLS 1.3 tickets) across connections; a
//! server that resumes none shows a resumed share of 0%.

use super::client::connect;
use super::procs;
use super::tls_wire::Wire;
use anyhow::{bail, Context, Result};
use rustls::ClientConfig;
use rustls::HandshakeKind;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Client threads, so the server has handshakes to do while a client verifies a signature.
pub(super) const HS_THREADS: usize = 4;

/// One server's handshake cell.
#[derive(Clone, Copy, Default)]
pub(super) struct Handshakes {
    pub done: u64,
    pub resumed: u64,
    pub errors: u64,
    pub seconds: f64,
    pub server_cpu_seconds: f64,
}

impl Handshakes {
    pub(super) fn per_cpu_second(&self) -> f64 {
        if self.server_cpu_seconds > 0.0 {
            self.done as f64 / self.server_cpu_seconds
        } else {
            f64::NAN
        }
    }

    pub(super) fn resumed_percent(&self) -> f64 {
        100.0 * self.resumed as f64 / (self.done.max(1)) as f64
    }

    fn merge(&mut self, other: &Handshakes) {
        self.done += other.done;
        self.resumed += other.resumed;
        self.errors += other.errors;
        self.seconds += other.seconds;
        self.server_cpu_seconds += other.server_cpu_seconds;
    }
}

/// One connection: handshake, `version`, close. `Ok(true)` when the handshake resumed.
fn one(port: u16, config: &Arc<ClientConfig>) -> Result<bool> {
    let (mut stream, session) = connect(port, Some(config))?;
    let mut session = session.context("a TLS session")?;
    session.writer().write_all(b"version\r\n")?;
    let mut rx = Vec::new();
    let mut buf = [0u8; 4096];
    while Wire::Version.split(&rx).is_none() {
        if rx.len() > 4096 {
            bail!("no VERSION line in {} bytes", rx.len());
        }
        session.complete_io(&mut stream)?;
        loop {
            match session.reader().read(&mut buf) {
                Ok(0) => bail!("closed before VERSION"),
                Ok(n) => rx.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    let resumed = session.handshake_kind() == Some(HandshakeKind::Resumed);
    session.send_close_notify();
    let _ = session.write_tls(&mut stream);
    Ok(resumed)
}

/// Counts of every client thread, shared.
#[derive(Default)]
struct Counters {
    done: AtomicU64,
    resumed: AtomicU64,
    errors: AtomicU64,
}

/// `HS_THREADS` threads making connections to `port` until `stop`.
fn clients(
    port: u16,
    config: &Arc<ClientConfig>,
    counting: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
    counters: &Arc<Counters>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..HS_THREADS)
        .map(|_| {
            let (config, counting, stop, counters) = (
                config.clone(),
                counting.clone(),
                stop.clone(),
                counters.clone(),
            );
            std::thread::spawn(move || {
                let _ = procs::pin_current_thread(procs::CLIENT_CPU);
                procs::raise_own_priority();
                while !stop.load(Ordering::Relaxed) {
                    let outcome = one(port, &config);
                    if !counting.load(Ordering::Relaxed) {
                        continue;
                    }
                    match outcome {
                        Ok(resumed) => {
                            counters.done.fetch_add(1, Ordering::Relaxed);
                            counters
                                .resumed
                                .fetch_add(u64::from(resumed), Ordering::Relaxed);
                        }
                        Err(_) => {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

/// `warmup` of handshakes against `port`, then `measure` of them counted with the server's
/// CPU time (process `server_pid`) read at the window's edges.
fn segment(
    port: u16,
    server_pid: u32,
    config: &Arc<ClientConfig>,
    warmup: Duration,
    measure: Duration,
) -> Result<Handshakes> {
    let counting = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let threads = clients(port, config, &counting, &stop, &counters);
    std::thread::sleep(warmup);
    let cpu0 = procs::process_cpu_seconds(server_pid)?;
    let started = Instant::now();
    counting.store(true, Ordering::Relaxed);
    std::thread::sleep(measure);
    counting.store(false, Ordering::Relaxed);
    let seconds = started.elapsed().as_secs_f64();
    let server_cpu_seconds = procs::process_cpu_seconds(server_pid)? - cpu0;
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    Ok(Handshakes {
        done: counters.done.load(Ordering::Relaxed),
        resumed: counters.resumed.load(Ordering::Relaxed),
        errors: counters.errors.load(Ordering::Relaxed),
        seconds,
        server_cpu_seconds,
    })
}

/// Handshake cells against `(port, server_pid)` targets in A B B A halves.
pub(super) fn run(
    targets: &[(u16, u32)],
    config: &Arc<ClientConfig>,
    warmup: Duration,
    measure: Duration,
) -> Result<Vec<Handshakes>> {
    let mut totals = vec![Handshakes::default(); targets.len()];
    for half in 0..2 {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if half == 1 {
            order.reverse();
        }
        for index in order {
            let (port, pid) = targets[index];
            let warm = if half == 0 { warmup } else { warmup / 4 };
            totals[index].merge(&segment(port, pid, config, warm, measure / 2)?);
        }
    }
    Ok(totals)
}
