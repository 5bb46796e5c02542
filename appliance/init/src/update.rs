//! A/B updates with a trial boot gated on the data path (ADR 0025).
//!
//! The ESP holds systemd-boot, `loader.conf` (whose `default` is the committed slot) and the
//! two UKIs `\EFI\Linux\ringstore-{a,b}.efi`. `update URL` fetches a new ringstore.efi and its
//! `.sig`, verifies the ed25519 signature against the key in the running image before writing
//! anything, writes the inactive slot, records a pending trial on the ESP, sets systemd-boot's
//! `LoaderEntryOneShot` to the new slot and reboots. The trial boot arms the hardware watchdog,
//! and once its server is ready runs the canary through its own listeners: memcache
//! set/get/delete, HTTP PUT/GET/DELETE, each within [`CANARY_OP_LIMIT`], and with a data device
//! the key the old system wrote before the reboot, read back after recovery. Only then does it
//! make itself the default (commit). Any failure records why and reboots; a hang is reset by
//! the watchdog; either way the one-shot entry is spent, so the next boot is the old slot,
//! which reports the outcome at boot and in `slots`.

use std::io::{Read, Seek, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ringstore_disk::slots::{self, Slot, Trial};
use ringstore_disk::{fat, signature, Layout, Role};

use crate::{error, info, warn};

/// The biggest ringstore.efi `update` accepts.
pub const IMAGE_MAX: usize = 96 << 20;
/// The whole download (image and signature) must end within this.
pub const FETCH_LIMIT: Duration = Duration::from_secs(180);
/// Every canary operation must be answered within this: milliseconds on hardware, but sized
/// for TCG on a loaded 2-core host, where one fdatasync (a durable delete) was seen to take 3 s.
pub const CANARY_OP_LIMIT: Duration = Duration::from_secs(10);
/// How long a trial boot may take from PID 1's start to its verdict; past it the watchdog is
/// no longer fed and resets the machine.
pub const TRIAL_LIMIT: Duration = Duration::from_secs(240);
/// The key the old system writes before the trial and the new one reads after recovery.
pub const CANARY_KEY: &str = "ringstore-update-canary";

const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
const EFIVARS: &str = "/sys/firmware/efi/efivars";

/// The slots as this boot found them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotsState {
    /// Where the ESP is; `None` on a boot without disk.img (QEMU -kernel, PXE).
    pub esp: Option<crate::bootdisk::Found>,
    pub booted: Option<Slot>,
    pub committed: Option<Slot>,
    pub trial: Option<Trial>,
    /// This boot is a trial that has not been decided yet.
    pub trying: bool,
    /// The token the canary expects under [`CANARY_KEY`] (from the trial record).
    pub canary_token: Option<String>,
}

pub(crate) fn esp_fs(
    found: &crate::bootdisk::Found,
) -> Result<fatfs::FileSystem<ringstore_disk::Slice<std::fs::File>>, String> {
    let volume = found.open(true).map_err(|e| format!("ESP: {e}"))?;
    fat::open(volume, &fat::DOS_EPOCH).map_err(|e| format!("ESP: {e}"))
}

fn read_text<T: Read + Write + Seek>(fs: &fatfs::FileSystem<T>, path: &str) -> Option<String> {
    fat::read_file(fs, path, 64 << 10)
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
}

fn write_text<T: Read + Write + Seek>(
    fs: &fatfs::FileSystem<T>,
    path: &str,
    text: &str,
) -> Result<(), String> {
    fat::write_file(fs, path, text.as_bytes()).map_err(|e| format!("ESP: {e}"))
}

/// An EFI variable's value without its 4 attribute bytes, as UTF-16 text.
fn read_efi_string(name: &str) -> Option<String> {
    let bytes = std::fs::read(Path::new(EFIVARS).join(format!("{name}-{LOADER_GUID}"))).ok()?;
    let units: Vec<u16> = bytes
        .get(4..)?
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16(&units).ok()
}

