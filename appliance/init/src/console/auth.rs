//! The console's `auth`: where the server's users file (`auth_file`) and tokens file
//! (`http_tokens`) come from, and `auth reload`, which reads the config partition's
//! `/auth/users` and `/auth/tokens` again (where the server reads the installed copies),
//! installs each that parses and has the server reload both files (SIGHUP's rules: a file
//! that does not parse keeps the one in force; memcache connections of users the new file
//! removed are closed; a removed token's next request is 401). docs/OPERATIONS.md
//! "Users and tokens on the appliance".

use std::path::Path;

use super::ctx::Ctx;
use super::output::Output;
use crate::auth_files::{self, Kind, RUN_DIR};
use crate::machine::Machine;

/// `auth` and `auth reload`.
pub fn run(ctx: &mut Ctx, args: &[&str]) -> Output {
    match args {
        [] => show(ctx.machine),
        ["reload"] => reload(ctx.machine),
        _ => Output::error("usage: auth [reload]"),
    }
}

fn show(machine: &Machine) -> Output {
    let mut out = Output::new();
    let state = machine.state();
    let source = match &state.auth_files {
        None => "the configuration's files (no /auth/ on the config partition)".to_string(),
        Some(Ok(())) => format!("the config partition's /auth/, installed in {RUN_DIR}"),
        Some(Err(why)) => format!("config partition /auth/ REFUSED: {why}"),
    };
    out.line(format!("source {source}"));
    out.set("source", source);
    for kind in Kind::ALL {
        let path = state
            .config
            .as_ref()
            .and_then(|c| kind.configured(c))
            .map(|p| p.display().to_string());
        out.line(format!(
            "{} {}",
            kind.key(),
            path.as_deref().unwrap_or("off")
        ));
        out.set(kind.key(), path);
    }
    out
}

/// Installs what the partition holds for the files the server reads from [`RUN_DIR`];
/// returns why each one that was not taken was not (its installed copy stays).
fn install_from_partition(machine: &Machine, kinds: &[Kind]) -> Result<Vec<String>, String> {
    let found = machine.state().config_partition.clone();
    let Some(found) = found else {
        return Err("no config partition on this boot (PXE or -kernel): nothing to read".into());
    };
    let files = auth_files::read(&found, true)?;
    let mut refused = Vec::new();
    for &kind in kinds {
        let (name, what) = (kind.file(), kind.what());
        let Some(bytes) = files.get(kind) else {
            refused.push(format!(
                "/auth/{name} is not on the config partition: the {what} in force stay (turning the check off needs a restart)"
            ));
            continue;
        };
        let taken = kind
            .check(bytes)
            .and_then(|()| auth_files::install(Path::new(RUN_DIR), kind, bytes));
        if let Err(why) = taken {
            refused.push(format!("/auth/{name}: {why}; the {what} in force stay"));
        }
    }
    Ok(refused)
}

/// Reads `/auth/` of the config partition again (for the files the server reads from
/// there), installs each that parses, and has the server reload.
fn reload(machine: &Machine) -> Output {
    let config = machine.state().config.clone();
    let Some(config) = config else {
        return Output::error("nothing serves (see `status`)");
    };
    let in_use: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| k.configured(&config).is_some())
        .collect();
    if in_use.is_empty() {
        return Output::error(
            "auth is off (no auth_file or http_tokens); turning it on needs a restart",
        );
    }
    let from_partition: Vec<Kind> = in_use
        .into_iter()
        .filter(|k| {
            k.configured(&config)
                .is_some_and(|p| p.starts_with(RUN_DIR))
        })
        .collect();
    let mut refused = Vec::new();
    if !from_partition.is_empty() {
        match install_from_partition(machine, &from_partition) {
            Ok(why) => refused = why,
            Err(why) => return Output::error(why),
        }
    }
    let reloaded = match machine.state().server.as_ref() {
        Some(server) => server.reload_auth(&config),
        None => Err("nothing serves (see `status`)".into()),
    };
    let in_force = reloaded.as_ref().ok().cloned();
    refused.extend(reloaded.err());
    let mut out = if refused.is_empty() {
        let mut out = show(machine);
        out.text.insert(0, "reloaded: connections of removed users are closed, a removed token's next request is 401".into());
        out
    } else {
        let why = refused.join("; ");
        crate::warn!("auth reload: {why}");
        Output::error(why)
    };
    if let Some(line) = in_force {
        crate::info!("auth reload: {line}");
        out.line(line.clone());
        out.set("reloaded", line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::session::Session;

    fn run_on(machine: &Machine, args: &[&str]) -> Output {
        let mut session = Session::new("h", "b");
        let mut ctx = Ctx {
            session: &mut session,
            machine,
            now: std::time::Instant::now(),
            json: true,
        };
        run(&mut ctx, args)
    }

    #[test]
    fn auth_shows_the_files_and_reload_refuses_what_it_cannot_do() {
        let machine = Machine::default();
        let shown = run_on(&machine, &[]);
        assert!(shown.ok);
        assert!(shown.text[0].contains("no /auth/ on the config partition"));
        assert_eq!(shown.text[1], "auth_file off");
        assert!(shown.fields["http_tokens"].is_null());
        assert!(!run_on(&machine, &["now"]).ok);
        assert_eq!(
            run_on(&machine, &["reload"]).fields["error"],
            "nothing serves (see `status`)"
        );
        let mut config = ringstore_config::Config::default();
        machine.state().config = Some(config.clone());
        let off = run_on(&machine, &["reload"]);
        assert!(off.fields["error"]
            .as_str()
            .unwrap()
            .starts_with("auth is off"));
        // Files under the run folder come from the partition: none on this boot.
        config.auth_file = Some(Path::new(RUN_DIR).join("users"));
        machine.state().config = Some(config);
        machine.state().auth_files = Some(Ok(()));
        let shown = run_on(&machine, &[]);
        assert_eq!(shown.text[1], "auth_file /run/ringstore/auth/users");
        assert!(shown.text[0].contains("installed in /run/ringstore/auth"));
        let no_partition = run_on(&machine, &["reload"]);
        assert!(no_partition.fields["error"]
            .as_str()
            .unwrap()
            .starts_with("no config partition"));
    }
}
