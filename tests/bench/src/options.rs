//! `cargo xtask bench` arguments: the usage text, the parts to run, and the parsed options.

use super::cells::parse_cell;
use super::icount::BaselineUse;
use super::mcwire::Op;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

const USAGE: &str =
    "usage: cargo xtask bench [--seconds N] [--only memcache|tail|http|memory|durable|udp|icount|cores|tls|metrics] [--binary PATH]
                         [--conns N] [--self-check] [--cells get-100-1,set-4096-16,...]
                         [--compare-binary PATH] [--io RUNTIME] [--sub-memory]
                         [--icount-check | --icount-record] [--icount-args FLAGS]

  --seconds N    measured seconds per cell, after 1 s of warm-up (default 5; durable: at most 10)
  --only PART    run one part: memcache (GET/SET vs memcached), http (GET vs nginx), memory,
                 tail (GET/SET 100 B, depth 1, 64 connections, each server paced open loop at
                 70% of its own closed-loop peak: p50/p99/p99.9 from the scheduled send times),
                 durable (SET with --data on disk and tmpfs vs RAM only; recovery of 1M objects),
                 udp (UDP GET over veth: memcached -U, kernel UDP, AF_XDP; needs root),
                 icount (user-space instructions per request under valgrind's callgrind,
                 ringstore and memcached -t 1, GET/SET 100 B at depth 1 and 16; needs valgrind)
                 cores (GET/SET 100 B at depth 16 with 1, 2, 4, 8, 16 server workers: ringstore
                 --cores N and memcached -t N, one client CPU per four server CPUs; the
                 widths that need more CPUs than the machine has are skipped with a note)
                 tls (issue 19: memcache GET/SET over TLS vs memcached -Z and ringstore
                 plaintext, full and resumed handshakes, HTTPS GET 1 KiB and 1 MiB vs nginx)
                 metrics (issue 33: GET/SET 100 B at depth 16 on the same binary with the
                 latency histograms and hot-key sampling on, --latency-histograms off and
                 --hotkeys off in alternating slices; then --seconds of /metrics scrapes
                 of a server holding 1M keys: server CPU per scrape and the answer's size)
  --binary PATH  the ringstore binary (default: cargo build --release -p ringstore)
  --conns N      connections per load generator (default 50)
  --self-check   measure memcached (and nginx) against themselves: every ratio should be ~1.0
  --cells LIST   only these memcache cells (OP-VALUEBYTES-DEPTH), and no memaslap run. OP:
                 get, set (text), mg (`mg <key> v`), bget, bgetk (binary GET, GETK; these
                 three only when named, every reply must be a hit of the right length);
                 VALUEBYTES: 100, 4096, or (only when named) 16384, 102400, 524288; DEPTH: 1, 16
  --compare-binary PATH
                 memcache cells: this ringstore binary is the baseline instead of memcached
                 (e.g. the musl build against the glibc build)
  --io RUNTIME   the ringstore subject's --io in the memcache cells (auto, io_uring,
                 epoll; default: the server's default, auto); a list (io_uring,epoll) runs
                 the memcache part once per runtime in this run, each beside memcached
  --icount-check icount: fail the run when a function's instructions per request moved
                 against the recorded baseline (tests/bench/baseline/icount.tsv; the
                 comparison is reported in every icount run)
  --icount-record
                 icount: write this run's per-function counts as the baseline
  --icount-args FLAGS
                 icount: more serve flags for the ringstore under callgrind, one string
                 split at spaces (e.g. \"--latency-histograms off\"); implies --only icount;
                 not with --icount-record (the baseline is the default configuration's)
  --sub-memory   memcache cells: ringstore --numa 0 is the baseline and the subject is the same
                 binary with --sub-memory 256MiB --sub-memory-simulated on (issue 23: the score
                 keeping's cost on the GET path)
";

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Memcache,
    Tail,
    Http,
    Memory,
    Durable,
    /// The durable part's `--data-key` cell alone.
    Encryption,
    Udp,
    Icount,
    Cores,
    Tls,
    Metrics,
}

#[derive(Clone)]
pub(super) struct Options {
    pub(super) seconds: u64,
    pub(super) only: Option<Part>,
    pub(super) binary: Option<PathBuf>,
    pub(super) conns: usize,
    pub(super) self_check: bool,
    /// `--cells`: (op, value length, depth) to run; empty = all.
    pub(super) cells: Vec<(Op, usize, usize)>,
    /// `--compare-binary`: a second ringstore as the memcache baseline.
    pub(super) compare: Option<PathBuf>,
    /// `--io`: the ringstore subject's I/O runtime in the memcache cells (one; `run` splits
    /// a comma list into one memcache part per runtime).
    pub(super) io: Option<String>,
    /// `--sub-memory`: the memcache cells compare ringstore with and without sub memory.
    pub(super) sub_memory: bool,
    /// `--icount-check` / `--icount-record`: what the icount part does with its baseline.
    pub(super) icount: super::icount::BaselineUse,
    /// `--icount-args`: more flags for the icount part's ringstore.
    pub(super) icount_args: Vec<String>,
}

/// `--io`: one runtime or a comma list of them.
fn parse_io(value: String) -> Result<String> {
    for one in value.split(',') {
        if !matches!(one, "auto" | "io_uring" | "epoll") {
            bail!("--io {one:?}: expected auto, io_uring or epoll (or a list)");
        }
    }
    Ok(value)
}

fn parse_part(name: &str) -> Result<Part> {
    Ok(match name {
        "memcache" => Part::Memcache,
        "tail" => Part::Tail,
        "http" => Part::Http,
        "memory" => Part::Memory,
        "durable" => Part::Durable,
        "encryption" => Part::Encryption,
        "udp" => Part::Udp,
        "icount" => Part::Icount,
        "cores" => Part::Cores,
        "tls" => Part::Tls,
        "metrics" => Part::Metrics,
        other => bail!(
            "--only {other:?}: expected memcache, tail, http, memory, durable, encryption, udp, icount, cores, tls or metrics"
        ),
    })
}

/// `--icount-check` or `--icount-record`, not both.
fn icount_use(was: BaselineUse, want: BaselineUse) -> Result<BaselineUse> {
    if was != BaselineUse::Report && was != want {
        bail!("--icount-check and --icount-record exclude each other");
    }
    Ok(want)
}

pub(super) fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        seconds: 5,
        only: None,
        binary: None,
        conns: 50,
        self_check: false,
        cells: Vec::new(),
        compare: None,
        io: None,
        sub_memory: false,
        icount: BaselineUse::Report,
        icount_args: Vec::new(),
    };
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        std::process::exit(0);
    }
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{flag} needs a value\n\n{USAGE}"))
        };
        match flag.as_str() {
            "--seconds" => o.seconds = value()?.parse().context("--seconds")?,
            "--conns" => o.conns = value()?.parse().context("--conns")?,
            "--binary" => o.binary = Some(PathBuf::from(value()?)),
            "--compare-binary" => o.compare = Some(PathBuf::from(value()?)),
            "--io" => o.io = Some(parse_io(value()?)?),
            "--only" => o.only = Some(parse_part(&value()?)?),
            "--self-check" => o.self_check = true,
            "--sub-memory" => o.sub_memory = true,
            "--icount-check" => o.icount = icount_use(o.icount, BaselineUse::Check)?,
            "--icount-record" => o.icount = icount_use(o.icount, BaselineUse::Record)?,
            "--icount-args" => {
                o.icount_args = value()?.split_whitespace().map(String::from).collect();
            }
            "--cells" => {
                o.cells = value()?.split(',').map(parse_cell).collect::<Result<_>>()?;
            }
            other => bail!("unknown bench argument {other:?}\n\n{USAGE}"),
        }
    }
    if !(1..=60).contains(&o.seconds) || !(1..=1000).contains(&o.conns) {
        bail!("--seconds must be 1..=60 and --conns 1..=1000");
    }
    if !o.icount_args.is_empty() {
        if o.icount == BaselineUse::Record {
            bail!("--icount-args excludes --icount-record: the baseline is the default configuration's");
        }
        match o.only {
            None => o.only = Some(Part::Icount),
            Some(Part::Icount) => {}
            Some(_) => bail!("--icount-args applies to the icount part only"),
        }
    }
    if o.icount != BaselineUse::Report {
        match o.only {
            None => o.only = Some(Part::Icount),
            Some(Part::Icount) => {}
            Some(_) => bail!("--icount-check and --icount-record apply to the icount part only"),
        }
        if o.self_check {
            bail!("--icount-check and --icount-record measure ringstore, not --self-check");
        }
    }
    if o.sub_memory && (o.compare.is_some() || o.self_check) {
        bail!("--sub-memory excludes --compare-binary and --self-check");
    }
    if o.compare.is_some() || o.sub_memory {
        if o.self_check {
            bail!("--compare-binary and --self-check exclude each other");
        }
        match o.only {
            None => o.only = Some(Part::Memcache),
            Some(Part::Memcache) => {}
            Some(_) => bail!("--compare-binary and --sub-memory apply to the memcache cells only"),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_arguments() {
        let o = parse(&args(&[
            "--seconds",
            "3",
            "--only",
            "http",
            "--binary",
            "/x/ringstore",
        ]))
        .unwrap();
        assert_eq!(o.seconds, 3);
        assert!(o.only == Some(Part::Http));
        assert_eq!(o.binary.as_deref(), Some(Path::new("/x/ringstore")));
        assert_eq!(o.conns, 50);
        assert!(parse(&args(&["--only", "disk"])).is_err());
        assert!(parse(&args(&["--seconds"])).is_err());
        assert!(parse(&args(&["--seconds", "0"])).is_err());
        assert!(parse(&args(&["--bogus"])).is_err());
        let o = parse(&args(&["--cells", "get-100-1,SET-4096-16"])).unwrap();
        assert!(o.cells == [(Op::Get, 100, 1), (Op::Set, 4096, 16)]);
        assert!(parse(&args(&["--cells", "get-100-2"])).is_err());
        assert!(parse(&args(&["--cells", "del-100-1"])).is_err());
        let o = parse(&args(&["--cells", "mg-524288-1,bget-102400-1"])).unwrap();
        assert!(o.cells == [(Op::MetaGet, 524288, 1), (Op::BinGet, 102400, 1)]);
    }

    /// The flags the usage text documents (its lines that begin with `  --`).
    fn usage_flags() -> BTreeSet<String> {
        USAGE
            .lines()
            .filter_map(|l| l.strip_prefix("  --"))
            .filter_map(|l| l.split_whitespace().next())
            .map(|name| format!("--{name}"))
            .collect()
    }

    /// Every `--flag` `page` names on a line about `cargo xtask bench`.
    fn documented_flags(page: &str) -> BTreeSet<String> {
        let text = std::fs::read_to_string(ringstore_testkit::root().join(page)).unwrap();
        let flags = ringstore_testkit::docs::documented_flags(&text).into_iter();
        flags
            .filter(|(command, _)| command == "bench")
            .map(|(_, flag)| flag)
            .collect()
    }

    /// docs/REFERENCE.md lists every bench flag USAGE has and no other; README.md names none
    /// that USAGE lacks; the parser takes each.
    #[test]
    fn the_docs_usage_and_parser_agree_on_the_flags() {
        let usage = usage_flags();
        assert!(usage.len() >= 9, "{usage:?}");
        let reference = documented_flags("docs/REFERENCE.md");
        assert_eq!(reference, usage, "docs/REFERENCE.md's bench flags vs USAGE");
        let readme = documented_flags("README.md");
        assert!(
            readme.is_subset(&usage),
            "README.md's bench flags: {readme:?}"
        );
        for flag in &usage {
            let err = parse(std::slice::from_ref(flag))
                .err()
                .map(|e| e.to_string());
            assert!(
                !err.is_some_and(|e| e.contains("unknown bench argument")),
                "{flag} is in USAGE but the parser refuses it"
            );
        }
    }

    #[test]
    fn sub_memory_runs_the_memcache_cells_alone() {
        let o = parse(&args(&["--sub-memory", "--cells", "get-100-1"])).unwrap();
        assert!(o.sub_memory && o.only == Some(Part::Memcache));
        assert!(parse(&args(&["--sub-memory", "--self-check"])).is_err());
        assert!(parse(&args(&["--sub-memory", "--only", "http"])).is_err());
    }

    #[test]
    fn parses_durable_and_compare_binary() {
        assert!(parse(&args(&["--only", "durable"])).unwrap().only == Some(Part::Durable));
        assert!(parse(&args(&["--only", "encryption"])).unwrap().only == Some(Part::Encryption));
        assert!(parse(&args(&["--only", "icount"])).unwrap().only == Some(Part::Icount));
        let o = parse(&args(&["--icount-check"])).unwrap();
        assert!(o.only == Some(Part::Icount) && o.icount == BaselineUse::Check);
        let o = parse(&args(&["--only", "icount", "--icount-record"])).unwrap();
        assert!(o.icount == BaselineUse::Record);
        assert!(parse(&args(&["--icount-check", "--icount-record"])).is_err());
        assert!(parse(&args(&["--icount-check", "--only", "http"])).is_err());
        assert!(parse(&args(&["--icount-record", "--self-check"])).is_err());
        let o = parse(&args(&["--icount-args", "--latency-histograms off"])).unwrap();
        assert!(o.only == Some(Part::Icount));
        assert_eq!(o.icount_args, ["--latency-histograms", "off"]);
        assert!(parse(&args(&[
            "--icount-args",
            "--hotkeys off",
            "--icount-record"
        ]))
        .is_err());
        assert!(parse(&args(&["--icount-args", "--hotkeys off", "--only", "http"])).is_err());
        assert!(parse(&args(&["--only", "tls"])).unwrap().only == Some(Part::Tls));
        assert!(parse(&args(&["--only", "tail"])).unwrap().only == Some(Part::Tail));
        assert!(parse(&args(&["--only", "metrics"])).unwrap().only == Some(Part::Metrics));
        let o = parse(&args(&[
            "--compare-binary",
            "/t/x86_64-unknown-linux-musl/release/ringstore",
        ]))
        .unwrap();
        assert!(
            o.only == Some(Part::Memcache),
            "--compare-binary runs the memcache cells"
        );
        assert_eq!(
            o.compare.as_deref(),
            Some(Path::new("/t/x86_64-unknown-linux-musl/release/ringstore"))
        );
        assert!(parse(&args(&["--compare-binary", "/x", "--only", "http"])).is_err());
        assert!(parse(&args(&["--compare-binary", "/x", "--self-check"])).is_err());
    }
}
