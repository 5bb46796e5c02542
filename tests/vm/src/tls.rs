//! The appliance serving TLS: disk.img under OVMF with certificates on its config partition
//! (`/tls/cert.pem`, `/tls/key.pem`) serves memcache over TLS and HTTPS through forwarded
//! ports with kernel TLS in use (`stats` says so), `status` shows the certificate, and a
//! new certificate written to the partition is picked up by the console's `certs reload`:
//! the open session keeps working on the old one, new handshakes get the new one (which
//! expires in 10 days: `status` and `tuning` warn). A second boot with
//! `tls_kernel_offload = "off"` times the same 512 KiB GETs in user space: the ratio is
//! the in-guest comparison (no absolute numbers: TCG). Both kernel-TLS boots (io_uring, then
//! `io = "epoll"`) also see clients that reset right after their Finished and a normal session
//! after them that still gets kernel TLS (`ktls_reset.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use super::client::{exchange, tcp};
use super::ktls_reset::resets_leave_kernel_tls_on;
use super::tls_client::{ask, connect, tls_set_get, Tls};
use super::uefi::{test_images, UefiMachine};
use super::vm::{scratch_dir, Vm};
use super::{BOOT_LIMIT, PROMPT};
use crate::image::Image;
use crate::qemu::{free_port, Forward};

const MEMCACHE_TLS: u16 = 11212;
const HTTPS: u16 = 8443;
const BIG: usize = 512 << 10;
const BIG_GETS: usize = 12;

/// One certificate made for this run: its files and a client that trusts only it.
struct Cert {
    pem: Vec<u8>,
    key: Vec<u8>,
    client: Arc<ClientConfig>,
    https_client: Arc<ClientConfig>,
}

fn make_cert(dir: &Path, cn: &str, days: u32) -> Result<Cert> {
    let (cert, key) = (dir.join(format!("{cn}.pem")), dir.join(format!("{cn}.key")));
    crate::util::exec(&mut ringstore_testkit::tls::self_signed_command(
        &cert, &key, cn, days,
    ))
    .context("openssl req (apt install openssl)")?;
    Ok(Cert {
        pem: std::fs::read(&cert)?,
        key: std::fs::read(&key)?,
        client: ringstore_testkit::tls::client_config(&cert, None, false)?,
        https_client: ringstore_testkit::tls::client_config(&cert, Some(b"http/1.1"), false)?,
    })
}

/// `BIG_GETS` GETs of the 512 KiB value `big` over one TLS session; their wall time.
fn time_big_gets(port: u16, cert: &Cert) -> Result<Duration> {
    let mut tls = connect(port, &cert.client)?;
    let want = BIG + "VALUE big 0 524288\r\n\r\nEND\r\n".len();
    let started = Instant::now();
    for _ in 0..BIG_GETS {
        let got = ask(&mut tls, b"get big\r\n", |t| t.len() >= want)?;
        ensure!(
            got.len() == want && got.ends_with(b"\r\nEND\r\n"),
            "{} bytes",
            got.len()
        );
    }
    Ok(started.elapsed())
}

/// The 512 KiB value `big`, set in the clear.
fn set_big(port: u16) -> Result<()> {
    let mut plain = tcp(port)?;
    let mut set = format!("set big 0 0 {BIG}\r\n").into_bytes();
    set.extend_from_slice(&vec![b'v'; BIG]);
    set.extend_from_slice(b"\r\n");
    let stored = exchange(&mut plain, &set, |t| t.ends_with("\r\n"))?;
    ensure!(stored == "STORED\r\n", "set big: {stored:?}");
    Ok(())
}

fn boot(machine: &UefiMachine, name: &str) -> Result<Vm> {
    let forwards = [
        ("memcache", 11211),
        ("http", 8080),
        ("memcache-tls", MEMCACHE_TLS),
        ("https", HTTPS),
    ]
    .into_iter()
    .map(|(name, guest_port)| {
        Ok(Forward {
            nic: 0,
            name: name.into(),
            guest_port,
            host_port: free_port()?,
        })
    })
    .collect::<Result<Vec<_>>>()?;
    let dir = scratch_dir(name)?;
    let socket = dir.join("serial.sock");
    let args = super::uefi::uefi_args(&machine.disk, &machine.vars, &socket, &forwards);
    let mut vm = Vm::start(name, dir, &socket, &args, forwards, None)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, Duration::from_secs(20))?;
    Ok(vm)
}

