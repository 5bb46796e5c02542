//! `cargo xtask test`: every test the project has, in order from fastest to slowest.
//!
//! Steps: format and lint, unit/property/integration tests, a fuzz smoke run of every
//! target, `memccapable` (ascii and binary) against the release binary, end-to-end tests with real clients
//! (pymemcache, curl), and the QEMU tests that boot the real image.

use crate::deps;
use crate::util::{cargo, exec, root};
use anyhow::{Context, Result};
use std::process::Command;
use std::time::{Duration, Instant};

/// Seconds each fuzz target runs in the smoke step.
const FUZZ_SMOKE_SECS: u32 = 20;

/// Options of `cargo xtask test`.
#[derive(Debug, Default)]
struct Options {
    /// Skip the slow steps (fuzz smoke, QEMU).
    quick: bool,
    /// Skip only the QEMU tests.
    skip_vm: bool,
}

fn run_steps(opts: &Options) -> Result<()> {
    let started = Instant::now();
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    let mut step = |name: &'static str, f: &dyn Fn() -> Result<()>| -> Result<()> {
        eprintln!("\n=== {name} ===");
        let t = Instant::now();
        f().with_context(|| format!("step {name:?} failed"))?;
        timings.push((name, t.elapsed()));
        Ok(())
    };
    step("install dependencies", &deps::all)?;
    step("format", &|| {
        exec(cargo().args(["fmt", "--all", "--check"]))
    })?;
    step("clippy", &|| {
        exec(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("unit, property and integration tests", &|| {
        exec(cargo().args(["test", "--workspace", "--release"]))
    })?;
    // Not in the default build: the runtime's ExaNIC backend against its libexanic test
    // double (ADR 0021), linted and tested with the feature on.
    step("ExaNIC backend (feature exanic, test double)", &|| {
        exec(cargo().args([
            "clippy",
            "-p",
            "ringstore-runtime",
            "--features",
            "exanic",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
        exec(cargo().args([
            "test",
            "-p",
            "ringstore-runtime",
            "--release",
            "--features",
            "exanic",
            "--lib",
            "datapath",
        ]))
    })?;
    if !opts.quick {
        step("fuzz smoke", &fuzz_smoke)?;
    }
    step("memccapable (ascii and binary)", &|| {
        memccapable("io_uring")
    })?;
    step("memccapable on the epoll runtime", &|| memccapable("epoll"))?;
    step("end-to-end (pymemcache, curl)", &|| end_to_end(None))?;
    // The whole suite again on the readiness runtime (ADR 0033): the fixtures pass
    // `--io epoll` to every server they start; what that runtime refuses is skipped.
    step("end-to-end on the epoll runtime", &|| {
        end_to_end(Some("epoll"))
    })?;
    step(
        "container image (cargo xtask oci, podman)",
        &crate::oci::check,
    )?;
    if !opts.quick && !opts.skip_vm {
        step("QEMU appliance tests", &vm_tests)?;
    }
    eprintln!("\n=== summary ===");
    for (name, took) in &timings {
        eprintln!("{:>8.1}s  {name}", took.as_secs_f64());
    }
    eprintln!("{:>8.1}s  total", started.elapsed().as_secs_f64());
    // Every step above either passed or returned early with its error; what an option left
    // out is said, not silently absent.
    let left_out = match (opts.quick, opts.skip_vm) {
        (true, _) => ", left out by --quick: fuzz smoke, QEMU appliance tests",
        (false, true) => ", left out by --skip-vm: QEMU appliance tests",
        (false, false) => "",
    };
    println!("steps: {} passed, 0 failed{left_out}", timings.len());
    Ok(())
}

pub fn run(args: &[String]) -> Result<()> {
    run_steps(&parse_test_options(args)?)
}

#[cfg(test)]
pub(crate) fn parse_options(args: &[String]) -> Result<()> {
    parse_test_options(args).map(|_| ())
}

fn parse_test_options(args: &[String]) -> Result<Options> {
    let mut opts = Options::default();
    for (flag, _) in crate::cli::parse("test", args)?.flags {
        match flag {
            "--quick" => opts.quick = true,
            "--skip-vm" => opts.skip_vm = true,
            other => return Err(crate::cli::unhandled("test", other)),
        }
    }
    Ok(opts)
}

/// The release `ringstore` binary for the host (built once, used by memccapable and e2e).
pub fn release_binary() -> Result<std::path::PathBuf> {
    exec(cargo().args(["build", "--release", "-p", "ringstore"]))?;
    Ok(root().join("target/release/ringstore"))
}

fn fuzz_smoke() -> Result<()> {
    let fuzz_dir = root().join("fuzz");
    let list = Command::new("cargo")
        .args(["+nightly", "fuzz", "list"])
        .current_dir(&fuzz_dir)
        .output()
        .context("cargo fuzz list")?;
    let targets = String::from_utf8_lossy(&list.stdout).to_string();
    anyhow::ensure!(
        !targets.trim().is_empty(),
        "no fuzz targets found in {}",
        fuzz_dir.display()
    );
    for target in targets.lines().map(str::trim).filter(|t| !t.is_empty()) {
        exec(
            Command::new("cargo")
                .args([
                    "+nightly",
                    "fuzz",
                    "run",
                    target,
                    "--",
                    &format!("-max_total_time={FUZZ_SMOKE_SECS}"),
                ])
                .current_dir(&fuzz_dir),
        )?;
    }
    Ok(())
}

/// memccapable (text and binary) against a server on I/O runtime `io` (`--io`).
fn memccapable(io: &str) -> Result<()> {
    let binary = release_binary()?;
    let server = crate::util::Server::start(&binary, &["--io", io])?;
    let (host, port) = server.memcache_host_port()?;
    let out = Command::new("memccapable")
        .args(["-t", "5", "-h", &host, "-p", &port.to_string()])
        .output()
        .context("running memccapable")?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprint!("{text}");
    anyhow::ensure!(
        out.status.success() && text.contains("All tests passed") && !text.contains("[fail]"),
        "memccapable did not pass every test"
    );
    Ok(())
}

/// The e2e suite; with `io`, every server the fixtures start runs that I/O runtime
/// (`RINGSTORE_IO`, passed as `--io`).
fn end_to_end(io: Option<&str>) -> Result<()> {
    let binary = release_binary()?;
    let python = deps::python_env()?;
    let mut pytest = Command::new(python);
    if let Some(io) = io {
        pytest.env("RINGSTORE_IO", io);
    }
    exec(
        pytest
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e"])
            .env("RINGSTORE_BIN", &binary)
            // tests/e2e/test_scaleout.py runs `xtask scaleout` through the binary running now.
            .env("XTASK_BIN", std::env::current_exe()?)
            .current_dir(root()),
    )
}

fn vm_tests() -> Result<()> {
    crate::vm_test::run(&[])
}
