//! The metrics part (issue 33): what observing the requests costs the server. The same
//! ringstore binary with the latency histograms and the hot-key sampling on (the default)
//! against `--latency-histograms off` and against `--hotkeys off`, GET and SET 100 B at
//! depth 16, the three servers measured in alternating slices by the one load generator;
//! then what one `/metrics` scrape costs a server holding 1M keys: its CPU (from
//! /proc/PID/stat, an idle stretch as long subtracted) and the answer's size.

use super::cells::cell_name;
use super::client::{self, LoadResult};
use super::doc::{mark, Doc};
use super::fill;
use super::mcwire::Op;
use super::memcache_part::cell_spec;
use super::options::Options;
use super::procs::{self, Pinned};
use super::report::{Better, Table};
use super::subject::Subject;
use super::tls_wire::split_http;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// The cells: GET and SET of 100-byte values at depth 16 (the goals' depth).
const CELLS: [(Op, usize, usize); 2] = [(Op::Get, 100, 16), (Op::Set, 100, 16)];
/// Item memory of every server (as the memcache part's).
const MEMORY_MIB: u64 = 1024;
/// The switched-off servers' extra flags, and how the tables name each server.
const HISTOGRAMS_OFF: [&str; 2] = ["--latency-histograms", "off"];
const HOTKEYS_OFF: [&str; 2] = ["--hotkeys", "off"];
const ON_NAME: &str = "on (default)";
const HISTOGRAMS_OFF_NAME: &str = "--latency-histograms off";
const HOTKEYS_OFF_NAME: &str = "--hotkeys off";
/// Goals: server CPU per request with / without (issue 33).
const HISTOGRAMS_GOAL: f64 = 1.02;
const HOTKEYS_GOAL: f64 = 1.01;
/// The scrape: keys of 100 bytes the server holds, scrapes per `--seconds`, and the goals.
const SCRAPE_KEYS: usize = 1_000_000;
const SCRAPE_VALUE_LEN: usize = 100;
/// Fewest scrapes a run takes, however short `--seconds`: the kernel counts CPU time in
/// clock ticks (10 ms), so the scrapes together must span many of them.
const SCRAPES_MIN: usize = 200;
const SCRAPE_CPU_GOAL_MS: f64 = 5.0;
const SCRAPE_BYTES_GOAL: usize = 64 << 10;
/// Largest answer the scraper reads (far over the goal: a runaway answer fails the run).
const SCRAPE_READ_MAX: usize = 16 << 20;

/// `--only metrics`: both sections.
pub(super) fn metrics_part(o: &Options, subject: &Subject, doc: &mut Doc) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        bail!("--only metrics measures ringstore against itself: not with --self-check");
    };
    observe_section(o, binary, doc)?;
    scrape_section(o, binary, doc)
}

/// The three servers of the with/without cells, preloaded.
struct Servers {
    on: Pinned,
    histograms_off: Pinned,
    hotkeys_off: Pinned,
}

fn start_servers(binary: &Path, doc: &mut Doc) -> Result<Servers> {
    let servers = Servers {
        on: procs::start_ringstore(binary, MEMORY_MIB)?,
        histograms_off: procs::start_ringstore_with(binary, MEMORY_MIB, &HISTOGRAMS_OFF)?,
        hotkeys_off: procs::start_ringstore_with(binary, MEMORY_MIB, &HOTKEYS_OFF)?,
    };
    for s in [&servers.on, &servers.histograms_off, &servers.hotkeys_off] {
        doc.command(&s.command);
        for &(_, len, _) in &CELLS {
            fill::preload(s.port, len, super::cells::keyspace(len))?;
        }
    }
    Ok(servers)
}

/// What one cell measured on each server.
struct Cell {
    on: LoadResult,
    histograms_off: LoadResult,
    hotkeys_off: LoadResult,
}

fn run_cell(o: &Options, s: &mut Servers, (op, len, depth): (Op, usize, usize)) -> Result<Cell> {
    let specs = [&s.histograms_off, &s.on, &s.hotkeys_off].map(|p| cell_spec(o, p, op, len, depth));
    let mut results = client::run(&specs)?.into_iter();
    for p in [&mut s.on, &mut s.histograms_off, &mut s.hotkeys_off] {
        p.check_alive()?;
    }
    let mut next = || results.next().context("three results");
    let (histograms_off, on, hotkeys_off) = (next()?, next()?, next()?);
    for r in [&on, &histograms_off, &hotkeys_off] {
        if r.requests == 0 {
            bail!(
                "{}: a server completed no request",
                cell_name(op, len, depth)
            );
        }
    }
    Ok(Cell {
        on,
        histograms_off,
        hotkeys_off,
    })
}

