//! A host-side Zipf read load on a memcache port (issue 34's hit-ratio bar): multi-gets of
//! keys drawn with a Zipf distribution, each answer timestamped, hits and misses counted, every
//! value checked; it reconnects through an outage, so one load spans a reboot and the hit
//! ratio of any window before or after it can be read off the answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

/// The Zipf exponent: the classic cache workload (s = 1).
const S: f64 = 1.0;
/// Distinct keys per multi-get.
const PER_GET: usize = 10;
/// The pause between multi-gets: a steady load, not one that saturates the guest's emulated
/// CPU (which would also lengthen the outage it is measured around).
const PAUSE: Duration = Duration::from_millis(5);
/// The longest a load runs if nobody stops it (a failed test drops it).
const MOST: Duration = Duration::from_secs(600);
/// The largest answer read for one multi-get.
const MOST_BYTES: usize = 1 << 20;

/// Ranks to keys: the cumulative distribution of 1/k^s over `n` ranks.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut sum = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                sum += 1.0 / (k as f64).powf(s);
                sum
            })
            .collect();
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    /// The rank (0 hottest) at the uniform `u` in [0, 1).
    fn rank(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|c| *c <= u)
            .min(self.cdf.len() - 1)
    }
}

/// splitmix64: a fixed seed makes every run draw the same keys.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One answered multi-get.
#[derive(Clone, Copy)]
pub struct Answer {
    pub at: Instant,
    pub hits: u32,
    pub misses: u32,
    /// Values that came back but not as stored.
    pub wrong: u32,
}

/// The keys a load reads (rank `i`'s key is `key(i * 7919 % n)`, spreading the hot ones over
/// the key space) and how a value is checked: `exact(key, flags, value)`.
pub struct Keys {
    pub n: usize,
    pub key: fn(usize) -> String,
    pub exact: fn(&str, &str, &str) -> bool,
}

/// A running load; [`ZipfLoad::finish`] stops it at a given instant and returns its answers.
pub struct ZipfLoad {
    stop_at: Arc<Mutex<Option<Instant>>>,
    thread: Option<JoinHandle<Vec<Answer>>>,
}

impl ZipfLoad {
    pub fn start(port: u16, keys: Keys) -> ZipfLoad {
        let stop_at = Arc::new(Mutex::new(None));
        let shared = Arc::clone(&stop_at);
        let thread = std::thread::spawn(move || run(port, &keys, &shared));
        ZipfLoad {
            stop_at,
            thread: Some(thread),
        }
    }

    /// Runs the load until `until` (now if that has passed), then its answers.
    pub fn finish(mut self, until: Instant) -> Result<Vec<Answer>> {
        self.stop(until);
        let thread = self.thread.take();
        thread
            .map(|t| t.join().map_err(|_| anyhow::anyhow!("zipf load panicked")))
            .unwrap_or_else(|| Ok(Vec::new()))
    }

    fn stop(&self, at: Instant) {
        if let Ok(mut s) = self.stop_at.lock() {
            *s = Some(at);
        }
    }
}

impl Drop for ZipfLoad {
    fn drop(&mut self) {
        self.stop(Instant::now());
    }
}

fn run(port: u16, keys: &Keys, stop_at: &Mutex<Option<Instant>>) -> Vec<Answer> {
    let zipf = Zipf::new(keys.n, S);
    let mut rng = Rng(0x5eed_0034);
    let (started, mut answers, mut conn) = (Instant::now(), Vec::new(), None);
    loop {
        let now = Instant::now();
        let stop = stop_at.lock().ok().and_then(|s| *s);
        if stop.is_some_and(|at| now >= at) || now - started > MOST {
            return answers;
        }
        if conn.is_none() {
            conn = connect(port);
        }
        let Some(stream) = conn.as_mut() else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let mut batch: Vec<String> = Vec::with_capacity(PER_GET);
        while batch.len() < PER_GET.min(keys.n) {
            let k = (keys.key)(zipf.rank(rng.unit()) * 7919 % keys.n);
            if !batch.contains(&k) {
                batch.push(k);
            }
        }
        match multi_get(stream, &batch, keys.exact) {
            Some(a) => answers.push(a),
            // Unanswered (the outage): not counted; a fresh connection next time.
            None => conn = None,
        }
        std::thread::sleep(PAUSE);
    }
}

fn connect(port: u16) -> Option<TcpStream> {
    let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300))
        .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    Some(s)
}

/// `get K1 K2 ...`: its answer counted, or None when it is not whole in time.
fn multi_get(
    s: &mut TcpStream,
    keys: &[String],
    exact: fn(&str, &str, &str) -> bool,
) -> Option<Answer> {
    s.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())
        .ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    while !got.ends_with(b"END\r\n") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 || got.len() > MOST_BYTES {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    let (mut hits, mut wrong) = (0u32, 0u32);
    for (k, flags, value) in values(&text) {
        if exact(k, flags, value) {
            hits += 1;
        } else {
            wrong += 1;
        }
    }
    let asked = u32::try_from(keys.len()).unwrap_or(u32::MAX);
    Some(Answer {
        at: Instant::now(),
        hits,
        misses: asked.saturating_sub(hits + wrong),
        wrong,
    })
}