fn write_certs(machine: &UefiMachine, cert: &Cert) -> Result<()> {
    machine.write_config_file("tls/cert.pem", &cert.pem)?;
    machine.write_config_file("tls/key.pem", &cert.key)
}

fn stat_at_least(vm: &mut Vm, name: &str, min: u64) -> Result<u64> {
    let stats = vm.command("stats")?;
    let n = super::console::stat(&stats, name)
        .and_then(|v| v.parse::<u64>().ok())
        .with_context(|| format!("no {name} in stats:\n{stats}"))?;
    ensure!(n >= min, "{name} {n}, wanted at least {min}:\n{stats}");
    Ok(n)
}

/// HTTPS: PUT then GET of one object, on one session.
fn https_put_get(port: u16, cert: &Cert) -> Result<()> {
    let name = ServerName::try_from("localhost")?;
    let conn = ClientConnection::new(cert.https_client.clone(), name)?;
    let mut tls = StreamOwned::new(conn, tcp(port)?);
    let head_done = |t: &[u8]| t.windows(4).any(|w| w == b"\r\n\r\n");
    let put = ask(
        &mut tls,
        b"PUT /tlsobject HTTP/1.1\r\nHost: vm\r\nContent-Length: 6\r\n\r\nsecret",
        head_done,
    )?;
    ensure!(put.starts_with(b"HTTP/1.1 20"), "PUT over HTTPS: {put:?}");
    let get = ask(
        &mut tls,
        b"GET /tlsobject HTTP/1.1\r\nHost: vm\r\n\r\n",
        |t| t.ends_with(b"secret"),
    )?;
    ensure!(get.starts_with(b"HTTP/1.1 200"), "GET over HTTPS: {get:?}");
    Ok(())
}

/// The test (see the file's comment). Returns the in-guest ratio line.
pub fn serves_tls_with_kernel_offload_and_rotates(image: &Image) -> Result<String> {
    let dir = scratch_dir("tls-certs")?;
    let old = make_cert(&dir, "ringstore-old", 365)?;
    let new = make_cert(&dir, "ringstore-new", 10)?;
    let images = test_images(image, "tls", "")?;
    let machine = UefiMachine::new("tls", &images)?;
    machine.write_config(&format!(
        "memcache_tls = \"0.0.0.0:{MEMCACHE_TLS}\"\nhttps = \"0.0.0.0:{HTTPS}\"\n"
    ))?;
    write_certs(&machine, &old)?;
    let mut vm = boot(&machine, "tls_kernel")?;
    ensure!(
        vm.output().contains("tls with kernel offload (CONFIG_TLS)"),
        "no kernel TLS line:\n{}",
        vm.tail()
    );
    let status = vm.json("status")?;
    let cert = &status[0]["tls_cert"];
    ensure!(
        cert["subject"] == "CN=ringstore-old" && cert["warning"].is_null(),
        "status tls_cert: {cert}"
    );
    let port = vm.port("memcache-tls", 0)?;
    let mut before = connect(port, &old.client)?;
    tls_set_get(&mut before, "tlskey", "over-kernel-tls")?;
    https_put_get(vm.port("https", 0)?, &old)?;
    let ktls = stat_at_least(&mut vm, "tls_ktls_tx", 2)?;
    stat_at_least(&mut vm, "tls_ktls_rx", 2)?;
    let resets = resets_leave_kernel_tls_on(&mut vm, port, &old.client)?;
    let tls12 = super::tls12::full_and_resumed(&mut vm, port, &dir.join("ringstore-old.pem"))?;
    // Read over TLS: sent from the item, sealed by the kernel.
    set_big(vm.port("memcache", 0)?)?;
    let kernel_time = time_big_gets(port, &old)?;
    rotate(&mut vm, &machine, &mut before, &old, &new)?;
    vm.poweroff()?;
    let (epoll_time, epoll_resets) = epoll_boot(&machine, &new)?;
    let user_time = user_space_boot(&machine, &new)?;
    Ok(format!(
        "{ktls} sessions in kernel TLS; {tls12}; io_uring: {resets}; epoll: {epoll_resets}; {BIG_GETS} GETs of 512 KiB: kernel TLS {:.2} s (epoll runtime {:.2} s), user space {:.2} s: kernel offload {:.2}x",
        kernel_time.as_secs_f64(),
        epoll_time.as_secs_f64(),
        user_time.as_secs_f64(),
        user_time.as_secs_f64() / kernel_time.as_secs_f64()
    ))
}

