//! The HTTP part: GET of each value size and depth against nginx with wrk, in A B B A halves.

use super::cells::{cell_name, DEPTHS, VALUE_LENS};
use super::cpu_table::{cpu_row, CPU_TABLE_HEAD};
use super::doc::{mark, Doc};
use super::http;
use super::http::WrkRun;
use super::mcwire::Op;
use super::options::Options;
use super::procs::{self, Pinned};
use super::report::{Better, Table};
use super::subject::Subject;
use anyhow::{Context, Result};
use std::path::Path;

/// nginx against the subject over HTTP GET.
pub(super) fn http_part(
    o: &Options,
    subject: &Subject,
    out_dir: &Path,
    doc: &mut Doc,
) -> Result<()> {
    let dir = out_dir.join("nginx");
    let port = procs::free_port()?;
    let conf = http::write_nginx_site(&dir, port, &VALUE_LENS)?;
    let mut nginx = procs::start_nginx(&conf, &dir, port)?;
    doc.command(&nginx.command);
    doc.command(&format!("(nginx.conf: {})", conf.display()));
    let name = subject.http_name();
    let mut subj = start_subject(subject, out_dir, doc);
    let mut table = Table::new("nginx", name);
    let mut cpu = String::from(CPU_TABLE_HEAD);
    for depth in DEPTHS {
        for value_len in VALUE_LENS {
            let cell = format!("HTTP {}", cell_name(Op::Get, value_len, depth));
            eprintln!("bench: {cell}");
            // A B B A halves, so background load hits both servers alike.
            let half = o.seconds.div_ceil(2);
            let mut b = http::run_wrk(&mut nginx, port, value_len, depth, o.conns, half, out_dir)
                .with_context(|| format!("{cell} against nginx"))?;
            doc.command(&b.command);
            let mut s = None;
            if let Some((server, p)) = subj.as_mut() {
                let p = *p;
                let both = http::run_wrk(server, p, value_len, depth, o.conns, half, out_dir)
                    .and_then(|mut first| {
                        first.merge(&http::run_wrk(
                            server, p, value_len, depth, o.conns, half, out_dir,
                        )?);
                        Ok(first)
                    });
                match both {
                    Ok(r) => s = Some(r),
                    Err(e) => {
                        doc.note(format!("{cell}: {name} failed: {e:#}"));
                        if server.check_alive().is_err() {
                            subj = None;
                        }
                    }
                }
            }
            b.merge(
                &http::run_wrk(&mut nginx, port, value_len, depth, o.conns, half, out_dir)
                    .with_context(|| format!("{cell} against nginx"))?,
            );
            record_cell(&mut table, &mut cpu, doc, &cell, name, &b, s.as_ref());
        }
    }
    let mut section =
        String::from("## HTTP GET (one server core each, wrk -t1 on the other core)\n\n");
    section.push_str(&table.markdown());
    section.push('\n');
    section.push_str(&cpu);
    section.push_str("\nEach server ran twice for half the time, in the order nginx, ringstore, ringstore, nginx; percentiles are the mean of the two runs. wrk measures latency per pipelined batch (from its send to its last response).\n");
    doc.sections.push(section);
    Ok(())
}

/// The subject, started and given an object of each size (ringstore), or a second nginx;
/// `None` (and a note) if it does not start.
fn start_subject(subject: &Subject, out_dir: &Path, doc: &mut Doc) -> Option<(Pinned, u16)> {
    let name = subject.http_name();
    let started = match subject {
        Subject::Ringstore(binary) => procs::start_ringstore(binary, 256).and_then(|s| {
            let http_port = s.http_port.context("no http port")?;
            for len in VALUE_LENS {
                http::put_object(http_port, len)?;
            }
            Ok((s, http_port))
        }),
        Subject::Baseline => (|| {
            let dir2 = out_dir.join("nginx2");
            let port2 = procs::free_port()?;
            let conf2 = http::write_nginx_site(&dir2, port2, &VALUE_LENS)?;
            Ok((procs::start_nginx(&conf2, &dir2, port2)?, port2))
        })(),
    };
    match started {
        Ok((s, port)) => {
            doc.command(&s.command);
            Some((s, port))
        }
        Err(e) => {
            doc.note(format!(
                "{name} (HTTP) did not start or take the PUTs: {e:#}"
            ));
            None
        }
    }
}

/// One cell's rows: throughput, latencies and CPU per request in `table`, CPU use in `cpu`,
/// and its targets against nginx.
fn record_cell(
    table: &mut Table,
    cpu: &mut String,
    doc: &mut Doc,
    cell: &str,
    name: &str,
    b: &WrkRun,
    s: Option<&WrkRun>,
) {
    table.row(
        &format!("{cell}: throughput (req/s)"),
        b.requests_per_second,
        s.map(|r| r.requests_per_second),
        Better::Higher,
        0,
    );
    table.row(
        &format!("{cell}: p50 latency (µs)"),
        b.p50_us,
        s.map(|r| r.p50_us),
        Better::Lower,
        1,
    );
    table.row(
        &format!("{cell}: p99 latency (µs)"),
        b.p99_us,
        s.map(|r| r.p99_us),
        Better::Lower,
        1,
    );
    table.row(
        &format!("{cell}: server CPU s / M req"),
        b.server_cpu_per_million(),
        s.map(|r| r.server_cpu_per_million()),
        Better::Lower,
        2,
    );
    for (who, r) in [("nginx", Some(b)), (name, s)] {
        if let Some(r) = r {
            cpu_row(
                cpu,
                cell,
                who,
                r.server_cpu_percent,
                r.server_core,
                r.client_cpu_percent,
                r.client_core,
            );
        }
    }
    if let Some(s) = s {
        let tput = s.requests_per_second / b.requests_per_second;
        let p99 = s.p99_us / b.p99_us;
        let p99_text = if p99.is_finite() {
            format!("{p99:.2}× {}", mark(p99 <= 1.0))
        } else {
            "n/a".to_string()
        };
        doc.targets.push(format!(
            "{cell}: throughput {tput:.2}× nginx (target ≥ 1.0×) {}; p99 {p99_text} (target ≤ 1.0×)",
            mark(tput >= 1.0)
        ));
    }
}
