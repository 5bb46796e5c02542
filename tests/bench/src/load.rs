//! `ringstore-bench load`: the load generator (client/) by hand against a server already
//! running on loopback, for quick checks outside `cargo xtask bench` (which pins the servers,
//! paces and compares): one cell, closed loop, one line of results.
//!
//! `ringstore-bench load --port 11211 --op get --value-len 32 --conns 4 --depth 1 --secs 5`
//! (`--keys N`: the keyspace, preloaded first for the GET ops; `--pid P`: the server process
//! whose CPU time is reported). Prints ops, ops/s, p50/p99 µs, misses, errors (and the
//! server's CPU seconds with `--pid`).

use super::client::{self, LoadSpec, Mode};
use super::fill;
use super::mcwire::Op;
use anyhow::{bail, Context, Result};
use std::time::Duration;

/// What `load` was asked for.
struct Args {
    spec: LoadSpec,
    op: Op,
    value_len: usize,
    pid: Option<u32>,
}

fn parse_args(argv: &[String]) -> Result<Args> {
    let (mut port, mut op, mut value_len) = (11211u16, Op::Get, 32usize);
    let (mut conns, mut depth, mut secs, mut keys) = (4usize, 1usize, 5u64, 1000usize);
    let mut pid = None;
    for pair in argv.chunks(2) {
        let [flag, value] = pair else {
            bail!("{}: missing value", pair[0]);
        };
        let number = || {
            value
                .parse::<usize>()
                .with_context(|| format!("{flag} {value}"))
        };
        match flag.as_str() {
            "--port" => port = value.parse().with_context(|| format!("--port {value}"))?,
            "--op" => {
                op = Op::from_token(value)
                    .with_context(|| format!("--op {value}: one of {}", Op::tokens()))?
            }
            "--value-len" => value_len = number()?,
            "--conns" => conns = number()?,
            "--depth" => depth = number()?,
            "--secs" => secs = value.parse().with_context(|| format!("--secs {value}"))?,
            "--keys" => keys = number()?,
            "--pid" => pid = Some(value.parse().with_context(|| format!("--pid {value}"))?),
            other => bail!("load: unknown flag {other}"),
        }
    }
    let measure = Duration::from_secs(secs);
    let spec = LoadSpec {
        port,
        mode: Mode::Memcache { op, value_len },
        depth,
        conns,
        keyspace: keys,
        warmup: Duration::from_secs(1),
        measure,
        slices: 1,
        // Without --pid the CPU read is this process's own, and not printed.
        server_pid: pid.unwrap_or_else(std::process::id),
    };
    Ok(Args {
        spec,
        op,
        value_len,
        pid,
    })
}

/// `ringstore-bench load ARGS`: prints one line (see the top of this file).
pub fn main(argv: &[String]) -> Result<()> {
    let a = parse_args(argv)?;
    if a.op != Op::Set {
        fill::preload(a.spec.port, a.value_len, a.spec.keyspace)?;
    }
    let r = client::run(std::slice::from_ref(&a.spec))?
        .pop()
        .context("one result")?;
    println!(
        "op={} value_len={} conns={} depth={} ops={} ops_per_sec={:.0} p50_us={:.1} p99_us={:.1} misses={} errors={}{}",
        a.op.name(),
        a.value_len,
        a.spec.conns,
        a.spec.depth,
        r.requests,
        r.throughput(),
        r.p50_us(),
        r.p99_us(),
        r.misses,
        r.errors,
        match a.pid {
            Some(_) => format!(" server_cpu_s={:.3}", r.server_cpu_seconds),
            None => String::new(),
        }
    );
    Ok(())
}
