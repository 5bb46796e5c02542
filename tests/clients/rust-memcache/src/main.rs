//! Runs a fixed script of memcache operations through the Rust `memcache` crate (binary
//! protocol, its default for memcache:// URLs) against `HOST:PORT` and prints one normalised line
//! per operation: `PASS name: got` or `FAIL name: got (want: expected)`; the expectations are
//! memcached 1.6.18's answers.

use memcache::{Client, CommandError, MemcacheError};
use std::collections::BTreeMap;
use std::time::Duration;

/// Prints the outcome of one operation against its expectation.
struct Report {
    failed: usize,
}

impl Report {
    fn check(&mut self, name: &str, got: String, want: &str) {
        if got == want {
            println!("PASS {name}: {got}");
        } else {
            self.failed += 1;
            println!("FAIL {name}: {got} (want: {want})");
        }
    }
}

/// A short, server-independent name for an error (no addresses, no timings).
fn err(e: &MemcacheError) -> String {
    match e {
        MemcacheError::CommandError(CommandError::Unknown(code)) => format!("err:status-{code:#x}"),
        MemcacheError::CommandError(c) => format!("err:{c:?}"),
        MemcacheError::ServerError(s) => format!("err:server {s}"),
        MemcacheError::IOError(io) => format!("err:io {:?}", io.kind()),
        MemcacheError::ClientError(c) => format!("err:client {c}"),
        other => format!("err:other {other}"),
    }
}

fn show<T: std::fmt::Debug>(r: Result<T, MemcacheError>) -> String {
    match r {
        Ok(v) => format!("{v:?}"),
        Err(e) => err(&e),
    }
}

fn get(c: &Client, key: &str) -> String {
    show(c.get::<String>(key))
}

