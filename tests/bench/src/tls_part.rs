//! The TLS part (issue 19): memcache GET/SET over TLS against memcached `-Z` (and ringstore's
//! own plaintext port in the same run), handshakes per server CPU-second, and HTTPS GET
//! against nginx, all on one certificate generated for the run and one cipher suite.

use super::cells::{cell_name, keyspace, DEPTHS, VALUE_LENS};
use super::client::{self, LoadResult as Measured, LoadSpec, Mode};
use super::doc::{mark, Doc};
use super::mcwire::Op;
use super::options::Options;
use super::procs::{self, Pinned};
use super::subject::Subject;
use super::tls_handshake::{self, Handshakes, HS_THREADS};
use super::tls_wire::{Wire, SUITE};
use super::{fill, http, WARMUP};
use anyhow::{bail, Context, Result};
use ringstore_testkit::tls::{client_config, self_signed_command};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// HTTPS object sizes.
const HTTPS_LENS: [usize; 2] = [1024, 1 << 20];
/// Connections of the HTTPS cells (1 MiB responses: fewer in flight than the memcache cells).
const HTTPS_CONNS: usize = 16;

/// A self-signed ECDSA P-256 certificate for `localhost`/127.0.0.1 in `dir`, made with the
/// openssl CLI for this run (nothing committed): `(cert.pem, key.pem)`.
fn make_certificate(dir: &Path, doc: &mut Doc) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let mut cmd = self_signed_command(&cert, &key, "localhost", 2);
    doc.command(&procs::command_line(&cmd));
    crate::util::exec(&mut cmd).context("openssl req (apt install openssl)")?;
    Ok((cert, key))
}

/// Whether this memcached was built with TLS (`-Z`).
fn memcached_has_tls() -> bool {
    std::process::Command::new("memcached")
        .arg("-h")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--enable-ssl"))
}

/// The servers of the memcache and handshake cells.
struct McServers {
    memcached: Pinned,
    ringstore: Pinned,
    ringstore_tls: u16,
}

fn start_mc_servers(binary: &Path, cert: &Path, key: &Path, doc: &mut Doc) -> Result<McServers> {
    let plain = procs::free_port()?;
    let memcached = procs::start_memcached_tls(1024, cert, key, plain)?;
    doc.command(&memcached.command);
    let (cert_s, key_s) = (cert.to_string_lossy(), key.to_string_lossy());
    let ringstore = procs::start_ringstore_with(
        binary,
        1024,
        &[
            "--memcache-tls",
            "127.0.0.1:0",
            "--tls-cert",
            &cert_s,
            "--tls-key",
            &key_s,
        ],
    )?;
    doc.command(&ringstore.command);
    let ringstore_tls = ringstore.endpoint("memcache_tls")?;
    for len in VALUE_LENS {
        fill::preload(plain, len, keyspace(len)).context("preloading memcached")?;
        fill::preload(ringstore.port, len, keyspace(len)).context("preloading ringstore")?;
    }
    Ok(McServers {
        memcached,
        ringstore,
        ringstore_tls,
    })
}

/// One server endpoint of a cell.
struct Target {
    port: u16,
    /// `None`: plain TCP.
    tls: Option<Arc<rustls::ClientConfig>>,
    server_pid: u32,
}

/// The load of one cell (the same against every target).
struct Load {
    wire: Wire,
    depth: usize,
    conns: usize,
    warmup: Duration,
    measure: Duration,
    slices: u32,
}

fn load(o: &Options, wire: Wire, depth: usize, conns: usize) -> Load {
    Load {
        wire,
        depth,
        conns,
        warmup: WARMUP,
        measure: Duration::from_secs(o.seconds),
        slices: o.seconds.clamp(2, 10) as u32,
    }
}

/// Runs `load` against every target in alternating slices (the load generator's TLS mode).
fn run(targets: &[Target], load: &Load) -> Result<Vec<Measured>> {
    let specs: Vec<LoadSpec> = targets
        .iter()
        .map(|t| LoadSpec {
            port: t.port,
            mode: Mode::Tls {
                wire: load.wire.clone(),
                config: t.tls.clone(),
            },
            depth: load.depth,
            conns: load.conns,
            keyspace: load.wire.keyspace(),
            warmup: load.warmup,
            measure: load.measure,
            slices: load.slices,
            server_pid: t.server_pid,
        })
        .collect();
    client::run(&specs)
}

const MC_HEAD: &str = "| cell | memcached -Z req/CPU-s | ringstore TLS req/CPU-s | ratio (goal ≥ 1.3×) | ringstore plain req/CPU-s | TLS cost (plain / TLS, goal ≤ 1.25× at depth 16) | throughput req/s (memcached, TLS, plain) | p99 µs (memcached, TLS, plain) | server CPU % (memcached, TLS, plain) | client CPU % |
| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |
";

fn triple(r: &[Measured], f: impl Fn(&Measured) -> f64) -> String {
    r.iter()
        .map(|m| format!("{:.0}", f(m)))
        .collect::<Vec<_>>()
        .join(" / ")
}

