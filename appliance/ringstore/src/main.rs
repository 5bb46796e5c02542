//! The `ringstore` binary: dispatches to `serve` (a host process) or `init` (PID 1 of the appliance).

#![forbid(unsafe_code)]

mod console;

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use ringstore_config::{Config, KEYS};
use ringstore_runtime::{RuntimeError, Server, TerminationSignals};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // PID 1 is the appliance's init, unless asked to serve: a container's entrypoint
    // (`/ringstore serve`, the OCI image of ADR 0034) is PID 1 of its namespace too.
    if std::process::id() == 1 && !is_container_serve(&args) {
        run_init();
    }
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("init") => run_init(),
        Some("console") => console::run(&args[1..]),
        Some("--version" | "-V" | "version") => {
            println!("ringstore {VERSION}");
            ExitCode::SUCCESS
        }
        Some("help" | "--help" | "-h") => {
            print!("{}", help());
            ExitCode::SUCCESS
        }
        None => {
            eprint!("{}", help());
            ExitCode::from(2)
        }
        Some(other) => {
            eprintln!("ringstore: unknown command {other:?}; try `ringstore help`");
            ExitCode::from(2)
        }
    }
}

/// `ringstore serve ...` (or `--version`, which a container probe asks): what a container runs
/// as its PID 1. The kernel starts the appliance's /init with no such first argument.
fn is_container_serve(args: &[String]) -> bool {
    matches!(
        args.first().map(String::as_str),
        Some("serve" | "--version")
    )
}

/// PID 1 of the appliance; never returns.
#[cfg(feature = "pid1")]
fn run_init() -> ! {
    ringstore_init::run()
}

#[cfg(not(feature = "pid1"))]
fn run_init() -> ! {
    eprintln!("ringstore: this binary was built without PID 1 support (feature `pid1`)");
    std::process::exit(2)
}

fn help() -> String {
    let mut text = format!(
        "ringstore {VERSION}: a memcache + HTTP object store on io_uring\n\n\
         usage:\n  ringstore serve [--key value | --key=value]...   serve on this host\n  \
         ringstore init                                    run as PID 1 of the appliance\n  \
         ringstore console (--socket P|--tty D) [--key F] CMD  run one console command on an appliance, print its JSON\n  \
         ringstore --version\n  ringstore help\n\nserve flags (also TOML keys and ringstore.KEY=VALUE on the kernel command line):\n"
    );
    text.push_str(&format!(
        "  --{:<16} {}\n",
        "config FILE", "TOML file read first; flags override it"
    ));
    for key in KEYS.iter().filter(|k| !k.hidden) {
        text.push_str(&format!("  --{:<16} {}\n", key.name, key.help));
    }
    text.push_str("\nOnce every endpoint listens, one line is printed on stdout: `ready`, then NAME=IP:PORT for each\nendpoint that is on (memcache, http, udp, memcache_tls, https), e.g. `ready memcache=0.0.0.0:11211 http=0.0.0.0:8080`.\nFlags in full: docs/REFERENCE.md.\n");
    text
}

fn serve(args: &[String]) -> ExitCode {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", help());
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_args(args) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("ringstore: {err}");
            return ExitCode::from(2);
        }
    };
    // Blocked before any thread exists, so every thread inherits the block and SIGTERM/SIGINT
    // reach only the signalfd.
    let signals = match TerminationSignals::install_with_hangup() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("ringstore: {err}");
            return ExitCode::FAILURE;
        }
    };
    let tee = match start_log_sink(&config) {
        Ok(tee) => tee,
        Err(err) => {
            eprintln!("ringstore: {err}");
            return ExitCode::from(2);
        }
    };
    let code = serve_with(&config, &signals, tee.as_ref().map(|(shipper, _)| shipper));
    if let Some((_, tee)) = tee {
        // The last lines (the stop, an error) reach the terminal before the process exits.
        tee.finish();
    }
    code
}

