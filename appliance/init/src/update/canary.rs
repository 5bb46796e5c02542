//! The trial's canary: memcache and HTTP requests through the new system's own listeners, each
//! answered within a bound, and with a data device the key the old system wrote, read back
//! after recovery.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Every canary operation must be answered within this: milliseconds on hardware, but sized
/// for TCG on a loaded 2-core host, where one fdatasync (a durable delete) was seen to take 3 s.
pub const CANARY_OP_LIMIT: Duration = Duration::from_secs(10);
/// The key the old system writes before the trial and the new one reads after recovery.
pub const CANARY_KEY: &str = "ringstore-update-canary";
/// The trial's own fresh keys (memcache) and objects (HTTP, after a `/`): this and a tag.
pub const CANARY_KEY_PREFIX: &str = "ringstore-canary-";

/// The low 64 bits of `d` in nanoseconds: clock bits for tags that only need to differ
/// between runs.
pub(super) fn low_nanos(d: Duration) -> u64 {
    d.as_secs()
        .wrapping_mul(1_000_000_000)
        .wrapping_add(u64::from(d.subsec_nanos()))
}

/// A local address for a listener (`0.0.0.0` → `127.0.0.1`).
pub(super) fn local(addr: SocketAddr) -> SocketAddr {
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

/// What a server in `data-full refuse` mode answers a set that finds its device full: the
/// canary is a client like any other and gets no room kept for deletes (ADR 0039).
pub(super) const DEVICE_FULL: &str = "SERVER_ERROR data device full storing object\r\n";

/// One memcache request's whole answer.
fn memcache_answer(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: &str,
) -> Result<String, String> {
    // A value answer is whole at its END line; any other answer at its first line end.
    let got = exchange(limit, addr, what, request.as_bytes(), |g| {
        g.ends_with(b"\r\n") && (!g.starts_with(b"VALUE") || g.ends_with(b"END\r\n"))
    })?;
    Ok(String::from_utf8_lossy(&got).into_owned())
}

pub(super) fn memcache(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: &str,
    expect: &str,
) -> Result<(), String> {
    let got = memcache_answer(limit, addr, what, request)?;
    if got != expect {
        return Err(format!("{what}: answered {got:?}, expected {expect:?}"));
    }
    Ok(())
}

/// A memcache set: `Ok(true)` stored, `Ok(false)` refused as [`DEVICE_FULL`] (a full
/// `refuse` box answering as it must), anything else an error.
pub(super) fn memcache_set(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: &str,
) -> Result<bool, String> {
    match memcache_answer(limit, addr, what, request)?.as_str() {
        "STORED\r\n" => Ok(true),
        DEVICE_FULL => Ok(false),
        got => Err(format!(
            "{what}: answered {got:?}, expected \"STORED\\r\\n\""
        )),
    }
}

/// One HTTP request; its answer's status must start with one of `statuses`: which one.
fn http(
    limit: Duration,
    addr: SocketAddr,
    what: &str,
    request: String,
    statuses: &[&str],
    body: &str,
) -> Result<usize, String> {
    let got = exchange(limit, addr, what, request.as_bytes(), |g| {
        g.windows(4).any(|w| w == b"\r\n\r\n") && g.ends_with(body.as_bytes())
    })?;
    statuses
        .iter()
        .position(|status| got.starts_with(format!("HTTP/1.1 {status}").as_bytes()))
        .ok_or_else(|| {
            format!(
                "{what}: answered {:?}",
                String::from_utf8_lossy(&got[..got.len().min(200)])
            )
        })
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
        u64::from(std::process::id()) ^ low_nanos(started.elapsed()) ^ 0x5eed
    );
    if let Some(addr) = config.memcache.map(local) {
        let recovered = token.filter(|_| config.data.is_some());
        memcache_canary(limit, addr, &tag, recovered)?;
    }
    if let Some(addr) = config.http.map(local) {
        http_canary(limit, addr, &tag)?;
    }
    Ok(format!(
        "canary passed in {} ms",
        started.elapsed().as_millis()
    ))
}

/// set, get and delete of a key named by `tag`; then, when given, the `recovered` token
/// under [`CANARY_KEY`].
fn memcache_canary(
    limit: Duration,
    addr: SocketAddr,
    tag: &str,
    recovered: Option<&str>,
) -> Result<(), String> {
    let key = format!("{CANARY_KEY_PREFIX}{tag}");
    let set = format!("set {key} 0 0 2\r\nok\r\n");
    // A full `refuse` device refuses the canary's set as any client's: that answer is the
    // box working as configured, and there is then no key to read back or delete.
    if memcache_set(limit, addr, "memcache set", &set)? {
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
    }
    if let Some(token) = recovered {
        memcache(
            limit,
            addr,
            "data after recovery",
            &format!("get {CANARY_KEY}\r\n"),
            &format!("VALUE {CANARY_KEY} 0 {}\r\n{token}\r\nEND\r\n", token.len()),
        )?;
    }
    Ok(())
}

/// PUT, GET and DELETE of an object named by `tag`.
fn http_canary(limit: Duration, addr: SocketAddr, tag: &str) -> Result<(), String> {
    let path = format!("/{CANARY_KEY_PREFIX}{tag}");
    let put = format!("PUT {path} HTTP/1.1\r\nHost: canary\r\nContent-Length: 2\r\n\r\nok");
    // 507: a full `refuse` device, as for the memcache set; nothing to read back or delete.
    if http(limit, addr, "HTTP PUT", put, &["20", "507"], "")? == 1 {
        return Ok(());
    }
    http(
        limit,
        addr,
        "HTTP GET",
        format!("GET {path} HTTP/1.1\r\nHost: canary\r\n\r\n"),
        &["200"],
        "ok",
    )?;
    http(
        limit,
        addr,
        "HTTP DELETE",
        format!("DELETE {path} HTTP/1.1\r\nHost: canary\r\n\r\n"),
        &["20"],
        "",
    )
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// A memcache and an HTTP listener that answer like the server, `token` under the canary
    /// key, every answer after `delay`.
    fn fake(token: &'static str, delay: Duration) -> (SocketAddr, SocketAddr) {
        fake_box(token, delay, false)
    }

    /// [`fake`], refusing every set and PUT as a full `refuse` device does when `full`.
    fn fake_box(token: &'static str, delay: Duration, full: bool) -> (SocketAddr, SocketAddr) {
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
                        if full { DEVICE_FULL } else { "STORED\r\n" }.to_string()
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
                    b"PUT" if full => {
                        b"HTTP/1.1 507 Insufficient Storage\r\nContent-Length: 0\r\n\r\n"
                    }
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
    fn a_full_refusing_box_passes_with_its_refusals() {
        let (mc, web) = fake_box("0123456789abcdef", Duration::ZERO, true);
        let config = config(mc, web, true);
        let note = canary(&config, Some("0123456789abcdef"), CANARY_OP_LIMIT).unwrap();
        assert!(note.starts_with("canary passed in "), "{note}");
        let set = format!("set {CANARY_KEY} 0 0 2\r\nok\r\n");
        assert_eq!(memcache_set(CANARY_OP_LIMIT, mc, "set", &set), Ok(false));
    }
}
