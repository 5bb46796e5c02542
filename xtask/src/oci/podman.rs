//! The container image proved with podman (a step of `cargo xtask test`): `podman load` the
//! archive, `podman run` it with published ports under seccomp profiles derived from podman's
//! default, then memcache set/get and HTTP PUT/GET through those ports.
//!
//! Three runs: io_uring allowed (the committed `image/seccomp-allow-io_uring.json`, first held
//! to podman's default plus the three io_uring calls), which must serve with io_uring; io_uring
//! denied with EPERM exactly as Docker's default profile does, and podman's default profile as
//! it is (ENOSYS for io_uring on Debian 12), both of which must serve with the epoll runtime
//! and say why in the log. Then the container guide's own commands (recipe.rs).

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The three calls Docker's default profile (moby PR 46762) and containerd 2.0 deny.
pub const IO_URING_CALLS: [&str; 3] = ["io_uring_setup", "io_uring_enter", "io_uring_register"];
/// How long a started container has to answer memcache `version`.
const READY_LIMIT: Duration = Duration::from_secs(20);
/// Bound on any one podman command (load, run, logs, rm).
const PODMAN_LIMIT: Duration = Duration::from_secs(60);

/// Runs podman with `args`, bounded by [`PODMAN_LIMIT`]; stdout on success, else an error
/// with its stderr.
pub(super) fn podman(args: &[&str]) -> Result<String> {
    let mut child = Command::new("timeout")
        .arg(PODMAN_LIMIT.as_secs().to_string())
        .arg("podman")
        .args(args)
        // The container guide's commands name files relative to the repository root.
        .current_dir(crate::util::root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting podman (apt install podman)")?;
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut out)?;
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut err)?;
    }
    let status = child.wait()?;
    if !status.success() {
        bail!(
            "podman {} failed ({status}): {}",
            args.join(" "),
            err.trim()
        );
    }
    Ok(out)
}

/// What podman's default profile does with io_uring_setup, in words (for the log and README).
pub fn default_profile_verdict(profile: &Value) -> String {
    let allowed = profile["syscalls"].as_array().is_some_and(|rules| {
        rules.iter().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                && r["names"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|n| n == "io_uring_setup"))
        })
    });
    if allowed {
        "allows io_uring".into()
    } else {
        format!(
            "denies io_uring (not in its allow list: {} with errno {})",
            profile["defaultAction"].as_str().unwrap_or("?"),
            profile["defaultErrnoRet"]
        )
    }
}

/// `default` with the io_uring calls removed from every rule and one rule of our own for them:
/// `SCMP_ACT_ALLOW`, or `SCMP_ACT_ERRNO` with EPERM (Docker's errno for them).
pub fn derived_profile(default: &Value, allow_io_uring: bool) -> Result<Value> {
    let mut profile = default.clone();
    let rules = profile["syscalls"]
        .as_array_mut()
        .context("seccomp profile without a syscalls list")?;
    for rule in rules.iter_mut() {
        if let Some(names) = rule["names"].as_array_mut() {
            names.retain(|n| !IO_URING_CALLS.iter().any(|c| n == c));
        }
    }
    rules.retain(|r| !r["names"].as_array().is_some_and(Vec::is_empty));
    rules.push(if allow_io_uring {
        json!({"names": IO_URING_CALLS, "action": "SCMP_ACT_ALLOW"})
    } else {
        json!({"names": IO_URING_CALLS, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM})
    });
    Ok(profile)
}

/// The default profile's path (from `podman info`) and its containers-common version.
fn default_profile() -> Result<(PathBuf, Value, String)> {
    let info: Value = serde_json::from_str(&podman(&["info", "--format", "json"])?)?;
    let path = info["host"]["security"]["seccompProfilePath"]
        .as_str()
        .context("podman info names no seccomp profile")?;
    let path = PathBuf::from(path);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading podman's seccomp profile {}", path.display()))?;
    let version = Command::new("dpkg-query")
        .args(["-S", &path.to_string_lossy()])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.split(':').next().map(str::to_string))
        .and_then(|pkg| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f", "${Package} ${Version}", &pkg])
                .output()
                .ok()?;
            String::from_utf8(out.stdout).ok()
        })
        .unwrap_or_else(|| "package unknown".into());
    Ok((path, serde_json::from_str(&text)?, version))
}

/// A running container, removed (with its logs read first) when dropped.
pub(super) struct Container {
    name: String,
}

