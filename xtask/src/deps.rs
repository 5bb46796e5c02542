//! Installs what the tests and benchmarks need on a fresh Debian 12 (bookworm) machine: the
//! kernel build needs `linux-source-6.12`, which bookworm gets from bookworm-backports.
//!
//! apt packages when root (otherwise the command to run is printed), the musl target
//! through rustup, cargo-fuzz from crates.io, and a Python virtual environment with the
//! real memcache client used by the end-to-end tests; the binary-protocol clients of
//! tests/e2e/test_binary_clients.py come from Debian (Dalli, pylibmc, php-memcached).

use crate::util::{exec, have, is_root, root};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages: programs we test against or drive (memcached, memccapable, curl, wrk,
/// nginx, QEMU, the binary-protocol memcache clients) and what building the kernel needs.
pub const APT_PACKAGES: &[(&str, &str)] = &[
    ("memcached", "/usr/bin/memcached"),
    ("libmemcached-tools", "/usr/bin/memccapable"),
    ("curl", "/usr/bin/curl"),
    // ssh-agent and ssh-add: the console client's agent signing test (ringstore-console).
    ("openssh-client", "/usr/bin/ssh-agent"),
    ("wrk", "/usr/bin/wrk"),
    ("nginx-light", "/usr/sbin/nginx"),
    // The certificate `cargo xtask bench --only tls` makes per run (tests/bench/src/tls_part.rs).
    ("openssl", "/usr/bin/openssl"),
    // tests/e2e/test_log_sink.py: the syslog receiver of --log-sink, with gtls for tls:// (ADR 0045).
    ("rsyslog", "/usr/sbin/rsyslogd"),
    (
        "rsyslog-gnutls",
        "/usr/lib/x86_64-linux-gnu/rsyslog/lmnsd_gtls.so",
    ),
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("ovmf", "/usr/share/OVMF/OVMF_CODE_4M.fd"),
    // The UKI stub and the boot manager of disk.img (ADR 0024, 0025).
    (
        "systemd-boot-efi",
        "/usr/lib/systemd/boot/efi/linuxx64.efi.stub",
    ),
    // Secure Boot (ADR 0051): sbsign/sbverify sign and check the EFI binaries of disk.img,
    // efitools writes the PK/KEK/db signature lists `cargo xtask keygen --secure-boot` makes.
    ("sbsigntool", "/usr/bin/sbsign"),
    ("efitools", "/usr/bin/cert-to-efi-sig-list"),
    // The TPM 2.0 the data-key sealing tests talk to (ringstore-tpm, tests/vm/src/tpm.rs).
    ("swtpm", "/usr/bin/swtpm"),
    ("linux-source-6.12", "/usr/src/linux-source-6.12.tar.xz"),
    ("bc", "/usr/bin/bc"),
    ("flex", "/usr/bin/flex"),
    ("bison", "/usr/bin/bison"),
    ("libelf-dev", "/usr/include/libelf.h"),
    ("libssl-dev", "/usr/include/openssl/ssl.h"),
    ("cpio", "/usr/bin/cpio"),
    ("musl-tools", "/usr/bin/musl-gcc"),
    ("iproute2", "/usr/sbin/ip"),
    // The PXE QEMU test: the NIC option ROMs with iPXE (QEMU recommends it; installed
    // without recommends here). Scale-out: twemproxy, the e2e test's proxy.
    ("ipxe-qemu", "/usr/lib/ipxe/qemu/pxe-virtio.rom"),
    ("nutcracker", "/usr/sbin/nutcracker"),
    // The runbook QEMU test runs OPERATIONS.md's re-signing commands (xxd, openssl) as printed.
    ("xxd", "/usr/bin/xxd"),
    // The AF_XDP veth tests turn the sender's TX checksum offload off.
    ("ethtool", "/usr/sbin/ethtool"),
    // ...and check that ICMP still reaches the kernel with the program attached.
    ("iputils-ping", "/usr/bin/ping"),
    // Binary-protocol clients: Dalli 3.0.6 (the package does not pull in ruby itself),
    // pylibmc for the system python3, php-memcached for PHP 8.2 (Debian 12).
    ("ruby", "/usr/bin/ruby"),
    (
        "ruby-dalli",
        "/usr/share/rubygems-integration/all/gems/dalli-3.0.6/lib/dalli.rb",
    ),
    (
        "python3-pylibmc",
        "/usr/lib/python3/dist-packages/pylibmc/__init__.py",
    ),
    ("php-cli", "/usr/bin/php"),
    ("php-memcached", "/etc/php/8.2/mods-available/memcached.ini"),
    // tests/e2e/test_metrics.py: a real Prometheus scrapes /metrics (issue 33).
    ("prometheus", "/usr/bin/prometheus"),
    // The container image's test (cargo xtask oci, ADR 0034): podman runs it, skopeo reads it.
    // netavark (podman's network) needs iptables; runc where crun refuses the cgroup layout.
    ("podman", "/usr/bin/podman"),
    ("skopeo", "/usr/bin/skopeo"),
    ("iptables", "/usr/sbin/iptables"),
    ("runc", "/usr/sbin/runc"),
    // The durable bench's peer (Redis 7, appendfsync always).
    ("redis-server", "/usr/bin/redis-server"),
    // tests/e2e/test_auth.py: saslpasswd2 writes the sasldb memcached -S checks PLAIN against.
    ("sasl2-bin", "/usr/sbin/saslpasswd2"),
    // TLS tests (ringstore-tls, tests/e2e/test_tls.py): throwaway CAs and certificates.
    ("openssl", "/usr/bin/openssl"),
    // tests/e2e/test_tls_clients.py: HTTPS downloads with the test CA (curl is above; Dalli
    // 3.0.6 with ssl_context is ruby-dalli above).
    ("aria2", "/usr/bin/aria2c"),
    ("wget", "/usr/bin/wget"),
    // tests/e2e/test_memcached_t.py: memcached's own t/*.t files. dpkg-source unpacks the
    // source package apt-get fetches, cc builds its timedrun, the harness's TLS client is
    // IO::Socket::SSL (prove comes with perl).
    ("dpkg-dev", "/usr/bin/dpkg-source"),
    ("gcc", "/usr/bin/cc"),
    ("libio-socket-ssl-perl", "/usr/share/perl5/IO/Socket/SSL.pm"),
    // The Perl clients of tests/clients/perl_idle.pl (idle connections, issue 25).
    (
        "libcache-memcached-fast-perl",
        "/usr/lib/x86_64-linux-gnu/perl5/5.36/Cache/Memcached/Fast.pm",
    ),
    (
        "libcache-memcached-perl",
        "/usr/share/perl5/Cache/Memcached.pm",
    ),
];

/// Python packages for the end-to-end tests, pinned.
const PIP_PACKAGES: &[&str] = &[
    "pymemcache==4.0.0",
    "pytest==8.3.4",
    // tests/e2e/test_auth.py: a binary-protocol client with SASL PLAIN.
    "python-binary-memcached==0.33.0",
    // tests/e2e/test_tls.py: the throwaway CA and certificates.
    "cryptography==44.0.0",
];

/// Installs every missing apt package in one `apt-get install`.
pub fn apt() -> Result<()> {
    let mut missing: Vec<&str> = APT_PACKAGES
        .iter()
        .filter(|(_, probe)| !std::path::Path::new(probe).exists())
        .map(|(name, _)| *name)
        .collect();
    if !python_has_venv() {
        missing.push("python3-venv");
    }
    if missing.is_empty() {
        return Ok(());
    }
    let qemu_from_backports = missing.contains(&"qemu-system-x86") && qemu_utils_from_backports();
    let names: Vec<String> = missing
        .iter()
        .map(|&name| match name {
            // QEMU's system emulator must match the qemu-utils already installed: bookworm's 7.2
            // cannot be installed beside backports' 10.x (it conflicts with its common files).
            "qemu-system-x86" if qemu_from_backports => "qemu-system-x86/bookworm-backports".into(),
            other => other.to_string(),
        })
        .collect();
    let install = format!(
        "{APT_GET} update -qq && DEBIAN_FRONTEND=noninteractive {APT_GET} install -y -qq --no-install-recommends {}",
        names.join(" "),
        APT_GET = crate::kernel::APT_GET
    );
    if !is_root() {
        bail!("missing packages; run as root:\n  {install}");
    }
    if missing.contains(&crate::kernel::SOURCE_PACKAGE) || qemu_from_backports {
        debian12_backports()?;
    }
    exec(Command::new("sh").args(["-c", &install]))
}

/// Whether the installed qemu-utils came from bookworm-backports (a `~bpo12` version).
fn qemu_utils_from_backports() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "qemu-utils"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("bpo12"))
}