/// One comparison's rows: `off` is the baseline, `on` the subject.
fn rows(table: &mut Table, cell: &str, off: &LoadResult, on: &LoadResult) {
    let rows: [(&str, f64, f64, Better, usize); 4] = [
        (
            "throughput (req/s)",
            off.throughput(),
            on.throughput(),
            Better::Higher,
            0,
        ),
        (
            "p50 latency (µs)",
            off.p50_us(),
            on.p50_us(),
            Better::Lower,
            1,
        ),
        (
            "p99 latency (µs)",
            off.p99_us(),
            on.p99_us(),
            Better::Lower,
            1,
        ),
        (
            "server CPU s / M req",
            off.server_cpu_per_million(),
            on.server_cpu_per_million(),
            Better::Lower,
            3,
        ),
    ];
    for (what, base, subject, better, digits) in rows {
        table.row(
            &format!("{cell}: {what}"),
            base,
            Some(subject),
            better,
            digits,
        );
    }
}

/// The target line: server CPU per request on against off.
fn cost_target(
    doc: &mut Doc,
    cell: &str,
    what: &str,
    off: &LoadResult,
    on: &LoadResult,
    goal: f64,
) {
    let cost = on.server_cpu_per_million() / off.server_cpu_per_million();
    doc.targets.push(format!(
        "{cell}: server CPU per request with {what} {cost:.3}× without (goal ≤ {goal}×) {}",
        mark(cost <= goal)
    ));
}

/// The with/without cells and their tables.
fn observe_section(o: &Options, binary: &Path, doc: &mut Doc) -> Result<()> {
    let mut servers = start_servers(binary, doc)?;
    let mut histograms = Table::new(HISTOGRAMS_OFF_NAME, ON_NAME);
    let mut hotkeys = Table::new(HOTKEYS_OFF_NAME, ON_NAME);
    for (op, len, depth) in CELLS {
        let cell = cell_name(op, len, depth);
        eprintln!(
            "bench: {cell}: ringstore on, histograms off, hot keys off in alternating slices"
        );
        let c = run_cell(o, &mut servers, (op, len, depth)).with_context(|| cell.clone())?;
        for (who, r) in [
            (ON_NAME, &c.on),
            (HISTOGRAMS_OFF_NAME, &c.histograms_off),
            (HOTKEYS_OFF_NAME, &c.hotkeys_off),
        ] {
            if r.misses + r.errors > 0 {
                doc.note(format!(
                    "{cell}: {who} answered {} misses and {} errors",
                    r.misses, r.errors
                ));
            }
        }
        rows(&mut histograms, &cell, &c.histograms_off, &c.on);
        rows(&mut hotkeys, &cell, &c.hotkeys_off, &c.on);
        cost_target(
            doc,
            &cell,
            "the latency histograms",
            &c.histograms_off,
            &c.on,
            HISTOGRAMS_GOAL,
        );
        if op == Op::Get {
            cost_target(
                doc,
                &cell,
                "hot-key sampling",
                &c.hotkeys_off,
                &c.on,
                HOTKEYS_GOAL,
            );
        }
    }
    let mut section = String::from(
        "## metrics: the latency histograms and the hot-key sampling, with and without (one server core each)\n\n\
         The same binary three times, measured in alternating slices: the default (both on), \
         `--latency-histograms off`, `--hotkeys off`.\n\n### latency histograms\n\n",
    );
    section.push_str(&histograms.markdown());
    section.push_str("\n### hot-key sampling\n\n");
    section.push_str(&hotkeys.markdown());
    doc.sections.push(section);
    Ok(())
}