impl Container {
    /// The container `name` (removed when this is dropped, whether or not it started).
    pub(super) fn named(name: &str) -> Container {
        Container {
            name: name.to_string(),
        }
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn logs(&self) -> String {
        let out = Command::new("timeout")
            .args(["20", "podman", "logs", &self.name])
            .output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman(&["rm", "-f", "-t", "1", &self.name]);
    }
}

/// A free loopback port for `-p 127.0.0.1:PORT:…`.
pub(super) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts the image detached, ports 11211 and 8080 published on loopback, under `profile`,
/// with the `machine` options this machine needs ([`machine_options`]).
fn start(
    image: &str,
    machine: &[String],
    profile: &Path,
    label: &str,
) -> Result<(Container, u16, u16)> {
    let (mc, http) = (free_port()?, free_port()?);
    let name = format!("ringstore-oci-test-{label}-{}", std::process::id());
    let _ = podman(&["rm", "-f", &name]);
    let seccomp = format!("seccomp={}", profile.display());
    let (mc_map, http_map) = (
        format!("127.0.0.1:{mc}:11211"),
        format!("127.0.0.1:{http}:8080"),
    );
    let mut args = vec!["run", "-d", "--name", &name, "--security-opt", &seccomp];
    args.extend(machine.iter().map(String::as_str));
    args.extend(["-p", &mc_map, "-p", &http_map, image]);
    podman(&args)?;
    Ok((Container { name }, mc, http))
}

/// Sends `request` and reads until the reply ends with `end` (bounded by a 5 s timeout).
pub(super) fn exchange(port: u16, request: &[u8], end: &[u8]) -> Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request)?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while !reply.ends_with(end) {
        let n = s.read(&mut buf)?;
        if n == 0 || reply.len() > 1 << 20 {
            bail!("reply ended early: {:?}", String::from_utf8_lossy(&reply));
        }
        reply.extend_from_slice(&buf[..n]);
    }
    Ok(reply)
}