/// `serve` once the signals are blocked and the log sink (if any) runs.
fn serve_with(
    config: &Config,
    signals: &TerminationSignals,
    shipper: Option<&ringstore_logsink::Shipper>,
) -> ExitCode {
    let server = match Server::start(config) {
        Ok(server) => server,
        Err(err) => {
            eprintln!("ringstore: {}", start_error(&err, config));
            return ExitCode::from(if is_usage_error(&err) { 2 } else { 1 });
        }
    };
    if let Some(shipper) = shipper {
        shipper.count_drops_in(server.shared().log_lines_dropped.clone());
    }
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "{}", server.ready_line())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        eprintln!("ringstore: cannot write the ready line to stdout");
    }
    drop(stdout);
    let signal = loop {
        match signals.wait() {
            // SIGHUP: the TLS certificates, the users file and the tokens file again (each
            // logs its outcome; a file at fault keeps the one in force).
            Ok(libc_sig::SIGHUP) => {
                let _ = server.reload_certs();
                let _ = server.reload_auth(config);
                server.rekey_to_next_key_file(config);
            }
            Ok(signal) => break signal,
            Err(err) => {
                eprintln!("ringstore: {err}; stopping");
                break 0;
            }
        }
    };
    let name = match signal {
        libc_sig::SIGTERM => "SIGTERM",
        libc_sig::SIGINT => "SIGINT",
        _ => "signal",
    };
    eprintln!("ringstore: {name}: stopping");
    match server.shutdown() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ringstore: stop: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `--log-sink`: starts the sender thread (after the signal block, so it inherits it) and
/// sends every line this process writes to stderr there too (ADR 0045).
fn start_log_sink(
    config: &Config,
) -> Result<
    Option<(ringstore_logsink::Shipper, ringstore_logsink::Tee)>,
    ringstore_logsink::LogSinkError,
> {
    let Some(sink) = &config.log_sink else {
        return Ok(None);
    };
    let mut ident = ringstore_logsink::Ident::of_this_process();
    if let Some(hostname) = &config.hostname {
        ident.hostname = hostname.clone();
    }
    let shipper = ringstore_logsink::Shipper::start(sink, config.tls.ca.as_deref(), ident)?;
    let tee = ringstore_logsink::tee_stderr(shipper.clone(), "server", None)?;
    eprintln!("ringstore: log-sink: shipping this log to {sink}");
    Ok(Some((shipper, tee)))
}

/// Whether a start failure comes from the values given, and so exits 2 like a bad flag: the
/// node or cores asked for, a data device that must not be used, an address that cannot be
/// listened on (in use, not this host's, not permitted), a memory budget that cannot be
/// mapped. Everything else (the kernel lacks io_uring, a worker failed, a data device that
/// fails while in use) exits 1.
fn is_usage_error(err: &RuntimeError) -> bool {
    matches!(
        err,
        RuntimeError::Numa(_)
            | RuntimeError::Cores { .. }
            | RuntimeError::DataRefused(_)
            | RuntimeError::AuthFile(_)
            | RuntimeError::Unsupported(_)
            | RuntimeError::Store(_)
            | RuntimeError::Tls(_)
    ) || matches!(
        err,
        RuntimeError::Bind { source, .. } if matches!(
            source.kind(),
            ErrorKind::AddrInUse
                | ErrorKind::AddrNotAvailable
                | ErrorKind::PermissionDenied
                | ErrorKind::InvalidInput
        ) || source.raw_os_error() == Some(EAFNOSUPPORT)
    )
}

/// An IPv6 address on a host without IPv6 (Linux's value; std has no ErrorKind for it).
const EAFNOSUPPORT: i32 = 97;

/// The one line printed for a start failure; names the flag where the error text does not.
fn start_error(err: &RuntimeError, config: &Config) -> String {
    match err {
        RuntimeError::Bind {
            endpoint,
            addr,
            source,
        } => format!("--{endpoint} {addr}: cannot listen: {source}"),
        RuntimeError::Store(_) => format!("--memory {} bytes: {err}", config.memory),
        _ => err.to_string(),
    }
}

/// The two signal numbers this binary names (Linux values on every architecture we build for).
mod libc_sig {
    pub const SIGHUP: i32 = 1;
    pub const SIGINT: i32 = 2;
    pub const SIGTERM: i32 = 15;
}