/// Sets systemd-boot's one-shot entry (non-volatile, boot and runtime access).
fn write_one_shot(entry: &str) -> Result<(), String> {
    let bytes = one_shot_bytes(entry);
    let path = Path::new(EFIVARS).join(format!("LoaderEntryOneShot-{LOADER_GUID}"));
    std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// An efivarfs write: the attributes (NV | BS | RT), then the UTF-16LE text with its NUL.
fn one_shot_bytes(entry: &str) -> Vec<u8> {
    let mut bytes = 7u32.to_le_bytes().to_vec();
    for unit in entry.encode_utf16().chain([0]) {
        bytes.extend_from_slice(&unit.to_le_bytes());
    }
    bytes
}

/// At boot (with the boot capabilities): mounts efivarfs, finds the ESP and reads which slot
/// booted, which is committed and how the last trial went; reports a failed trial.
pub fn boot_state() -> SlotsState {
    let mut st = SlotsState::default();
    if !Path::new("/sys/firmware/efi").exists() {
        return st;
    }
    if !Path::new(EFIVARS)
        .join(format!("LoaderInfo-{LOADER_GUID}"))
        .exists()
    {
        let _ = std::fs::create_dir_all(EFIVARS);
        if let Err(err) = ringstore_sys::mount(
            "efivarfs",
            EFIVARS,
            "efivarfs",
            ringstore_sys::MountFlags::NOSUID
                .union(ringstore_sys::MountFlags::NODEV)
                .union(ringstore_sys::MountFlags::NOEXEC),
            "",
        ) {
            warn!("efivarfs: {err}; A/B updates are off");
        }
    }
    let layout = Layout::builtin();
    let Some(esp) = crate::bootdisk::find(&layout, Role::Esp) else {
        return st;
    };
    st.booted = read_efi_string("LoaderEntrySelected").and_then(|id| Slot::from_entry_id(&id));
    let fs = match esp_fs(&esp) {
        Ok(fs) => fs,
        Err(why) => {
            warn!("{why}");
            return st;
        }
    };
    st.committed = read_text(&fs, slots::LOADER_CONF).and_then(|c| slots::default_slot(&c));
    st.trial = read_text(&fs, slots::TRIAL_FILE).and_then(|t| Trial::parse(&t));
    st.canary_token = read_text(&fs, CANARY_TOKEN_FILE).map(|t| t.trim().to_string());
    if let (Some(booted), Some(trial)) = (st.booted, st.trial.clone()) {
        if trial.outcome == "pending" && booted == trial.to && st.committed != Some(booted) {
            st.trying = true;
            info!(
                "update: trial boot of slot {booted} (from slot {}): the canary decides",
                trial.from
            );
        } else if trial.outcome == "pending" && booted == trial.from {
            let why = format!(
                "failed: the trial boot of slot {} never reported (hang, crash or watchdog reset); back on slot {booted}",
                trial.to
            );
            let decided = Trial {
                outcome: why.clone(),
                ..trial
            };
            let _ = write_text(&fs, slots::TRIAL_FILE, &decided.render());
            st.trial = Some(decided);
            error!("update: {why}");
        } else if trial.outcome.starts_with("failed") && booted == trial.from {
            error!(
                "update: last trial of slot {}: {}; running slot {booted}",
                trial.to, trial.outcome
            );
        }
    }
    let _ = fs.unmount();
    st.esp = Some(esp);
    st
}

const CANARY_TOKEN_FILE: &str = "loader/ringstore-canary.txt";

/// During a trial: feeds the hardware watchdog until the verdict or [`TRIAL_LIMIT`].
pub fn arm_watchdog() {
    let dev = match std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/watchdog")
    {
        Ok(dev) => dev,
        Err(err) => {
            warn!("update: no hardware watchdog (/dev/watchdog: {err}): a hang of this trial will not roll back by itself");
            return;
        }
    };
    info!(
        "update: watchdog armed for the trial ({} s)",
        TRIAL_LIMIT.as_secs()
    );
    let started = Instant::now();
    let _ = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let mut dev = dev;
            while started.elapsed() < TRIAL_LIMIT {
                if !crate::state::lock().slots.trying {
                    // Decided and committed: the magic close stops the watchdog.
                    let _ = dev.write_all(b"V");
                    return;
                }
                let _ = dev.write_all(b"\0");
                std::thread::sleep(Duration::from_secs(5));
            }
            error!(
                "update: the trial took longer than {} s; the watchdog will reset the machine",
                TRIAL_LIMIT.as_secs()
            );
            // Stop feeding: held open without writes, the timer fires.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        });
}

/// A local address for a listener (`0.0.0.0` → `127.0.0.1`).
fn local(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
    } else {
        addr
    }
}