/// Where Debian 12 gets linux-source-6.12 (its own archive has 6.1) and the QEMU that matches
/// a backports qemu-utils: bookworm-backports. Adds that suite when this is bookworm and no
/// configured source is it.
const BACKPORTS_SOURCES: &str = "/etc/apt/sources.list.d/ringstore-bookworm-backports.sources";

fn debian12_backports() -> Result<()> {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    if !os.lines().any(|l| l == "VERSION_CODENAME=bookworm") {
        return Ok(());
    }
    let policy = Command::new("apt-cache")
        .arg("policy")
        .output()
        .context("apt-cache policy")?;
    if String::from_utf8_lossy(&policy.stdout).contains("bookworm-backports") {
        return Ok(());
    }
    eprintln!("deps: adding bookworm-backports ({BACKPORTS_SOURCES})");
    std::fs::write(
        BACKPORTS_SOURCES,
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\n\
         Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )
    .with_context(|| format!("writing {BACKPORTS_SOURCES}"))?;
    Ok(())
}

fn python_has_venv() -> bool {
    Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `rustup target add` for the static appliance binary.
pub fn musl_target() -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    if let Ok(out) = out {
        if String::from_utf8_lossy(&out.stdout).contains("x86_64-unknown-linux-musl") {
            return Ok(());
        }
    }
    exec(Command::new("rustup").args(["target", "add", "x86_64-unknown-linux-musl"]))
}

/// cargo-fuzz on the nightly toolchain (installed from crates.io when missing).
pub fn cargo_fuzz() -> Result<()> {
    let ok = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        return Ok(());
    }
    exec(Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))
}

/// A virtual environment under `target/py` with the pinned test clients; returns its python.
pub fn python_env() -> Result<PathBuf> {
    let venv = root().join("target/py");
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".installed-{}", PIP_PACKAGES.join(",")));
    if marker.exists() {
        return Ok(python);
    }
    if !python.exists() {
        exec(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(PIP_PACKAGES);
    exec(&mut pip)?;
    std::fs::write(&marker, b"").context("writing the venv marker")?;
    Ok(python)
}

/// Everything the full test run needs.
pub fn all() -> Result<()> {
    apt()?;
    musl_target()?;
    cargo_fuzz()?;
    if !have("memccapable") {
        bail!("memccapable not found after installing libmemcached-tools");
    }
    Ok(())
}
