//! The servers under test as pinned child processes (killed when dropped, so every error path
//! cleans up), and the /proc readings the benchmark takes from them: CPU time and RSS.

use anyhow::{bail, Context, Result};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The CPU the servers run on.
pub const SERVER_CPU: usize = 0;
/// The CPU the load generators run on.
pub const CLIENT_CPU: usize = 1;
/// Nice value of every server and client of the benchmark: ahead of other users' nice-0 work
/// on a shared machine (the same for every server, so the comparison stays fair).
pub const BENCH_NICE: i32 = -15;

/// How a server was started.
enum Process {
    Child(Child),
    Ringstore(crate::util::Server),
}

/// A server pinned to `SERVER_CPU`; killed and reaped on drop.
pub struct Pinned {
    pub name: &'static str,
    process: Process,
    /// Memcache port (memcached, ringstore) or HTTP port (nginx).
    pub port: u16,
    /// ringstore's HTTP port.
    pub http_port: Option<u16>,
    /// The command line it was started with (for the report).
    pub command: String,
}

impl Pinned {
    pub fn pid(&self) -> u32 {
        match &self.process {
            Process::Child(child) => child.id(),
            Process::Ringstore(server) => server.pid(),
        }
    }

    /// A ringstore's `name=IP:PORT` endpoint from its ready line (`memcache_tls`, `https`).
    pub fn endpoint(&self, name: &str) -> Result<u16> {
        match &self.process {
            Process::Ringstore(server) => Ok(server.endpoint(name)?.1),
            Process::Child(_) => bail!("{} has no ready line", self.name),
        }
    }

    /// Fails when the process has exited (a crash under load must not read as a slow server).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Process::Child(child) = &mut self.process {
            if let Some(status) = child.try_wait()? {
                bail!("{} exited: {status}", self.name);
            }
        }
        // An exited child that nobody has reaped yet is a zombie ('Z') until its owner waits.
        let state = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            });
        match state.as_deref() {
            Some("Z" | "X") | None => bail!("{} exited", self.name),
            Some(_) => Ok(()),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // util::Server kills and reaps itself when dropped.
        if let Process::Child(child) = &mut self.process {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A port that was free a moment ago (for servers that cannot be told to pick one).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_for_port(server: &mut Pinned, port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        server.check_alive()?;
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} did not listen on port {port} within 10 s", server.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `program arg arg ...` as a shell user would type it (for logs and the report).
pub fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

fn pinned(cpu: usize, program: &str) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &cpu.to_string(), program]);
    cmd
}

/// memcached with one worker thread on `SERVER_CPU`, TCP only, `memory_mib` of item memory.
pub fn start_memcached(memory_mib: u64) -> Result<Pinned> {
    start_memcached_threads(memory_mib, 1)
}

/// CPUs `SERVER_CPU..SERVER_CPU + count` as a taskset list.
fn server_cpus(count: usize) -> String {
    (SERVER_CPU..SERVER_CPU + count)
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// memcached with `threads` worker threads on the first `threads` server CPUs.
pub fn start_memcached_threads(memory_mib: u64, threads: usize) -> Result<Pinned> {
    let port = free_port()?;
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &server_cpus(threads), "memcached"]);
    cmd.args([
        "-t",
        &threads.to_string(),
        "-U",
        "0",
        "-l",
        "127.0.0.1",
        "-c",
        "4096",
    ])
    .args(["-p", &port.to_string(), "-m", &memory_mib.to_string()]);
    if crate::util::is_root() {
        cmd.args(["-u", "root"]);
    }
    eprintln!("+ {}", command_line(&cmd));
    spawn_listening("memcached", cmd, port).context("starting memcached (apt install memcached)")
}