/// FNV-1a, so a large value is compared by length and digest instead of printed.
fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Bytes that no compressor shortens and no off-by-one hides.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .expect("usage: rust-memcache-ops HOST:PORT");
    let client = match Client::builder()
        .add_server(format!("memcache://{addr}"))
        .and_then(|b| {
            b.with_read_timeout(Duration::from_secs(2))
                .with_write_timeout(Duration::from_secs(2))
                .with_connection_timeout(Duration::from_secs(3))
                .build()
        }) {
        Ok(c) => c,
        Err(e) => {
            println!("FAIL connect: {} (want: ok)", err(&e));
            std::process::exit(1);
        }
    };
    let c = &client;
    let mut r = Report { failed: 0 };

    let version = match c.version() {
        Ok(v)
            if v.len() == 1
                && !v[0].1.is_empty()
                && v[0].1.chars().all(|ch| ch.is_ascii_digit() || ch == '.') =>
        {
            "<version>".to_string()
        }
        other => show(other),
    };
    r.check("version", version, "<version>");
    r.check("flush", show(c.flush()), "()");
    r.check("get missing", get(c, "rm:missing"), "None");
    r.check("set", show(c.set("rm:a", "alpha", 0)), "()");
    r.check("get", get(c, "rm:a"), "Some(\"alpha\")");
    r.check(
        "get bytes with flags",
        show(c.get::<(Vec<u8>, u32)>("rm:a")),
        "Some(([97, 108, 112, 104, 97], 0))",
    );
    r.check("set overwrite", show(c.set("rm:a", "beta", 0)), "()");
    r.check("get overwritten", get(c, "rm:a"), "Some(\"beta\")");
    r.check("set u64 value", show(c.set("rm:num", 42u64, 0)), "()");
    r.check("get u64 value", show(c.get::<u64>("rm:num")), "Some(42)");
    r.check("add existing", show(c.add("rm:a", "x", 0)), "err:KeyExists");
    r.check("add new", show(c.add("rm:b", "bee", 0)), "()");
    r.check("get added", get(c, "rm:b"), "Some(\"bee\")");
    r.check(
        "replace missing",
        show(c.replace("rm:missing", "x", 0)),
        "err:KeyNotFound",
    );
    r.check("replace existing", show(c.replace("rm:b", "bee2", 0)), "()");
    r.check("get replaced", get(c, "rm:b"), "Some(\"bee2\")");
    r.check("append", show(c.append("rm:a", "-tail")), "()");
    r.check("prepend", show(c.prepend("rm:a", "head-")), "()");
    r.check("get appended", get(c, "rm:a"), "Some(\"head-beta-tail\")");
    // memcached answers NOT_STORED (0x05) to both; the crate ignores the status of a prepend.
    r.check(
        "append missing",
        show(c.append("rm:missing", "x")),
        "err:status-0x5",
    );
    r.check("prepend missing", show(c.prepend("rm:missing", "x")), "()");
    r.check("delete", show(c.delete("rm:b")), "true");
    r.check("delete missing", show(c.delete("rm:b")), "false");
    r.check("get deleted", get(c, "rm:b"), "None");

    // Multi-get: pipelined GETKQ requests closed by a NOOP.
    let multi = |keys: &[&str]| match c.gets::<String>(keys) {
        Ok(m) => format!("{:?}", m.into_iter().collect::<BTreeMap<_, _>>()),
        Err(e) => err(&e),
    };
    r.check("set m1", show(c.set("rm:m1", "one", 0)), "()");
    r.check("set m2", show(c.set("rm:m2", "two", 0)), "()");
    r.check(
        "multi-get",
        multi(&["rm:m1", "rm:missing", "rm:m2"]),
        "{\"rm:m1\": \"one\", \"rm:m2\": \"two\"}",
    );
    r.check("multi-get all missing", multi(&["rm:x1", "rm:x2"]), "{}");
    r.check("multi-get after", get(c, "rm:m1"), "Some(\"one\")");

    // CAS: the token from a gets, a stale token, a token for a missing key.
    let token = |key: &str| {
        c.gets::<(String, u32, Option<u64>)>(&[key])
            .ok()
            .and_then(|m| m.get(key).and_then(|v| v.2))
    };
    let t1 = token("rm:m1");
    r.check(
        "gets cas token",
        format!("{}", t1.is_some_and(|t| t > 0)),
        "true",
    );
    let t1 = t1.unwrap_or(1);
    r.check(
        "cas with token",
        show(c.cas("rm:m1", "one-cas", 0, t1)),
        "true",
    );
    r.check("get after cas", get(c, "rm:m1"), "Some(\"one-cas\")");
    r.check(
        "cas stale token",
        show(c.cas("rm:m1", "stale", 0, t1)),
        "false",
    );
    r.check("get after stale cas", get(c, "rm:m1"), "Some(\"one-cas\")");
    // The crate reports NOT_FOUND and EXISTS on a CAS alike, as false.
    r.check(
        "cas missing key",
        show(c.cas("rm:missing", "x", 0, t1)),
        "false",
    );
    let t2 = token("rm:m1");
    r.check(
        "cas token changes",
        format!("{}", t2.is_some() && t2 != Some(t1)),
        "true",
    );

    // Counters: the crate sends initial 0 and expiration 0, so a missing key is created.
    r.check("set counter", show(c.set("rm:n", "10", 0)), "()");
    r.check("incr", show(c.increment("rm:n", 5)), "15");
    r.check("decr", show(c.decrement("rm:n", 3)), "12");
    r.check("decr below zero", show(c.decrement("rm:n", 100)), "0");
    r.check(
        "incr missing creates 0",
        show(c.increment("rm:newcounter", 7)),
        "0",
    );
    r.check("incr created", show(c.increment("rm:newcounter", 7)), "7");
    r.check(
        "decr missing creates 0",
        show(c.decrement("rm:newdown", 7)),
        "0",
    );
    r.check(
        "incr non-numeric",
        show(c.increment("rm:m2", 1)),
        "err:status-0x6",
    );
    r.check(
        "set max u64",
        show(c.set("rm:big", "18446744073709551615", 0)),
        "()",
    );
    r.check("incr wraps", show(c.increment("rm:big", 2)), "1");
    // memcached shortens a decremented value in place, padding it with spaces.
    r.check("get counter as text", get(c, "rm:n"), "Some(\"0 \")");

    // Large values: just under the 1 MiB item limit, and over it.
    let large = pattern(1_000_000);
    r.check("set ~1MB", show(c.set("rm:large", &large[..], 0)), "()");
    let got = match c.get::<Vec<u8>>("rm:large") {
        Ok(Some(v)) => format!("len={} digest={:x}", v.len(), digest(&v)),
        other => show(other),
    };
    r.check(
        "get ~1MB",
        got,
        &format!("len={} digest={:x}", large.len(), digest(&large)),
    );
    let huge = pattern(2 << 20);
    r.check(
        "set 2MiB too large",
        show(c.set("rm:huge", &huge[..], 0)),
        "err:ValueTooLarge",
    );
    r.check("get after too large", get(c, "rm:huge"), "None");
    r.check(
        "connection fine after too large",
        get(c, "rm:m2"),
        "Some(\"two\")",
    );

    // Touch and expiry.
    r.check("touch", show(c.touch("rm:m2", 100)), "true");
    r.check("touch missing", show(c.touch("rm:missing", 100)), "false");
    r.check("set ttl 1", show(c.set("rm:ttl", "short", 1)), "()");
    r.check("set ttl 100", show(c.set("rm:long", "long", 100)), "()");
    r.check("set to touch", show(c.set("rm:touched", "t", 0)), "()");
    r.check("touch to 1s", show(c.touch("rm:touched", 1)), "true");
    // TTL 1 may lapse at the server's next clock tick, even right away; TTL 2 lives past 1 s.
    r.check("set ttl 2", show(c.set("rm:ttl2", "two", 2)), "()");
    r.check("get ttl 2 right away", get(c, "rm:ttl2"), "Some(\"two\")");
    std::thread::sleep(Duration::from_millis(2000));
    r.check("get expired", get(c, "rm:ttl"), "None");
    r.check("get touched expired", get(c, "rm:touched"), "None");
    r.check("get not expired", get(c, "rm:long"), "Some(\"long\")");

    let stats = match c.stats() {
        Ok(v) if v.len() == 1 => {
            let s = &v[0].1;
            format!(
                "pid:{} curr_items:{}",
                s.contains_key("pid"),
                s.contains_key("curr_items")
            )
        }
        other => show(other.map(|v| v.len())),
    };
    r.check("stats", stats, "pid:true curr_items:true");
    r.check("flush all", show(c.flush()), "()");
    r.check("get after flush", get(c, "rm:long"), "None");
    r.check("flush with delay 0", show(c.flush_with_delay(0)), "()");
    std::process::exit(i32::from(r.failed > 0));
}
