//! The appliance's HTTP tokens from its config partition (`/auth/tokens`, docs/OPERATIONS.md
//! "Users and tokens on the appliance"), checked on the disk test's third boot, whose
//! ringstore.toml is refused: the tokens stay in force all the same (a refused file must not
//! open the ports), `auth` says where they come from, and `auth reload` takes a new file
//! written under the running guest (a removed token's next request on a keep-alive
//! connection is 401, an added one is served) and refuses a broken one (the one in force
//! stays).

use std::net::TcpStream;

use anyhow::{ensure, Result};
use sha2::{Digest, Sha256};

use super::client::{exchange, tcp};
use super::vm::Vm;

/// The tokens the test hands out (not secrets: a throwaway guest).
const OLD: &str = "vm-old-token";
const NEW: &str = "vm-new-token";

/// A tokens file line for `token`, as an operator writes it (the hash, never the token).
fn line(name: &str, token: &str) -> String {
    let hash: String = Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{name} {hash} write\n")
}

/// The tokens file on the config partition.
pub(super) const TOKENS_FILE: &str = "auth/tokens";

/// Before the boot: the tokens file with the old token.
pub(super) fn first_tokens() -> String {
    line("old", OLD)
}

/// The status line of a GET with `token` (none: no `Authorization`) on `s`, kept alive.
fn get(s: &mut TcpStream, token: Option<&str>) -> Result<String> {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET /vmobject HTTP/1.1\r\nHost: vm\r\n{auth}\r\n");
    let got = exchange(s, request.as_bytes(), |t| {
        t.find("\r\n\r\n").is_some_and(|end| {
            // The head, then the body its Content-Length announces.
            let len = t[..end]
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            t.len() >= end + 4 + len
        })
    })?;
    Ok(got.lines().next().unwrap_or_default().to_string())
}

/// A status that got past the token check (the object may or may not be there).
fn allowed(status: &str) -> bool {
    status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.1 404")
}

/// The checks, on the running third boot; `write_tokens` replaces [`TOKENS_FILE`] on its
/// config partition under the running guest (the UEFI test's machine does).
pub(super) fn tokens_from_the_partition(
    vm: &mut Vm,
    write_tokens: impl Fn(&[u8]) -> Result<()>,
) -> Result<()> {
    let port = vm.port("http", 0)?;
    let mut kept = tcp(port)?;
    let none = get(&mut kept, None)?;
    ensure!(
        none.starts_with("HTTP/1.1 401"),
        "no token, though the partition has /auth/tokens (its ringstore.toml refused): {none}"
    );
    let old = get(&mut kept, Some(OLD))?;
    ensure!(allowed(&old), "the partition's token: {old}");
    let shown = vm.command("auth")?;
    ensure!(
        shown.contains("installed in /run/ringstore/auth")
            && shown.contains("http_tokens /run/ringstore/auth/tokens"),
        "`auth`:\n{shown}"
    );
    write_tokens(line("new", NEW).as_bytes())?;
    let reloaded = vm.command("auth reload")?;
    ensure!(
        reloaded.contains("reloaded") && reloaded.contains("http-tokens reloaded: 1 tokens"),
        "`auth reload`:\n{reloaded}"
    );
    let removed = get(&mut kept, Some(OLD))?;
    ensure!(
        removed.starts_with("HTTP/1.1 401"),
        "the removed token's next request on its keep-alive connection: {removed}"
    );
    let new = get(&mut kept, Some(NEW))?;
    ensure!(allowed(&new), "the new token: {new}");
    write_tokens(b"broken 12 write\n")?;
    let refused = vm.command("auth reload")?;
    ensure!(
        refused.contains("error: /auth/tokens: line 1: the hash is not 64 hex digits")
            && refused.contains("the tokens in force stay"),
        "`auth reload` of a broken file:\n{refused}"
    );
    let still = get(&mut tcp(port)?, Some(NEW))?;
    ensure!(
        allowed(&still),
        "the token in force after a refused reload: {still}"
    );
    Ok(())
}