/// memcached `-Z` with one worker thread on `SERVER_CPU`: TLS with `cert`/`key` on the
/// returned server's port, plain TCP on `plain_port` (`-l notls:...`, for the preload), and
/// `ssl_session_cache` on (server-side resumption, as ringstore has).
pub fn start_memcached_tls(
    memory_mib: u64,
    cert: &Path,
    key: &Path,
    plain_port: u16,
) -> Result<Pinned> {
    let port = free_port()?;
    let mut cmd = pinned(SERVER_CPU, "memcached");
    cmd.args([
        "-t",
        "1",
        "-U",
        "0",
        "-c",
        "4096",
        "-m",
        &memory_mib.to_string(),
    ])
    .args(["-p", &port.to_string(), "-l"])
    .arg(format!("127.0.0.1:{port},notls:127.0.0.1:{plain_port}"))
    .arg("-Z")
    .arg("-o")
    .arg(format!(
        "ssl_chain_cert={},ssl_key={},ssl_session_cache",
        cert.display(),
        key.display()
    ));
    if crate::util::is_root() {
        cmd.args(["-u", "root"]);
    }
    eprintln!("+ {}", command_line(&cmd));
    spawn_listening("memcached", cmd, port).context("starting memcached -Z")
}

/// Spawns `cmd` (stdin and stdout closed), waits until it listens on `port`, raises it.
pub fn spawn_listening(name: &'static str, mut cmd: Command, port: u16) -> Result<Pinned> {
    let command = command_line(&cmd);
    let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn()?;
    let mut server = Pinned {
        name,
        process: Process::Child(child),
        port,
        http_port: None,
        command,
    };
    wait_for_port(&mut server, port)?;
    raise_priority(server.pid());
    Ok(server)
}

/// `ringstore serve --cores 1` (started by `util::Server`, which parses its ready line), then
/// every thread of it moved to `SERVER_CPU` with `taskset -a -p`.
pub fn start_ringstore(binary: &Path, memory_mib: u64) -> Result<Pinned> {
    start_ringstore_with(binary, memory_mib, &[])
}

/// `start_ringstore` with more flags (e.g. `--data PATH`).
pub fn start_ringstore_with(binary: &Path, memory_mib: u64, more: &[&str]) -> Result<Pinned> {
    start_ringstore_workers(binary, memory_mib, 1, more)
}

/// `ringstore serve --cores workers`: one worker moves every thread to `SERVER_CPU`; more
/// workers keep ringstore's own placement (one pinned worker per CPU, from CPU 0).
pub fn start_ringstore_workers(
    binary: &Path,
    memory_mib: u64,
    workers: usize,
    more: &[&str],
) -> Result<Pinned> {
    let memory = format!("{memory_mib}MiB");
    let cores = workers.to_string();
    let mut extra = vec!["--cores", cores.as_str(), "--memory", memory.as_str()];
    extra.extend_from_slice(more);
    let started = crate::util::Server::start(binary, &extra)?;
    let (_, port) = started.memcache_host_port()?;
    let (_, http_port) = started.endpoint("http")?;
    let pid = started.pid();
    let mut server = Pinned {
        name: "ringstore",
        process: Process::Ringstore(started),
        port,
        http_port: Some(http_port),
        command: format!(
            "{} serve --memcache 127.0.0.1:0 --http 127.0.0.1:0 {} && taskset -a -p -c {SERVER_CPU} PID",
            binary.display(),
            extra.join(" ")
        ),
    };
    if workers == 1 {
        crate::util::exec(
            Command::new("taskset")
                .args(["-a", "-p", "-c", &SERVER_CPU.to_string(), &pid.to_string()])
                .stdout(Stdio::null()),
        )?;
    } else {
        server.command = format!(
            "{} serve --memcache 127.0.0.1:0 --http 127.0.0.1:0 {} (its own worker placement)",
            binary.display(),
            extra.join(" ")
        );
    }
    raise_priority(pid);
    server.check_alive()?;
    Ok(server)
}

/// The floor server (floor.rs) for one memcache cell, this bench binary itself.
pub fn start_floor(op: super::mcwire::Op, value_len: usize) -> Result<Pinned> {
    let port = free_port()?;
    let exe = std::env::current_exe().context("the bench binary")?;
    let mut cmd = pinned(SERVER_CPU, &exe.to_string_lossy());
    let Some(op_name) = op.token() else {
        bail!("the floor server speaks memcache only")
    };
    cmd.args(["floor", "--port", &port.to_string(), "--op", op_name])
        .args(["--value-len", &value_len.to_string()]);
    spawn_listening("floor", cmd, port).context("starting the floor server")
}