/// One `GET /metrics` on a kept-alive connection: the answer's body length.
fn scrape(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize> {
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
    buf.clear();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if let Some(whole) = split_http(buf) {
            if !whole.ok {
                let head = String::from_utf8_lossy(&buf[..buf.len().min(80)]).into_owned();
                bail!("/metrics answered {head:?}");
            }
            let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0) + 4;
            return Ok(whole.len - head_end);
        }
        let n = stream.read(&mut chunk).context("reading /metrics")?;
        if n == 0 || buf.len() + n > SCRAPE_READ_MAX {
            bail!("/metrics: connection closed or answer over {SCRAPE_READ_MAX} bytes");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// What `count` scrapes measured.
struct Scrapes {
    count: usize,
    /// Server CPU seconds over the scrapes, and over an idle stretch as long.
    busy: f64,
    idle: f64,
    wall: Duration,
    /// Largest answer body, bytes.
    bytes: usize,
    /// Slowest scrape as the client saw it.
    slowest: Duration,
}

/// Scrapes of `server` one after another from a thread on the client CPU for `seconds` (at
/// least [`SCRAPES_MIN`] of them), then the idle stretch.
fn time_scrapes(server: &Pinned, seconds: Duration) -> Result<Scrapes> {
    let port = server.http_port.context("ringstore's HTTP port")?;
    let pid = server.pid();
    std::thread::scope(|s| {
        s.spawn(|| -> Result<Scrapes> {
            procs::pin_current_thread(procs::CLIENT_CPU)?;
            procs::raise_own_priority();
            let mut stream = fill::connect(port)?;
            stream.set_nodelay(true)?;
            let mut buf = Vec::new();
            // The first answer sizes the buffers: not what a steady scrape costs.
            scrape(&mut stream, &mut buf)?;
            let (mut bytes, mut slowest, mut count) = (0, Duration::ZERO, 0);
            let before = procs::process_cpu_seconds(pid)?;
            let started = Instant::now();
            while count < SCRAPES_MIN || started.elapsed() < seconds {
                let t = Instant::now();
                bytes = bytes.max(scrape(&mut stream, &mut buf)?);
                slowest = slowest.max(t.elapsed());
                count += 1;
            }
            let wall = started.elapsed();
            let busy = procs::process_cpu_seconds(pid)? - before;
            let before = procs::process_cpu_seconds(pid)?;
            std::thread::sleep(wall);
            let idle = procs::process_cpu_seconds(pid)? - before;
            Ok(Scrapes {
                count,
                busy,
                idle,
                wall,
                bytes,
                slowest,
            })
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the scrape thread panicked"))?
    })
}

/// A server holding [`SCRAPE_KEYS`] keys, scraped for `--seconds`.
fn scrape_section(o: &Options, binary: &Path, doc: &mut Doc) -> Result<()> {
    let mut server = procs::start_ringstore(binary, MEMORY_MIB)?;
    doc.command(&server.command);
    let filled = Instant::now();
    eprintln!("bench: storing {SCRAPE_KEYS} keys of {SCRAPE_VALUE_LEN} B for the scrape");
    fill::preload(server.port, SCRAPE_VALUE_LEN, SCRAPE_KEYS)?;
    let items = fill::stat_u64(server.port, "curr_items")?;
    let fill_secs = filled.elapsed().as_secs_f64();
    eprintln!("bench: {} s of /metrics scrapes", o.seconds);
    let s = time_scrapes(&server, Duration::from_secs(o.seconds))?;
    server.check_alive()?;
    let count = s.count;
    let per_ms = (s.busy - s.idle).max(0.0) / count as f64 * 1000.0;
    let kib = s.bytes as f64 / 1024.0;
    doc.targets.push(format!(
        "/metrics scrape of a server holding {items} keys: {per_ms:.3} ms server CPU (goal ≤ {SCRAPE_CPU_GOAL_MS} ms) {}; answer {kib:.1} KiB (goal < 64 KiB) {}",
        mark(per_ms <= SCRAPE_CPU_GOAL_MS),
        mark(s.bytes < SCRAPE_BYTES_GOAL)
    ));
    if items < SCRAPE_KEYS as u64 {
        doc.note(format!(
            "scrape: the server holds {items} of the {SCRAPE_KEYS} keys stored"
        ));
    }
    doc.command(&format!(
        "scrape: {SCRAPE_KEYS} pipelined `set` of {SCRAPE_VALUE_LEN} B, then one thread pinned to CPU {} sends `GET /metrics` one after another for --seconds (at least {SCRAPES_MIN} of them) on one kept-alive connection; server CPU = utime + stime of every server thread (/proc/PID/stat) over the scrapes less the same over an idle stretch as long",
        procs::CLIENT_CPU
    ));
    let tick_ms = 1000.0 / procs::ticks_per_second();
    doc.sections.push(format!(
        "## metrics: one /metrics scrape of a server holding {items} keys\n\n\
         | metric | value |\n| --- | ---: |\n\
         | server CPU per scrape (ms) | {per_ms:.3} |\n\
         | answer (KiB) | {kib:.1} |\n\
         | scrapes | {count} in {:.2} s, slowest {:.2} ms |\n\
         | server CPU scraping / idle as long (ms) | {:.0} / {:.0} (clock tick {tick_ms:.0} ms) |\n\
         | keys stored in | {fill_secs:.1} s |\n",
        s.wall.as_secs_f64(),
        s.slowest.as_secs_f64() * 1000.0,
        s.busy * 1000.0,
        s.idle * 1000.0,
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers each request head on one connection with the next of `answers`,
    /// each written in two pieces (an answer need not arrive in one read).
    fn answering(answers: Vec<Vec<u8>>) -> (u16, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            for answer in answers {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    assert_eq!(conn.read(&mut byte).expect("read"), 1);
                    head.push(byte[0]);
                }
                assert!(head.starts_with(b"GET /metrics HTTP/1.1\r\n"));
                let (a, b) = answer.split_at(answer.len() / 2);
                conn.write_all(a).expect("write");
                conn.flush().expect("flush");
                std::thread::sleep(Duration::from_millis(5));
                conn.write_all(b).expect("write");
            }
        });
        (port, server)
    }

    #[test]
    fn a_scrape_reads_one_whole_answer_and_returns_its_body_length() {
        let body = "# TYPE memcached_up gauge\nmemcached_up 1\n".repeat(3000);
        let ok = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let refused = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_vec();
        let (port, server) = answering(vec![ok.clone().into_bytes(), ok.into_bytes(), refused]);
        let mut stream = fill::connect(port).expect("connect");
        let mut buf = Vec::new();
        for _ in 0..2 {
            assert_eq!(scrape(&mut stream, &mut buf).expect("scrape"), body.len());
        }
        let err = scrape(&mut stream, &mut buf).expect_err("a 401 fails");
        assert!(err.to_string().contains("401"), "{err}");
        server.join().expect("server");
    }
}