/// One memcache cell's table row, target lines and error notes.
fn mc_row(out: &mut String, doc: &mut Doc, cell: &str, depth: usize, r: &[Measured]) {
    let [m, t, p] = r else { return };
    let ratio = t.per_cpu_second() / m.per_cpu_second();
    let cost = p.per_cpu_second() / t.per_cpu_second();
    let _ = writeln!(
        out,
        "| {cell} | {:.0} | {:.0} | {ratio:.2}× | {:.0} | {cost:.2}× | {} | {} | {} | {} |",
        m.per_cpu_second(),
        t.per_cpu_second(),
        p.per_cpu_second(),
        triple(r, Measured::throughput),
        triple(r, |m| m.hist.quantile(0.99) as f64 / 1e3),
        triple(r, |m| 100.0 * m.server_cpu_seconds / m.seconds.max(1e-9)),
        triple(r, |m| 100.0 * m.client_cpu_seconds / m.seconds.max(1e-9)),
    );
    let mut line = format!(
        "TLS {cell}: {ratio:.2}× memcached -Z requests per server CPU-second (goal ≥ 1.3×) {}",
        mark(ratio >= 1.3)
    );
    if depth == 16 {
        let _ = write!(
            line,
            "; TLS cost {cost:.2}× ringstore plaintext (goal ≤ 1.25×) {}",
            mark(cost <= 1.25)
        );
    }
    doc.targets.push(line);
    for (who, m) in ["memcached -Z", "ringstore TLS", "ringstore plain"]
        .iter()
        .zip(r)
    {
        if m.errors > 0 {
            doc.note(format!(
                "TLS {cell}: {who} answered {} unexpected replies",
                m.errors
            ));
        }
    }
}

fn mc_cells(
    o: &Options,
    s: &McServers,
    cert: &Path,
    out: &mut String,
    doc: &mut Doc,
) -> Result<()> {
    let config = client_config(cert, None, true)?;
    let targets = [
        Target {
            port: s.memcached.port,
            tls: Some(config.clone()),
            server_pid: s.memcached.pid(),
        },
        Target {
            port: s.ringstore_tls,
            tls: Some(config),
            server_pid: s.ringstore.pid(),
        },
        Target {
            port: s.ringstore.port,
            tls: None,
            server_pid: s.ringstore.pid(),
        },
    ];
    out.push_str(MC_HEAD);
    for op in [Op::Get, Op::Set] {
        for depth in DEPTHS {
            for value_len in VALUE_LENS {
                let cell = cell_name(op, value_len, depth);
                eprintln!("bench: TLS {cell}: memcached -Z, ringstore TLS, ringstore plain");
                let wire = Wire::Memcache {
                    op,
                    value_len,
                    keyspace: keyspace(value_len),
                };
                let r = run(&targets, &load(o, wire, depth, o.conns))
                    .with_context(|| format!("TLS {cell}"))?;
                mc_row(out, doc, &cell, depth, &r);
            }
        }
    }
    Ok(())
}

fn hs_cells(
    o: &Options,
    s: &McServers,
    cert: &Path,
    out: &mut String,
    doc: &mut Doc,
) -> Result<()> {
    out.push_str("\n| handshakes | memcached -Z per CPU-s | ringstore per CPU-s | ratio (goal ≥ 1.5×) | resumed % (memcached, ringstore) | handshakes/s (memcached, ringstore) | server CPU % (memcached, ringstore) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    let targets = [
        (s.memcached.port, s.memcached.pid()),
        (s.ringstore_tls, s.ringstore.pid()),
    ];
    for (kind, resume) in [("full", false), ("resumed", true)] {
        eprintln!("bench: TLS handshakes ({kind}): memcached -Z, ringstore");
        let config = client_config(cert, None, resume)?;
        let measure = Duration::from_secs(o.seconds);
        let r = tls_handshake::run(&targets, &config, WARMUP, measure)?;
        let [m, t] = r.as_slice() else {
            bail!("two results")
        };
        let ratio = t.per_cpu_second() / m.per_cpu_second();
        let both = |f: &dyn Fn(&Handshakes) -> f64| format!("{:.0} / {:.0}", f(m), f(t));
        let _ = writeln!(
            out,
            "| {kind} | {:.0} | {:.0} | {ratio:.2}× | {} | {} | {} |",
            m.per_cpu_second(),
            t.per_cpu_second(),
            both(&Handshakes::resumed_percent),
            both(&|h| h.done as f64 / h.seconds.max(1e-9)),
            both(&|h| 100.0 * h.server_cpu_seconds / h.seconds.max(1e-9)),
        );
        doc.targets.push(format!(
            "TLS handshakes ({kind}): {ratio:.2}× memcached -Z per server CPU-second (goal ≥ 1.5×) {}",
            mark(ratio >= 1.5)
        ));
        if m.errors + t.errors > 0 {
            doc.note(format!(
                "TLS handshakes ({kind}): {} failed against memcached, {} against ringstore",
                m.errors, t.errors
            ));
        }
    }
    Ok(())
}