/// Redis with its append-only file in `dir`: `appendonly yes`, `appendfsync always` (every
/// acknowledged write fsynced first), no RDB snapshots, every thread on `SERVER_CPU`.
pub fn start_redis(dir: &Path) -> Result<Pinned> {
    let port = free_port()?;
    let mut cmd = pinned(SERVER_CPU, "redis-server");
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ])
        .args([
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ])
        .arg("--dir")
        .arg(dir);
    eprintln!("+ {}", command_line(&cmd));
    spawn_listening("redis", cmd, port).context("starting redis-server (apt install redis-server)")
}

/// nginx in single-process mode (one process serves) with `conf`, on `SERVER_CPU`.
pub fn start_nginx(conf: &Path, prefix: &Path, port: u16) -> Result<Pinned> {
    let mut cmd = pinned(SERVER_CPU, "nginx");
    cmd.arg("-c").arg(conf).arg("-p").arg(prefix);
    let command = command_line(&cmd);
    eprintln!("+ {command}");
    let child = cmd
        .stdin(Stdio::null())
        .spawn()
        .context("starting nginx (apt install nginx-light)")?;
    let mut server = Pinned {
        name: "nginx",
        process: Process::Child(child),
        port,
        http_port: None,
        command,
    };
    wait_for_port(&mut server, port)?;
    raise_priority(server.pid());
    Ok(server)
}

/// Clock ticks per second of the /proc CPU times.
pub fn ticks_per_second() -> f64 {
    let ticks = rustix::param::clock_ticks_per_second();
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Fields of a /proc stat file after the `(comm)` field, which may hold spaces.
fn stat_fields(path: &str) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let after = text.rsplit_once(')').context("stat without comm")?.1;
    // Field 3 (state) is not a number; keep positions by mapping it to 0.
    Ok(after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect())
}

/// utime + stime of a whole process (every thread), in seconds.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let f = stat_fields(&format!("/proc/{pid}/stat"))?;
    // Fields 14 and 15 of stat(5); index 0 here is field 3.
    Ok((f[11] + f[12]) as f64 / ticks_per_second())
}

/// CPU seconds of the calling thread.
pub fn thread_cpu_seconds() -> Result<f64> {
    let f = stat_fields("/proc/thread-self/stat")?;
    Ok((f[11] + f[12]) as f64 / ticks_per_second())
}

/// CPU seconds of this process's waited-for children (fields 16 and 17: cutime + cstime).
pub fn children_cpu_seconds() -> Result<f64> {
    let f = stat_fields("/proc/self/stat")?;
    Ok((f[13] + f[14]) as f64 / ticks_per_second())
}

/// Busy and total clock ticks of one CPU from /proc/stat. Busy includes softirq time, where
/// loopback TCP does much of its work without charging it to any process.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreTicks {
    busy: u64,
    softirq: u64,
    /// Time the hypervisor ran something else while this vCPU wanted to run (counted in
    /// busy too): a stall no process on the machine can see or cause.
    steal: u64,
    total: u64,
}

impl CoreTicks {
    pub fn read(cpu: usize) -> Result<CoreTicks> {
        Self::from_stat(&std::fs::read_to_string("/proc/stat")?, cpu)
    }

    /// The `cpuN` line of a /proc/stat text.
    fn from_stat(stat: &str, cpu: usize) -> Result<CoreTicks> {
        let name = format!("cpu{cpu}");
        let fields: Vec<u64> = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            .with_context(|| format!("no {name} in /proc/stat"))?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        let total: u64 = fields.iter().sum();
        let softirq = fields.get(6).copied().unwrap_or(0);
        let steal = fields.get(7).copied().unwrap_or(0);
        Ok(CoreTicks {
            busy: total - idle,
            softirq,
            steal,
            total,
        })
    }

    /// Seconds of steal (see the field) between `self` and `later`.
    pub fn steal_seconds_until(&self, later: &CoreTicks) -> f64 {
        later.steal.saturating_sub(self.steal) as f64 / ticks_per_second()
    }