/// The epoll runtime under kernel TLS: a boot with `io = "epoll"` (the key behind
/// `ringstore.io=epoll`) whose memcache and HTTPS sessions are handed to the kernel, where
/// reset clients fall back one by one, and the 512 KiB GETs are timed.
fn epoll_boot(machine: &UefiMachine, cert: &Cert) -> Result<(Duration, String)> {
    machine.write_config(&format!(
        "memcache_tls = \"0.0.0.0:{MEMCACHE_TLS}\"\nhttps = \"0.0.0.0:{HTTPS}\"\nio = \"epoll\"\n"
    ))?;
    let mut vm = boot(machine, "tls_epoll")?;
    ensure!(
        vm.output().contains("tls with kernel offload (CONFIG_TLS)"),
        "no kernel TLS line on epoll:\n{}",
        vm.tail()
    );
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "io_runtime") == Some("epoll"),
        "io = \"epoll\" did not run the epoll runtime:\n{stats}"
    );
    let port = vm.port("memcache-tls", 0)?;
    let mut session = connect(port, &cert.client)?;
    tls_set_get(&mut session, "epollkey", "kernel-tls-on-epoll")?;
    https_put_get(vm.port("https", 0)?, cert)?;
    stat_at_least(&mut vm, "tls_ktls_tx", 2)?;
    stat_at_least(&mut vm, "tls_ktls_rx", 2)?;
    let resets = resets_leave_kernel_tls_on(&mut vm, port, &cert.client)?;
    tls_set_get(&mut session, "epollkey", "first-session-still-served")?;
    set_big(vm.port("memcache", 0)?)?;
    let took = time_big_gets(port, cert)?;
    vm.poweroff()?;
    Ok((took, resets))
}

/// A new certificate on the partition, `certs reload`: the open session goes on, new ones
/// see the new certificate (a client trusting only the old one is refused), the warnings.
fn rotate(
    vm: &mut Vm,
    machine: &UefiMachine,
    before: &mut Tls,
    old: &Cert,
    new: &Cert,
) -> Result<()> {
    write_certs(machine, new)?;
    let reloaded = vm.command("certs reload")?;
    ensure!(
        reloaded.contains("reloaded") && reloaded.contains("CN=ringstore-new"),
        "certs reload:\n{reloaded}"
    );
    ensure!(
        reloaded.contains("WARNING"),
        "no warning for 10 days:\n{reloaded}"
    );
    tls_set_get(before, "tlskey", "old-session-still-works")?;
    let port = vm.port("memcache-tls", 0)?;
    ensure!(
        connect(port, &old.client).is_err(),
        "a new handshake still got the old certificate"
    );
    let mut after = connect(port, &new.client)?;
    tls_set_get(&mut after, "tlskey", "new-certificate")?;
    let status = vm.json("status")?;
    let cert = &status[0]["tls_cert"];
    ensure!(
        cert["subject"] == "CN=ringstore-new" && !cert["warning"].is_null(),
        "status tls_cert after the reload: {cert}"
    );
    let tuning = vm.command("tuning")?;
    ensure!(
        tuning
            .lines()
            .any(|l| l.starts_with("DIFF tls_cert") && l.contains("CN=ringstore-new")),
        "tuning does not warn:\n{tuning}"
    );
    Ok(())
}

/// The same build with `tls_kernel_offload = "off"`: the 512 KiB GETs in user space.
fn user_space_boot(machine: &UefiMachine, cert: &Cert) -> Result<Duration> {
    machine.write_config(&format!(
        "memcache_tls = \"0.0.0.0:{MEMCACHE_TLS}\"\nhttps = \"0.0.0.0:{HTTPS}\"\ntls_kernel_offload = \"off\"\n"
    ))?;
    let mut vm = boot(machine, "tls_user")?;
    ensure!(
        vm.output()
            .contains("tls in user space (tls-kernel-offload off)"),
        "no user-space TLS line:\n{}",
        vm.tail()
    );
    set_big(vm.port("memcache", 0)?)?;
    let took = time_big_gets(vm.port("memcache-tls", 0)?, cert)?;
    let stats = vm.command("stats")?;
    ensure!(
        super::console::stat(&stats, "tls_ktls_tx") == Some("0"),
        "kernel TLS used with tls_kernel_offload off:\n{stats}"
    );
    vm.poweroff()?;
    Ok(took)
}