/// A multi-get's answer as (key, flags, value), one per `VALUE` line.
pub fn values(text: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    let mut lines = text.split("\r\n");
    std::iter::from_fn(move || loop {
        let rest = lines.next()?.strip_prefix("VALUE ");
        if let Some(rest) = rest {
            let mut f = rest.split(' ');
            let (k, flags) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
            return Some((k, flags, lines.next().unwrap_or("")));
        }
    })
}

/// What the answers in [from, to) add up to.
#[derive(Debug, Default, Clone, Copy)]
pub struct Window {
    pub hits: u64,
    pub misses: u64,
    pub wrong: u64,
    /// The first and last answer's distance from `from`, seconds: how much of the window the
    /// answers cover.
    pub span: (f64, f64),
}

impl Window {
    pub fn of(answers: &[Answer], from: Instant, to: Instant) -> Window {
        let mut w = Window::default();
        let inside = answers.iter().filter(|a| a.at >= from && a.at < to);
        let mut first_last: Option<(Instant, Instant)> = None;
        for a in inside {
            w.hits += u64::from(a.hits);
            w.misses += u64::from(a.misses);
            w.wrong += u64::from(a.wrong);
            first_last = Some(first_last.map_or((a.at, a.at), |(f, _)| (f, a.at)));
        }
        if let Some((f, l)) = first_last {
            w.span = ((f - from).as_secs_f64(), (l - from).as_secs_f64());
        }
        w
    }

    pub fn lookups(&self) -> u64 {
        self.hits + self.misses + self.wrong
    }

    /// Hits per lookup, in percent.
    pub fn ratio(&self) -> f64 {
        100.0 * self.hits as f64 / self.lookups().max(1) as f64
    }

    /// Fails unless the answers cover the window (`length`, but a tenth of it or 2 s at
    /// either end: after an update the load's client reconnects first, which took 2.4 s on a
    /// loaded host) and there are enough of them for a ratio to the point, none wrong.
    pub fn check(&self, name: &str, length: Duration) -> Result<()> {
        let secs = length.as_secs_f64();
        let slack = (secs / 10.0).max(2.0);
        ensure!(
            self.lookups() >= 2000 && self.span.0 <= slack && self.span.1 >= secs - slack,
            "zipf load {name}: {} lookups over {:.1}..{:.1} s of {secs:.0} s",
            self.lookups(),
            self.span.0,
            self.span.1
        );
        ensure!(
            self.wrong == 0,
            "zipf load {name}: {} wrong values",
            self.wrong
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_ranks_follow_one_over_k() {
        let z = Zipf::new(20_000, 1.0);
        let mut rng = Rng(1);
        let mut counts = vec![0u32; 20_000];
        for _ in 0..200_000 {
            counts[z.rank(rng.unit())] += 1;
        }
        // H(20000) ~ 10.48: rank 0 draws ~9.5 %, rank 1 half that, rank 9 a tenth.
        let share = |r: usize| f64::from(counts[r]) / 200_000.0;
        assert!((share(0) - 0.0954).abs() < 0.005, "{}", share(0));
        assert!((share(0) / share(1) - 2.0).abs() < 0.2);
        assert!((share(0) / share(9) - 10.0).abs() < 1.5);
        assert!(counts.iter().filter(|c| **c > 0).count() > 10_000);
    }

    #[test]
    fn windows_count_only_their_answers() {
        let t = Instant::now();
        let a = |s: u64, hits, misses| Answer {
            at: t + Duration::from_secs(s),
            hits,
            misses,
            wrong: 0,
        };
        let answers = [a(0, 10, 0), a(1, 9, 1), a(5, 0, 10)];
        let w = Window::of(&answers, t, t + Duration::from_secs(2));
        assert_eq!((w.hits, w.misses), (19, 1));
        assert!((w.ratio() - 95.0).abs() < 1e-9);
        assert_eq!(w.span, (0.0, 1.0));
        assert!(
            w.check("x", Duration::from_secs(2)).is_err(),
            "too few lookups"
        );
        // A 60 s window may start answering up to 6 s late and stop up to 6 s early.
        let many = |s: u64| Answer {
            at: t + Duration::from_millis(s),
            hits: 2000,
            misses: 0,
            wrong: 0,
        };
        let w = |first, last| {
            Window::of(&[many(first), many(last)], t, t + Duration::from_secs(60))
                .check("x", Duration::from_secs(60))
        };
        assert!(w(5_900, 54_100).is_ok());
        assert!(w(6_100, 59_000).is_err(), "starts too late");
        assert!(w(1_000, 53_900).is_err(), "stops too early");
    }

    #[test]
    fn values_reads_each_value_line() {
        let text = "VALUE a 1 2\r\nxy\r\nVALUE b 0 0\r\n\r\nEND\r\n";
        let got: Vec<_> = values(text).collect();
        assert_eq!(got, [("a", "1", "xy"), ("b", "0", "")]);
        assert_eq!(values("END\r\n").count(), 0);
    }
}