    /// Percent of the time between `self` and `later` that the CPU was busy.
    pub fn busy_percent_until(&self, later: &CoreTicks) -> f64 {
        percent(
            later.busy.saturating_sub(self.busy),
            later.total.saturating_sub(self.total),
        )
    }

    /// Percent of the time between `self` and `later` spent in softirq (network stack).
    pub fn softirq_percent_until(&self, later: &CoreTicks) -> f64 {
        percent(
            later.softirq.saturating_sub(self.softirq),
            later.total.saturating_sub(self.total),
        )
    }
}

/// Busy and softirq percent of one CPU over a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreUse {
    pub busy_percent: f64,
    pub softirq_percent: f64,
}

impl CoreUse {
    pub fn between(before: &CoreTicks, after: &CoreTicks) -> CoreUse {
        CoreUse {
            busy_percent: before.busy_percent_until(after),
            softirq_percent: before.softirq_percent_until(after),
        }
    }
}

fn percent(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

/// Both CPUs' ticks: (server CPU, client CPU).
pub fn core_ticks() -> Result<(CoreTicks, CoreTicks)> {
    Ok((CoreTicks::read(SERVER_CPU)?, CoreTicks::read(CLIENT_CPU)?))
}

/// Resident set size of a process in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc status")?;
    Ok(kb * 1024)
}

/// Gives every thread of `pid` the benchmark's nice value (best effort: needs root).
pub fn raise_priority(pid: u32) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        if let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            // On Linux PRIO_PROCESS with a thread id changes that one thread.
            let _ = rustix::process::setpriority_process(Some(tid), BENCH_NICE);
        }
    }
}

/// Gives the calling thread the benchmark's nice value (best effort).
pub fn raise_own_priority() {
    // None names the calling thread.
    let _ = rustix::process::setpriority_process(None, BENCH_NICE);
}

/// `nice -n BENCH_NICE taskset -c CPU program`.
pub fn pinned_client(program: &str) -> Command {
    let mut cmd = Command::new("nice");
    cmd.args([
        "-n",
        &BENCH_NICE.to_string(),
        "taskset",
        "-c",
        &CLIENT_CPU.to_string(),
        program,
    ]);
    cmd
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    ringstore_sys::set_affinity(&[cpu]).with_context(|| format!("pinning to CPU {cpu}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_rss() {
        let start = thread_cpu_seconds().unwrap();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(150) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_seconds().unwrap() > start);
        assert!(process_cpu_seconds(std::process::id()).unwrap() > 0.0);
        assert!(rss_bytes(std::process::id()).unwrap() > 1 << 20);
    }

    #[test]
    fn steal_is_the_eighth_field_of_its_cpu_line() {
        let stat =
            "cpu  9 0 9 9 0 0 9 9 0 0\ncpu0 1 0 2 50 3 0 4 100 0 0\ncpu1 1 0 2 50 3 0 4 7 0 0\n";
        let before = CoreTicks::from_stat(stat, 1).unwrap();
        let later = CoreTicks::from_stat(&stat.replace(" 4 7 ", " 4 207 "), 1).unwrap();
        let seconds = before.steal_seconds_until(&later);
        assert!(
            (seconds - 200.0 / ticks_per_second()).abs() < 1e-9,
            "{seconds}"
        );
        assert_eq!(CoreTicks::from_stat(stat, 0).unwrap().steal, 100);
        assert!(CoreTicks::from_stat(stat, 2).is_err());
    }

    #[test]
    fn core_ticks_move_and_stay_in_range() {
        let before = CoreTicks::read(0).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let after = CoreTicks::read(0).unwrap();
        assert!(after.total > before.total);
        let pct = before.busy_percent_until(&after);
        assert!((0.0..=100.0).contains(&pct), "{pct}");
        let soft = before.softirq_percent_until(&after);
        assert!((0.0..=pct).contains(&soft), "{soft} > {pct}");
        assert!(CoreTicks::read(4096).is_err());
    }
}