/// One request, its answer read until `done`, within `limit`.
fn exchange(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: &[u8],
    done: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>, String> {
    let started = Instant::now();
    let fail = |e: std::io::Error| format!("{what}: {e}");
    let mut s = TcpStream::connect_timeout(&addr, limit).map_err(fail)?;
    s.set_read_timeout(Some(limit)).map_err(fail)?;
    s.write_all(request).map_err(fail)?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&got) {
        if started.elapsed() > limit || got.len() > 1 << 20 {
            return Err(format!(
                "{what}: no whole answer within {} ms",
                limit.as_millis()
            ));
        }
        let n = s.read(&mut buf).map_err(fail)?;
        if n == 0 {
            return Err(format!(
                "{what}: connection closed after {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        got.extend_from_slice(&buf[..n]);
    }
    if started.elapsed() > limit {
        return Err(format!(
            "{what}: answered after {} ms (limit {})",
            started.elapsed().as_millis(),
            limit.as_millis()
        ));
    }
    Ok(got)
}

fn memcache(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: &str,
    expect: &str,
) -> Result<(), String> {
    // A value answer is whole at its END line; any other answer at its first line end.
    let got = exchange(limit, addr, what, request.as_bytes(), |g| {
        g.ends_with(b"\r\n") && (!g.starts_with(b"VALUE") || g.ends_with(b"END\r\n"))
    })?;
    if got != expect.as_bytes() {
        return Err(format!(
            "{what}: answered {:?}, expected {expect:?}",
            String::from_utf8_lossy(&got)
        ));
    }
    Ok(())
}

fn http(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: String,
    status: &str,
    body: &str,
) -> Result<(), String> {
    let got = exchange(limit, addr, what, request.as_bytes(), |g| {
        g.windows(4).any(|w| w == b"\r\n\r\n") && g.ends_with(body.as_bytes())
    })?;
    if !got.starts_with(format!("HTTP/1.1 {status}").as_bytes()) {
        return Err(format!(
            "{what}: answered {:?}",
            String::from_utf8_lossy(&got[..got.len().min(200)])
        ));
    }
    Ok(())
}

/// The canary through the server's own listeners; `token` is what [`CANARY_KEY`] must hold.
pub fn canary(
    config: &ringstore_config::Config,
    token: Option<&str>,
    limit: Duration,
) -> Result<String, String> {
    let started = Instant::now();
    let tag = format!(
        "{:x}",
        std::process::id() as u64 ^ started.elapsed().as_nanos() as u64 ^ 0x5eed
    );
    if let Some(addr) = config.memcache.map(local) {
        let key = format!("ringstore-canary-{tag}");
        memcache(
            limit,
            addr,
            "memcache set",
            &format!("set {key} 0 0 2\r\nok\r\n"),
            "STORED\r\n",
        )?;
        memcache(
            limit,
            addr,
            "memcache get",
            &format!("get {key}\r\n"),
            &format!("VALUE {key} 0 2\r\nok\r\nEND\r\n"),
        )?;
        memcache(
            limit,
            addr,
            "memcache delete",
            &format!("delete {key}\r\n"),
            "DELETED\r\n",
        )?;
        if let (Some(token), Some(_)) = (token, &config.data) {
            memcache(
                limit,
                addr,
                "data after recovery",
                &format!("get {CANARY_KEY}\r\n"),
                &format!("VALUE {CANARY_KEY} 0 {}\r\n{token}\r\nEND\r\n", token.len()),
            )?;
        }
    }
    if let Some(addr) = config.http.map(local) {
        let path = format!("/ringstore-canary-{tag}");
        http(
            limit,
            addr,
            "HTTP PUT",
            format!("PUT {path} HTTP/1.1\r\nHost: canary\r\nContent-Length: 2\r\n\r\nok"),
            "20",
            "",
        )?;
        http(
            limit,
            addr,
            "HTTP GET",
            format!("GET {path} HTTP/1.1\r\nHost: canary\r\n\r\n"),
            "200",
            "ok",
        )?;
        http(
            limit,
            addr,
            "HTTP DELETE",
            format!("DELETE {path} HTTP/1.1\r\nHost: canary\r\n\r\n"),
            "20",
            "",
        )?;
    }
    Ok(format!(
        "canary passed in {} ms",
        started.elapsed().as_millis()
    ))
}

/// After boot: on a trial, the verdict (commit, or record why and reboot to the old slot).
pub fn decide_trial() {
    let (trying, esp, booted, trial, token, config, ready, not_serving) = {
        let st = crate::state::lock();
        (
            st.slots.trying,
            st.slots.esp.clone(),
            st.slots.booted,
            st.slots.trial.clone(),
            st.slots.canary_token.clone(),
            st.config.clone(),
            st.ready_line.is_some(),
            st.not_serving.clone(),
        )
    };
    let (true, Some(esp), Some(booted), Some(trial)) = (trying, esp, booted, trial) else {
        return;
    };
    let verdict = match (ready, config) {
        (true, Some(config)) => canary(&config, token.as_deref(), CANARY_OP_LIMIT),
        _ => Err(format!(
            "never became ready: {}",
            not_serving.unwrap_or_else(|| "no ready line".into())
        )),
    };
    let fs = match esp_fs(&esp) {
        Ok(fs) => fs,
        Err(why) => {
            error!("update: {why}; cannot record the trial; rebooting to the old slot");
            crate::power::shutdown(crate::power::Action::Reboot);
        }
    };
    match verdict {
        Ok(note) => {
            let commit =
                write_text(&fs, slots::LOADER_CONF, &slots::loader_conf(booted)).and_then(|()| {
                    write_text(
                        &fs,
                        slots::TRIAL_FILE,
                        &Trial {
                            outcome: "committed".into(),
                            ..trial.clone()
                        }
                        .render(),
                    )
                });
            let _ = fat::remove_file(&fs, CANARY_TOKEN_FILE);
            let _ = fs.unmount();
            ringstore_sys::sync();
            match commit {
                Ok(()) => {
                    info!("update: {note}; slot {booted} committed");
                    let mut st = crate::state::lock();
                    st.slots.trying = false;
                    st.slots.committed = Some(booted);
                    st.slots.trial = Some(Trial {
                        outcome: "committed".into(),
                        ..trial
                    });
                }
                Err(why) => {
                    error!("update: commit failed: {why}; rebooting to the old slot");
                    crate::power::shutdown(crate::power::Action::Reboot);
                }
            }
        }
        Err(why) => {
            let outcome = format!("failed: {why}");
            let _ = write_text(
                &fs,
                slots::TRIAL_FILE,
                &Trial {
                    outcome: outcome.clone(),
                    ..trial
                }
                .render(),
            );
            let _ = fs.unmount();
            error!(
                "update: trial of slot {booted} {outcome}; rebooting to slot {}",
                booted.other()
            );
            crate::power::shutdown(crate::power::Action::Reboot);
        }
    }
}

/// `update URL`: fetch, verify, write the inactive slot, record the trial, reboot into it once.
pub fn update(url: &str) -> Vec<String> {
    match prepare(url) {
        Ok(target) => {
            info!("update: slot {target} written; rebooting into it for a trial");
            crate::power::shutdown(crate::power::Action::Reboot);
        }
        Err(why) => {
            error!("update refused: {why}");
            vec![format!("update refused: {why}")]
        }
    }
}

fn prepare(url: &str) -> Result<Slot, String> {
    let st = crate::state::lock().slots.clone();
    let (Some(esp), Some(booted)) = (st.esp.clone(), st.booted) else {
        return Err(
            "not booted from disk.img through systemd-boot (no ESP or no LoaderEntrySelected)"
                .into(),
        );
    };
    if st.trying {
        return Err("this boot is an uncommitted trial".into());
    }
    let key_text = std::fs::read_to_string(signature::PUBLIC_KEY_PATH).map_err(|e| {
        format!(
            "{}: {e} (image built without --signing-key: it takes no updates)",
            signature::PUBLIC_KEY_PATH
        )
    })?;
    let key = signature::public_key(&key_text).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let image = crate::fetch::get(url, IMAGE_MAX, FETCH_LIMIT).map_err(|e| e.to_string())?;
    let left = FETCH_LIMIT
        .saturating_sub(started.elapsed())
        .max(Duration::from_secs(5));
    let sig = crate::fetch::get(&format!("{url}.sig"), 1024, left).map_err(|e| e.to_string())?;
    let sig = String::from_utf8(sig).map_err(|_| "signature file is not text".to_string())?;
    signature::verify(&key, &image, &sig).map_err(|e| format!("{e}; nothing written"))?;
    if image.get(..2) != Some(b"MZ") {
        return Err("signed, but not an EFI application (no MZ header); nothing written".into());
    }
    info!(
        "update: {} bytes from {url}, signature verified",
        image.len()
    );
    let target = booted.other();
    let fs = esp_fs(&esp)?;
    fat::write_file(&fs, &target.path(), &image).map_err(|e| format!("ESP: {e}"))?;
    // The slot's tuned entry carried the old image's command line: its new image's first
    // committed boot writes its own.
    fat::remove_file(&fs, &target.tuned_entry_path()).map_err(|e| format!("ESP: {e}"))?;
    // Read it back: what boots must be what was verified.
    let back =
        fat::read_file(&fs, &target.path(), IMAGE_MAX as u64).map_err(|e| format!("ESP: {e}"))?;
    if back.as_deref() != Some(&image[..]) {
        return Err(format!("slot {target} reads back different bytes"));
    }
    let token = format!(
        "{:016x}",
        started.elapsed().as_nanos() as u64 ^ u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15
    );
    let config = crate::state::lock().config.clone();
    let mut wrote_token = false;
    if let Some(config) = config.filter(|c| c.data.is_some()) {
        if let Some(addr) = config.memcache.map(local) {
            memcache(
                CANARY_OP_LIMIT,
                addr,
                "canary key",
                &format!("set {CANARY_KEY} 0 0 {}\r\n{token}\r\n", token.len()),
                "STORED\r\n",
            )?;
            wrote_token = true;
        }
    }
    if wrote_token {
        write_text(&fs, CANARY_TOKEN_FILE, &token)?;
    } else {
        let _ = fat::remove_file(&fs, CANARY_TOKEN_FILE);
    }
    write_text(
        &fs,
        slots::TRIAL_FILE,
        &Trial {
            from: booted,
            to: target,
            outcome: "pending".into(),
        }
        .render(),
    )?;
    if let Err(why) = write_one_shot(target.entry_id()) {
        // Nothing will boot the new slot: the record must not say a trial is under way.
        let outcome = format!("failed: {why}");
        let _ = write_text(
            &fs,
            slots::TRIAL_FILE,
            &Trial {
                from: booted,
                to: target,
                outcome,
            }
            .render(),
        );
        let _ = fs.unmount();
        return Err(why);
    }
    fs.unmount().map_err(|e| format!("ESP: {e}"))?;
    ringstore_sys::sync();
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// A memcache and an HTTP listener that answer like the server, `token` under the canary
    /// key, every answer after `delay`.
    fn fake(token: &'static str, delay: Duration) -> (SocketAddr, SocketAddr) {
        let mc = TcpListener::bind("127.0.0.1:0").unwrap();
        let web = TcpListener::bind("127.0.0.1:0").unwrap();
        let (mc_addr, web_addr) = (mc.local_addr().unwrap(), web.local_addr().unwrap());
        std::thread::spawn(move || {
            for s in mc.incoming().flatten() {
                let mut r = std::io::BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                std::thread::sleep(delay);
                let words: Vec<&str> = line.split_whitespace().collect();
                let answer = match words.as_slice() {
                    ["set", ..] => {
                        let mut data = String::new();
                        let _ = r.read_line(&mut data);
                        "STORED\r\n".to_string()
                    }
                    ["get", key] if *key == CANARY_KEY => {
                        format!("VALUE {key} 0 {}\r\n{token}\r\nEND\r\n", token.len())
                    }
                    ["get", key] => format!("VALUE {key} 0 2\r\nok\r\nEND\r\n"),
                    ["delete", _] => "DELETED\r\n".to_string(),
                    _ => "ERROR\r\n".to_string(),
                };
                let _ = w.write_all(answer.as_bytes());
            }
        });
        std::thread::spawn(move || {
            for mut s in web.incoming().flatten() {
                let mut buf = [0u8; 2048];
                let n = s.read(&mut buf).unwrap_or(0);
                std::thread::sleep(delay);
                let answer: &[u8] = match &buf[..n.min(3)] {
                    b"PUT" => b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
                    b"GET" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    b"DEL" => b"HTTP/1.1 204 No Content\r\n\r\n",
                    _ => b"HTTP/1.1 400 Bad Request\r\n\r\n",
                };
                let _ = s.write_all(answer);
            }
        });
        (mc_addr, web_addr)
    }

    fn config(mc: SocketAddr, web: SocketAddr, data: bool) -> ringstore_config::Config {
        ringstore_config::Config {
            memcache: Some(mc),
            http: Some(web),
            data: data.then(|| "/dev/vda3".into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_canary_passes_through_answering_listeners() {
        let (mc, web) = fake("0123456789abcdef", Duration::ZERO);
        let note = canary(
            &config(mc, web, true),
            Some("0123456789abcdef"),
            CANARY_OP_LIMIT,
        )
        .unwrap();
        assert!(note.starts_with("canary passed in "), "{note}");
    }

    #[test]
    fn data_that_did_not_survive_fails_the_canary() {
        let (mc, web) = fake("something else!!", Duration::ZERO);
        let err = canary(
            &config(mc, web, true),
            Some("0123456789abcdef"),
            CANARY_OP_LIMIT,
        )
        .unwrap_err();
        assert!(err.starts_with("data after recovery: answered"), "{err}");
        // Without a data device the key is not asked for.
        assert!(canary(
            &config(mc, web, false),
            Some("0123456789abcdef"),
            CANARY_OP_LIMIT
        )
        .is_ok());
    }

    #[test]
    fn an_answer_slower_than_the_bound_fails_the_canary() {
        let limit = Duration::from_millis(300);
        let (mc, web) = fake("x", limit * 2);
        let err = canary(&config(mc, web, false), None, limit).unwrap_err();
        assert!(err.starts_with("memcache set:"), "{err}");
    }

    #[test]
    fn a_dead_listener_fails_the_canary() {
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let (_, web) = fake("x", Duration::ZERO);
        let err = canary(&config(gone, web, false), None, CANARY_OP_LIMIT).unwrap_err();
        assert!(err.starts_with("memcache set:"), "{err}");
    }

    #[test]
    fn one_shot_bytes_are_attributes_then_utf16() {
        let bytes = one_shot_bytes("ringstore-b.efi");
        assert_eq!(&bytes[..4], &[7, 0, 0, 0]);
        assert_eq!(bytes.len(), 4 + 2 * 16);
        assert_eq!(&bytes[4..6], &[b'r', 0]);
        assert_eq!(&bytes[bytes.len() - 2..], &[0, 0]);
    }
}
