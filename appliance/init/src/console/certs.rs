//! The console's `certs`: the TLS certificate in use (subject, expiry, days left, a warning
//! under 14 days, where it came from) and `certs reload`, which reads the config
//! partition's `/tls/*.pem` again and has the server load them: new handshakes get the new
//! certificate, open sessions keep theirs. A file that does not load leaves the old ones in
//! place, on disk and in the server.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::ctx::Ctx;
use super::output::Output;
use crate::machine::Machine;
use crate::tls_files::{self, RUN_DIR};

/// The certificate file the server reads, if TLS is configured.
fn cert_path(machine: &Machine) -> Option<PathBuf> {
    machine.state().config.as_ref()?.tls.cert.clone()
}

/// The certificate's fields for `status` and `certs`: `None` without TLS.
pub fn cert_json(machine: &Machine) -> Option<(String, Value)> {
    let path = cert_path(machine)?;
    let now = tls_files::unix_now();
    Some(match tls_files::summary_of(&path) {
        Ok(s) => {
            let days = s.days_left(now);
            (
                format!("tls_cert {}", tls_files::describe(&s, now)),
                json!({"file": path.display().to_string(), "subject": s.subject,
                       "not_after": tls_files::not_after_text(&s), "days_left": days,
                       "warning": tls_files::warning(days)}),
            )
        }
        Err(why) => (
            format!("tls_cert unreadable: {why}"),
            json!({"file": path.display().to_string(), "error": why}),
        ),
    })
}

/// `certs` and `certs reload`.
pub fn run(ctx: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [] => show(ctx.machine),
        ["reload"] => reload(ctx.machine),
        _ => Output::error("usage: certs [reload]"),
    }
}

fn show(machine: &Machine) -> Output {
    let mut out = Output::new();
    let source = match &machine.state().tls_files {
        None => "the configuration's files (no /tls/ on the config partition)".to_string(),
        Some(Ok(())) => format!("the config partition's /tls/, installed in {RUN_DIR}"),
        Some(Err(why)) => format!("config partition /tls/ REFUSED: {why}"),
    };
    out.line(format!("source {source}"));
    out.set("source", source);
    match cert_json(machine) {
        None => out.line("tls off (no tls-cert)"),
        Some((line, fields)) => {
            out.line(line);
            out.set("cert", fields);
        }
    }
    out
}

/// Reads `/tls/` of the config partition again, installs it and reloads the server; on
/// any failure the files in use are put back.
fn reload(machine: &Machine) -> Output {
    let found = machine.state().config_partition.clone();
    let Some(found) = found else {
        return Output::error("no config partition on this boot (PXE or -kernel): nothing to read");
    };
    match cert_path(machine) {
        None => return Output::error("tls is off (no tls-cert)"),
        // The configuration names its own files: the server reads those again.
        Some(path) if !path.starts_with(RUN_DIR) => return reload_server(machine, None),
        Some(_) => {}
    }
    let files = match tls_files::read(&found, true) {
        Ok(Some(files)) => files,
        Ok(None) => {
            return Output::error("the config partition has no /tls/cert.pem and /tls/key.pem")
        }
        Err(why) => return Output::error(why),
    };
    let dir = Path::new(RUN_DIR);
    let before = read_installed(dir);
    if let Err(why) = tls_files::install(dir, &files) {
        return Output::error(why);
    }
    reload_server(machine, before)
}

/// Has the server read its certificate files again; on an error puts `before` back.
fn reload_server(machine: &Machine, before: Option<tls_files::TlsFiles>) -> Output {
    let reloaded = match machine.state().server.as_ref() {
        Some(server) => server.reload_certs(),
        None => Err("nothing serves (see `status`)".into()),
    };
    if let Err(why) = reloaded {
        if let Some(before) = before {
            // The server keeps the old certificates; so do the files it reads.
            let _ = tls_files::install(Path::new(RUN_DIR), &before);
        }
        crate::warn!("certs reload: not reloaded (the old certificates stay): {why}");
        return Output::error(format!("not reloaded (the old certificates stay): {why}"));
    }
    if before.is_some() {
        machine.state().tls_files = Some(Ok(()));
    }
    crate::metrics_handoff::certificate(machine);
    let mut out = show(machine);
    let seen = out.text.last().cloned().unwrap_or_default();
    crate::info!("certs reload: new handshakes use {seen}");
    out.text.insert(
        0,
        "reloaded: new handshakes use the new certificate, open sessions keep theirs".into(),
    );
    out.set("reloaded", true);
    out
}

/// The files installed now (to put back if a reload fails).
fn read_installed(dir: &Path) -> Option<tls_files::TlsFiles> {
    Some(tls_files::TlsFiles {
        cert: std::fs::read(dir.join("cert.pem")).ok()?,
        key: std::fs::read(dir.join("key.pem")).ok()?,
        ca: std::fs::read(dir.join("ca.pem")).ok(),
    })
}