/// HTTPS GET against nginx with TLS on the same certificate.
fn https_cells(
    o: &Options,
    binary: &Path,
    cert: &Path,
    key: &Path,
    out_dir: &Path,
    out: &mut String,
    doc: &mut Doc,
) -> Result<()> {
    if !crate::util::have("nginx") {
        doc.note(
            "TLS: HTTPS cells skipped: nginx is not installed (apt install nginx-light)".into(),
        );
        return Ok(());
    }
    let dir = out_dir.join("nginx-tls");
    let port = procs::free_port()?;
    let conf = http::write_nginx_site_tls(&dir, port, &HTTPS_LENS, Some((cert, key)))?;
    let nginx = procs::start_nginx(&conf, &dir, port)?;
    doc.command(&nginx.command);
    let (cert_s, key_s) = (cert.to_string_lossy(), key.to_string_lossy());
    let ringstore = procs::start_ringstore_with(
        binary,
        1024,
        &[
            "--https",
            "127.0.0.1:0",
            "--tls-cert",
            &cert_s,
            "--tls-key",
            &key_s,
        ],
    )?;
    doc.command(&ringstore.command);
    let https = ringstore.endpoint("https")?;
    let http_port = ringstore
        .http_port
        .context("ringstore without an HTTP port")?;
    for len in HTTPS_LENS {
        http::put_object(http_port, len)?;
    }
    let config = client_config(cert, Some(b"http/1.1"), true)?;
    let targets = [
        Target {
            port,
            tls: Some(config.clone()),
            server_pid: nginx.pid(),
        },
        Target {
            port: https,
            tls: Some(config),
            server_pid: ringstore.pid(),
        },
    ];
    out.push_str("\n| HTTPS GET | nginx req/CPU-s | ringstore req/CPU-s | ratio (goal ≥ 1.2×) | throughput req/s (nginx, ringstore) | p99 µs (nginx, ringstore) | server CPU % (nginx, ringstore) | client CPU % |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for len in HTTPS_LENS {
        let cell = cell_name(Op::Get, len, 1);
        eprintln!("bench: HTTPS {cell}: nginx, ringstore");
        let wire = Wire::HttpGet {
            path: http::object_path(len),
        };
        let r = run(&targets, &load(o, wire, 1, HTTPS_CONNS))
            .with_context(|| format!("HTTPS {cell}"))?;
        let [n, t] = r.as_slice() else {
            bail!("two results")
        };
        let ratio = t.per_cpu_second() / n.per_cpu_second();
        let _ = writeln!(
            out,
            "| {cell} | {:.0} | {:.0} | {ratio:.2}× | {} | {} | {} | {} |",
            n.per_cpu_second(),
            t.per_cpu_second(),
            triple(&r, Measured::throughput),
            triple(&r, |m| m.hist.quantile(0.99) as f64 / 1e3),
            triple(&r, |m| 100.0 * m.server_cpu_seconds / m.seconds.max(1e-9)),
            triple(&r, |m| 100.0 * m.client_cpu_seconds / m.seconds.max(1e-9)),
        );
        doc.targets.push(format!(
            "HTTPS {cell}: {ratio:.2}× nginx requests per server CPU-second (goal ≥ 1.2×) {}",
            mark(ratio >= 1.2)
        ));
        if n.errors + t.errors > 0 {
            doc.note(format!(
                "HTTPS {cell}: {} bad responses from nginx, {} from ringstore",
                n.errors, t.errors
            ));
        }
    }
    Ok(())
}

pub(super) fn tls_part(
    o: &Options,
    subject: &Subject,
    out_dir: &Path,
    doc: &mut Doc,
) -> Result<()> {
    let Subject::Ringstore(binary) = subject else {
        doc.note("TLS part skipped under --self-check".into());
        return Ok(());
    };
    let (cert, key) = make_certificate(&out_dir.join("tls"), doc)?;
    let mut out =
        format!("## TLS (issue 19): {SUITE}; one server core each, the client on the other\n\n");
    if memcached_has_tls() {
        let servers = start_mc_servers(binary, &cert, &key, doc)?;
        mc_cells(o, &servers, &cert, &mut out, doc)?;
        hs_cells(o, &servers, &cert, &mut out, doc)?;
    } else {
        doc.note(
            "TLS: memcache and handshake cells skipped: this memcached has no TLS (-Z)".into(),
        );
    }
    https_cells(o, binary, &cert, &key, out_dir, &mut out, doc)?;
    let _ = write!(
        out,
        "\nreq/CPU-s: requests completed per second of the server process's CPU time (utime + stime). Load generator: tests/bench/src/client/ (TLS mode), one thread pinned to CPU {} with one io_uring, rustls' buffered ClientConnection, {} connections (HTTPS: {HTTPS_CONNS}), servers measured in alternating slices with every connection open (handshakes before the measured window). Handshakes: tests/bench/src/tls_handshake.rs, {HS_THREADS} client threads pinned to CPU {}, each connection handshake + `version` + close_notify.\n",
        procs::CLIENT_CPU,
        o.conns,
        procs::CLIENT_CPU
    );
    doc.sections.push(out);
    Ok(())
}
