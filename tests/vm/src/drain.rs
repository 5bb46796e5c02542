//! The runbook's "Drain a box from twemproxy, update it and put it back" (docs/OPERATIONS.md)
//! around the runbook test's update: nutcracker on the host, its pool written by
//! `cargo xtask scaleout` from an inventory of two servers, the QEMU box's forwarded memcache
//! port and a host `ringstore serve`; the box's line is removed and put back as the page says.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::client::{exchange, get_at, set_at, tcp};

/// Keys stored through the proxy: enough that both servers own some (ketama, two servers).
const KEYS: usize = 32;
/// nutcracker's wait for a reply: the box runs under TCG, slow but not that slow.
const TIMEOUT_MS: u32 = 5000;
/// nutcracker listening after a (re)start.
const LISTEN_LIMIT: Duration = Duration::from_secs(10);

/// The pool: the host server, nutcracker and what the keys stored before the drain were.
pub(super) struct Pool {
    dir: PathBuf,
    /// The twemproxy pool file `cargo xtask scaleout` wrote, which nutcracker reads.
    yml_file: PathBuf,
    /// `nutcracker.yml` as `cargo xtask scaleout` wrote it (both servers).
    yml: String,
    /// The box's server line in it.
    box_line: String,
    proxy: u16,
    box_port: u16,
    host_port: u16,
    nutcracker: Option<Child>,
    _host: crate::util::Server,
    /// Time in the proxy steps (the update not counted).
    spent: Duration,
    /// The keys each server holds (its own value `v1-KEY`), by direct gets.
    box_keys: Vec<String>,
    host_keys: Vec<String>,
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Inventory text of the pool: the box and a host peer, nutcracker on `proxy`.
fn inventory(proxy: u16, box_port: u16, host_port: u16) -> String {
    format!(
        "[scaleout]\nlisten = \"127.0.0.1:{proxy}\"\ntimeout_ms = {TIMEOUT_MS}\n\n\
         [[host]]\nmac = \"02:00:00:00:00:01\"\nhostname = \"box\"\n\
         ringstore = {{ memcache = \"127.0.0.1:{box_port}\" }}\n\n\
         [[host]]\nmac = \"02:00:00:00:00:02\"\nhostname = \"peer\"\n\
         ringstore = {{ memcache = \"127.0.0.1:{host_port}\" }}\n"
    )
}

impl Pool {
    /// Starts the host server and nutcracker for the pool of it and the box at `box_port`,
    /// stores [`KEYS`] keys through the proxy and reads which server took each.
    pub(super) fn start(binary: &Path, dir: &Path, box_port: u16) -> Result<Pool> {
        let started = Instant::now();
        let host = crate::util::Server::start(binary, &["--memory", "32MiB", "--cores", "1"])?;
        let host_port = host.memcache_host_port()?.1;
        let proxy = crate::qemu::free_port()?;
        let dir = dir.join("proxy");
        let text = inventory(proxy, box_port, host_port);
        let yml_file = crate::image::builder()?.scaleout(&text, &dir)?;
        let yml = std::fs::read_to_string(&yml_file)?;
        let box_line = format!("    - 127.0.0.1:{box_port}:1\n");
        ensure!(yml.contains(&box_line), "no {box_line:?} in\n{yml}");
        let mut pool = Pool {
            dir,
            yml_file,
            yml,
            box_line,
            proxy,
            box_port,
            host_port,
            nutcracker: None,
            _host: host,
            spent: Duration::ZERO,
            box_keys: Vec::new(),
            host_keys: Vec::new(),
        };
        pool.restart()?;
        let keys: Vec<String> = (0..KEYS).map(|i| format!("drain:{i}")).collect();
        for key in &keys {
            set_at(pool.proxy, key, &format!("v1-{key}"))?;
        }
        for key in keys {
            let own = Some(format!("v1-{key}"));
            match (get_at(box_port, &key)?, get_at(host_port, &key)?) {
                (b, None) if b == own => pool.box_keys.push(key),
                (None, h) if h == own => pool.host_keys.push(key),
                other => anyhow::bail!("{key} through the proxy: box/host hold {other:?}"),
            }
        }
        ensure!(
            !pool.box_keys.is_empty() && !pool.host_keys.is_empty(),
            "ketama put every key on one server: box {:?}, host {:?}",
            pool.box_keys,
            pool.host_keys
        );
        pool.spent += started.elapsed();
        Ok(pool)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.nutcracker.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// "restart `nutcracker`" with the `nutcracker.yml` now on disk; waits until it listens.
    fn restart(&mut self) -> Result<()> {
        self.stop();
        let stats = crate::qemu::free_port()?.to_string();
        let log = self.dir.join("nutcracker.log");
        let child = Command::new("/usr/sbin/nutcracker")
            .arg("-c")
            .arg(&self.yml_file)
            .args(["-s", &stats, "-a", "127.0.0.1", "-o"])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting /usr/sbin/nutcracker (Debian's nutcracker package)")?;
        self.nutcracker = Some(child);
        let deadline = Instant::now() + LISTEN_LIMIT;
        while TcpStream::connect(("127.0.0.1", self.proxy)).is_err() {
            ensure!(
                Instant::now() < deadline,
                "nutcracker not listening on {} within {} s; its log:\n{}",
                self.proxy,
                LISTEN_LIMIT.as_secs(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The box's line removed from `nutcracker.yml`, nutcracker restarted.
    fn without_box(&mut self) -> Result<()> {
        ensure!(
            self.yml.matches(&self.box_line).count() == 1,
            "the box's line is not in nutcracker.yml once"
        );
        self.write_yml(&self.yml.replace(&self.box_line, ""))?;
        self.restart()
    }

    fn write_yml(&self, yml: &str) -> Result<()> {
        Ok(std::fs::write(&self.yml_file, yml)?)
    }

    /// Step 1: the box's line removed, nutcracker restarted. Through the proxy the box's keys
    /// are misses and the host's hit; a box key written now (`v2`) goes to the host. That key.
    pub(super) fn drain(&mut self) -> Result<String> {
        let started = Instant::now();
        self.without_box()?;
        for key in &self.box_keys {
            let got = get_at(self.proxy, key)?;
            ensure!(got.is_none(), "drained: {key} through the proxy: {got:?}");
        }
        self.host_keys_hit("drained")?;
        let moved = self.box_keys[0].clone();
        set_at(self.proxy, &moved, &format!("v2-{moved}"))?;
        let on_host = get_at(self.host_port, &moved)?;
        ensure!(
            on_host == Some(format!("v2-{moved}")),
            "drained: {moved} written through the proxy, the host holds {on_host:?}"
        );
        self.spent += started.elapsed();
        Ok(moved)
    }

    fn host_keys_hit(&self, when: &str) -> Result<()> {
        for key in &self.host_keys {
            let got = get_at(self.proxy, key)?;
            ensure!(
                got == Some(format!("v1-{key}")),
                "{when}: {key} through the proxy: {got:?}"
            );
        }
        Ok(())
    }

    /// Step 3, after the update: the durable box still holds its keys, `moved` at its
    /// pre-drain (now stale) value; `flush_all` on its memcache port empties it.
    pub(super) fn flush_box(&mut self, moved: &str) -> Result<()> {
        let started = Instant::now();
        let stale = get_at(self.box_port, moved)?;
        ensure!(
            stale == Some(format!("v1-{moved}")),
            "updated box: {moved} is {stale:?}, not the copy it held when drained"
        );
        let flushed = exchange(&mut tcp(self.box_port)?, b"flush_all\r\n", |t| {
            t.ends_with("\r\n")
        })?;
        ensure!(flushed == "OK\r\n", "flush_all answered {flushed:?}");
        for key in &self.box_keys {
            let got = get_at(self.box_port, key)?;
            ensure!(got.is_none(), "flushed box: {key} is {got:?}");
        }
        self.spent += started.elapsed();
        Ok(())
    }

    /// Step 4: the line back, nutcracker restarted: the box's keys are misses through the
    /// proxy (the host's `v2` copy of `moved` is not read), the host's still hit, and a set
    /// through the proxy lands on the box. The host's copy of `moved` stays there: a second
    /// drain serves it. The summary line.
    pub(super) fn rejoin(&mut self, moved: &str) -> Result<String> {
        let started = Instant::now();
        self.write_yml(&self.yml)?;
        self.restart()?;
        for key in &self.box_keys {
            let got = get_at(self.proxy, key)?;
            ensure!(got.is_none(), "rejoined: {key} through the proxy: {got:?}");
        }
        self.host_keys_hit("rejoined")?;
        set_at(self.proxy, moved, &format!("v3-{moved}"))?;
        let on_box = get_at(self.box_port, moved)?;
        ensure!(
            on_box == Some(format!("v3-{moved}")),
            "rejoined: {moved} written through the proxy, the box holds {on_box:?}"
        );
        // The next drain serves the host's copy from the first one: v2, stale.
        self.without_box()?;
        let left = get_at(self.proxy, moved)?;
        ensure!(
            left == Some(format!("v2-{moved}")),
            "drained again: {moved} through the proxy is {left:?}, not the host's old copy"
        );
        self.spent += started.elapsed();
        Ok(format!(
            "drain: {} keys on the box, {} on the host, proxy steps {:.1} s",
            self.box_keys.len(),
            self.host_keys.len(),
            self.spent.as_secs_f64()
        ))
    }
}