/// Waits for memcache `version` through the published port, failing early when the
/// container has exited.
pub(super) fn wait_ready(c: &Container, port: u16) -> Result<()> {
    let started = Instant::now();
    loop {
        if let Ok(r) = exchange(port, b"version\r\n", b"\r\n") {
            if r.starts_with(b"VERSION ") {
                return Ok(());
            }
        }
        let state = podman(&["inspect", "-f", "{{.State.Status}}", &c.name]).unwrap_or_default();
        if state.trim() == "exited" || started.elapsed() > READY_LIMIT {
            bail!(
                "container {} ({}): no memcache answer; its log:\n{}",
                c.name,
                state.trim(),
                c.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// memcache set/get and HTTP PUT/GET through the published ports.
pub(super) fn exercise(mc: u16, http: u16) -> Result<()> {
    let r = exchange(mc, b"set oci:k 0 0 5\r\nhello\r\nget oci:k\r\n", b"END\r\n")?;
    if r != b"STORED\r\nVALUE oci:k 0 5\r\nhello\r\nEND\r\n" {
        bail!(
            "memcache set/get answered {:?}",
            String::from_utf8_lossy(&r)
        );
    }
    let body = b"object body through podman";
    let mut put = format!(
        "PUT /oci/obj HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    put.extend_from_slice(body);
    let r = exchange(http, &put, b"\r\n\r\n")?;
    if !r.starts_with(b"HTTP/1.1 20") {
        bail!("HTTP PUT answered {:?}", String::from_utf8_lossy(&r));
    }
    let r = exchange(
        http,
        b"GET /oci/obj HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        body,
    )?;
    if !r.starts_with(b"HTTP/1.1 200") {
        bail!("HTTP GET answered {:?}", String::from_utf8_lossy(&r));
    }
    // memcache and HTTP share one keyspace (`PUT /KEY` stores KEY).
    let r = exchange(mc, b"get oci/obj\r\n", b"END\r\n")?;
    if !r.windows(body.len()).any(|w| w == body) {
        bail!(
            "memcache get of the HTTP object answered {:?}",
            String::from_utf8_lossy(&r)
        );
    }
    Ok(())
}

/// One run: start under `profile`, wait, exercise; the container's log on failure.
fn run_under(image: &str, machine: &[String], profile: &Path, label: &str) -> Result<String> {
    let (c, mc, http) = start(image, machine, profile, label)?;
    wait_ready(&c, mc)?;
    exercise(mc, http).with_context(|| format!("container log:\n{}", c.logs()))?;
    Ok(c.logs())
}

/// Whether podman can run a container here with `machine` options: the image's own binary
/// printing its version (`Err` says why not: the probe's error).
fn can_run(image: &str, machine: &[String]) -> Result<()> {
    let mut args = vec!["run", "--rm"];
    args.extend(machine.iter().map(String::as_str));
    args.extend(["--entrypoint", "/ringstore", image, "--version"]);
    let out = podman(&args)?;
    if !out.starts_with("ringstore ") {
        bail!("`ringstore --version` in the container printed {out:?}");
    }
    Ok(())
}

/// The podman options this machine needs to run a container, found by trying the image's
/// `--version` with each in turn: none (a usual host), then limits this process may set
/// (rootful podman asks for RLIMIT_NOFILE/NPROC above the hard limits of a container without
/// CAP_SYS_RESOURCE), then runc (crun refuses hybrid cgroup v1+v2 hierarchies), then both.
/// `Err` lists why each failed: podman cannot run containers here.
fn machine_options(image: &str) -> std::result::Result<Vec<String>, String> {
    let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .unwrap_or(65_536)
        .min(65_536);
    let limits = [
        "--ulimit".to_string(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".to_string(),
        "nproc=4096:4096".to_string(),
    ];
    let runc = ["--runtime".to_string(), "runc".to_string()];
    let candidates = [
        vec![],
        limits.to_vec(),
        runc.to_vec(),
        [runc.to_vec(), limits.to_vec()].concat(),
    ];
    let mut why = Vec::new();
    for options in candidates {
        match can_run(image, &options) {
            Ok(()) => return Ok(options),
            Err(e) => why.push(format!("[{}]: {e:#}", options.join(" "))),
        }
    }
    Err(why.join("; "))
}

/// The line `--io auto` logs under podman's default profile (which answers ENOSYS for calls
/// it does not list): the probable cause, from the process's `Seccomp:` mode, then the fallback.
pub const DEFAULT_PROFILE_LINE: &str = "ringstore: io_uring refused (ENOSYS) with a seccomp filter on this process (Seccomp: 2): probably the container's seccomp profile";

/// The image's runs: build the archive, load it, run it three times (io_uring allowed, denied
/// with EPERM as Docker does, and podman's own default profile). Podman missing or unable to
/// run a container is a failure, never a skip: `cargo xtask test` installs podman itself.
/// Returns the options this machine needs to run a container (the recipe runs take them).
pub fn check() -> Result<Vec<String>> {
    let archive = super::build()?;
    if !crate::util::have("podman") {
        anyhow::bail!(
            "oci: podman is not installed (apt install podman; cargo xtask test installs it as root)"
        );
    }
    let loaded = podman(&["load", "-i", &archive.to_string_lossy()])?;
    eprintln!("oci: {}", loaded.trim());
    let image = super::REF_NAME;
    let machine = match machine_options(image) {
        Ok(options) => options,
        Err(why) => {
            anyhow::bail!("oci: podman cannot run a container here: {why}")
        }
    };
    if !machine.is_empty() {
        eprintln!("oci: this machine needs podman run {}", machine.join(" "));
    }
    let (path, default, version) = default_profile()?;
    eprintln!(
        "oci: podman's default seccomp profile {} ({version}) {}",
        path.display(),
        default_profile_verdict(&default)
    );
    let dir = archive.parent().context("archive directory")?;
    let allow = dir.join(super::SECCOMP_PROFILE_NAME);
    shipped_profile_matches(&allow, &default, &version)?;
    let deny = dir.join("seccomp-deny-io_uring.json");
    std::fs::write(
        &deny,
        serde_json::to_vec(&derived_profile(&default, false)?)?,
    )?;
    let log = run_under(image, &machine, &allow, "uring")
        .context("the image under podman's profile with io_uring allowed")?;
    ensure_log(&log, "io_uring allowed", "", "serving with epoll")?;
    eprintln!(
        "oci: io_uring allowed: memcache set/get and HTTP PUT/GET through the published ports: ok"
    );
    let log = run_under(image, &machine, &deny, "no-uring")
        .context("the image with io_uring denied (epoll runtime)")?;
    ensure_log(&log, "io_uring denied with EPERM", "serving with epoll", "")?;
    eprintln!("oci: io_uring denied with EPERM (as Docker's profile does): served with epoll: ok");
    if default_profile_verdict(&default) != "allows io_uring" {
        default_profile_run(image, &machine, &path, &default)?;
    }
    Ok(machine)
}

/// The profile shipped beside the archive (the committed [`super::SECCOMP_PROFILE`]) is this
/// host podman's default plus the io_uring rule, as [`derived_profile`] makes it; when podman's
/// default changed, the expected profile is written beside it for review and the step fails.
fn shipped_profile_matches(shipped: &Path, default: &Value, version: &str) -> Result<()> {
    let text = std::fs::read_to_string(shipped)
        .with_context(|| format!("reading {}", shipped.display()))?;
    let have: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", shipped.display()))?;
    let want = derived_profile(default, true)?;
    if have != want {
        let expected = shipped.with_extension("expected.json");
        std::fs::write(&expected, serde_json::to_string_pretty(&want)? + "\n")?;
        bail!(
            "{} is not podman's default seccomp profile ({version}) plus the io_uring rule; \
             the profile that is: {} (review it and copy it to {})",
            super::SECCOMP_PROFILE,
            expected.display(),
            super::SECCOMP_PROFILE
        );
    }
    eprintln!(
        "oci: {} is podman's default profile ({version}) plus the io_uring rule: ok",
        super::SECCOMP_PROFILE
    );
    Ok(())
}

/// Under podman's default profile as it is: served with epoll, and where that profile answers
/// ENOSYS the log names the seccomp filter as the probable cause, not the kernel.
fn default_profile_run(
    image: &str,
    machine: &[String],
    path: &Path,
    default: &Value,
) -> Result<()> {
    let log = run_under(image, machine, path, "default")
        .context("the image under podman's default seccomp profile")?;
    let want = if default["defaultErrnoRet"] == libc::ENOSYS {
        DEFAULT_PROFILE_LINE
    } else {
        "serving with epoll"
    };
    ensure_log(&log, "podman's default profile", want, "")?;
    ensure_log(&log, "podman's default profile", "serving with epoll", "")?;
    eprintln!("oci: podman's default profile: served with epoll, log: {want}: ok");
    Ok(())
}

/// The container's log has `want` (unless empty) and lacks `unwanted` (unless empty).
fn ensure_log(log: &str, run: &str, want: &str, unwanted: &str) -> Result<()> {
    if !want.is_empty() && !log.contains(want) {
        bail!("{run}: served, but the log lacks {want:?}:\n{log}");
    }
    if !unwanted.is_empty() && log.contains(unwanted) {
        bail!("{run}: served, but the log says {unwanted:?}:\n{log}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed profile: podman's default shape, ERRNO for every call it does not list,
    /// and the three io_uring calls allowed by exactly one rule of their own, as
    /// [`derived_profile`] makes it (so deriving it again changes nothing).
    #[test]
    fn committed_profile_allows_exactly_the_io_uring_calls() {
        let path = crate::util::root().join(crate::oci::SECCOMP_PROFILE);
        let profile: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(default_profile_verdict(&profile), "allows io_uring");
        let rules = profile["syscalls"].as_array().unwrap();
        let naming: Vec<&Value> = rules
            .iter()
            .filter(|r| {
                r["names"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|n| IO_URING_CALLS.iter().any(|c| n == c)))
            })
            .collect();
        assert_eq!(
            naming,
            [&json!({"names": IO_URING_CALLS, "action": "SCMP_ACT_ALLOW"})]
        );
        assert_eq!(derived_profile(&profile, true).unwrap(), profile);
        // podman's default allows the calls a server needs (a sample of them).
        let allowed = |call: &str| {
            rules.iter().any(|r| {
                r["action"] == "SCMP_ACT_ALLOW"
                    && r["names"]
                        .as_array()
                        .is_some_and(|n| n.iter().any(|n| n == call))
            })
        };
        for call in ["accept4", "epoll_wait", "mmap", "sendmsg", "fdatasync"] {
            assert!(allowed(call), "{call}");
        }
    }

    #[test]
    fn derived_profiles_deny_or_allow_exactly_the_three_calls() {
        let default = json!({
            "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
            "syscalls": [
                {"names": ["read", "io_uring_setup"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["io_uring_enter"], "action": "SCMP_ACT_ALLOW"},
            ]
        });
        assert_eq!(default_profile_verdict(&default), "allows io_uring");
        let deny = derived_profile(&default, false).unwrap();
        let rules = deny["syscalls"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["names"], json!(["read"]));
        assert_eq!(rules[1]["names"], json!(IO_URING_CALLS));
        assert_eq!(
            (rules[1]["action"].as_str(), rules[1]["errnoRet"].as_i64()),
            (Some("SCMP_ACT_ERRNO"), Some(1))
        );
        assert!(default_profile_verdict(&deny).starts_with("denies io_uring"));
        let allow = derived_profile(&deny, true).unwrap();
        assert_eq!(allow["syscalls"].as_array().unwrap().len(), 2);
        assert_eq!(default_profile_verdict(&allow), "allows io_uring");
    }
}
