//! `--auth-file` in a memcache session: the text login as memcached 1.6.18 answers it, the
//! bound on what a connection that has not logged in may hold, counters and the log rate,
//! and binary requests before a login.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::bound_tests::{shared, shared_started};
use crate::auth::{Auth, Credentials};
use crate::{Flow, Now, Protocol, Session, Shared};

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 10_000,
    mono_ns: 10_000 * 1_000_000,
};

fn check_line(line: &str) {
    assert!(
        !line.contains("secret") && !line.contains("wrong"),
        "{line}"
    );
}

/// Lines logged by `attempts_are_counted_and_logged_at_a_bounded_rate` alone: tests run in
/// parallel, and a shared counter would count the other tests' lines too.
static RATE_TEST_LINES: AtomicUsize = AtomicUsize::new(0);

fn count_rate_test_line(line: &str) {
    check_line(line);
    RATE_TEST_LINES.fetch_add(1, Ordering::Relaxed);
}

fn locked() -> Arc<Shared> {
    locked_with(check_line)
}

fn locked_with(log: fn(&str)) -> Arc<Shared> {
    let users = Credentials::parse(b"alice:secret\nbob:hunter2\n").unwrap();
    logged_in_by(Auth::new(Some(users), None, log))
}

/// A server that asks `auth` of its clients.
fn logged_in_by(auth: Auth) -> Arc<Shared> {
    shared_started(
        1 << 20,
        crate::Started {
            auth: Some(auth),
            ..crate::Started::default()
        },
    )
}

fn feed(shared: &Shared, s: &mut Session, input: &[u8]) -> (Vec<u8>, Flow) {
    let mut out = Vec::new();
    let flow = s.on_bytes(input, NOW, shared, None, &mut out);
    (out, flow)
}

fn one(input: &[u8]) -> (String, Flow) {
    let shared = locked();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let (out, flow) = feed(&shared, &mut s, input);
    (String::from_utf8_lossy(&out).into_owned(), flow)
}

const UNAUTH: &str = "CLIENT_ERROR unauthenticated\r\n";

#[test]
fn commands_before_the_login_are_refused() {
    assert_eq!(one(b"get foo\r\n"), (UNAUTH.into(), Flow::Continue));
    assert_eq!(one(b"quit\r\n"), (UNAUTH.into(), Flow::Continue));
    assert_eq!(one(b"mg foo v\r\n"), (UNAUTH.into(), Flow::Continue));
    assert_eq!(one(b"SET k 0 0 12\r\nalice secret\r\n").0, UNAUTH);
    // One reply per burst: 21 commands, then every 20 more (memcached's -R 20).
    assert_eq!(one(&b"get a\r\n".repeat(21)).0, UNAUTH);
    assert_eq!(one(&b"get a\r\n".repeat(22)).0, UNAUTH.repeat(2));
    assert_eq!(one(&b"get a\r\n".repeat(41)).0, UNAUTH.repeat(2));
    assert_eq!(one(&b"get a\r\n".repeat(42)).0, UNAUTH.repeat(3));
}

#[test]
fn the_login_set() {
    let cases: &[(&[u8], &str)] = &[
        (b"set k 0 0 12\r\nalice secret\r\n", "STORED\r\n"),
        (b"set k 0 0 12 noreply\r\nalice secret\r\n", "STORED\r\n"),
        (b"set k 0 0 13\r\nalice  secret\r\n", "STORED\r\n"),
        (
            b"set k 0 0 9\r\nalice bad\r\n",
            "CLIENT_ERROR authentication failure\r\n",
        ),
        (
            b"set k 0 0 11\r\nbob  secret\r\n",
            "CLIENT_ERROR authentication failure\r\n",
        ),
        (
            b"set k 0 0 12\r\nalice secretXX",
            "CLIENT_ERROR bad command line termination\r\n",
        ),
        (
            b"set k 0 0 12\r\nalice\0secret\r\n",
            "CLIENT_ERROR bad authentication token format\r\n",
        ),
        // Pipelined: the login, then ordinary commands in the same read.
        (
            b"get x\r\nset k 0 0 12\r\nalice secret\r\nget k\r\nversion\r\n",
            "STORED\r\nEND\r\nVERSION 1.6.18\r\n",
        ),
        // A failure's reply is replaced by the next one in the same burst.
        (b"set k 0 0 9\r\nalice bad\r\nversion\r\n", UNAUTH),
    ];
    for &(input, want) in cases {
        assert_eq!(one(input).0, want, "{:?}", String::from_utf8_lossy(input));
    }
}

#[test]
fn a_login_split_anywhere_is_the_same_login() {
    let input = b"set k 0 0 12\r\nalice secret\r\nget k\r\n";
    for cut in 0..input.len() {
        let shared = locked();
        let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
        let (mut out, _) = feed(&shared, &mut s, &input[..cut]);
        let (more, _) = feed(&shared, &mut s, &input[cut..]);
        out.extend(more);
        assert_eq!(out, b"STORED\r\nEND\r\n", "cut at {cut}");
        assert!(!s.has_partial_request());
    }
}

#[test]
fn a_connection_not_logged_in_holds_its_fixed_allowance_at_most() {
    let shared = locked();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    assert!(
        s.has_partial_request(),
        "the request timer runs from the accept"
    );
    // Junk without a line end: closed past 2048 bytes, nothing reserved before that.
    assert_eq!(
        feed(&shared, &mut s, &[b'x'; 2048]),
        (vec![], Flow::Continue)
    );
    assert_eq!(feed(&shared, &mut s, b"x"), (vec![], Flow::Close));
    // A data block larger than the bound is refused from its line.
    let (out, flow) = one(b"set k 0 0 16383\r\n");
    assert_eq!((out.as_str(), flow), ("", Flow::Close));
    let (out, flow) = one(b"set k 0 0 4294967295\r\n");
    assert_eq!((out.as_str(), flow), ("", Flow::Close));
    // The largest allowed block is waited for.
    assert_eq!(one(b"set k 0 0 16382\r\n"), (String::new(), Flow::Continue));
    assert_eq!(shared.conn_memory.used(), 0);
}

#[test]
fn attempts_are_counted_and_logged_at_a_bounded_rate() {
    let shared = locked_with(count_rate_test_line);
    for _ in 0..500 {
        let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
        feed(&shared, &mut s, b"set k 0 0 11\r\nalice wrong\r\n");
    }
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    feed(&shared, &mut s, b"set k 0 0 12\r\nalice secret\r\n");
    let t = shared.totals();
    assert_eq!((t.auth_cmds, t.auth_errors), (501, 500));
    // 500 failures at one instant: one line.
    let lines = RATE_TEST_LINES.load(Ordering::Relaxed);
    assert_eq!(lines, 1, "{lines} log lines");
    let (stats, _) = feed(&shared, &mut s, b"stats\r\n");
    let stats = String::from_utf8(stats).unwrap();
    assert!(stats.contains("STAT auth_cmds 501\r\n"), "{stats}");
    assert!(stats.contains("STAT auth_errors 500\r\n"));
    assert!(!stats.contains("secret") && !stats.contains("alice"));
}

fn reload(shared: &Shared, file: &[u8]) {
    let users = Credentials::parse(file).unwrap();
    let auth = shared.started.auth.as_ref().unwrap();
    auth.users.as_ref().unwrap().replace(users);
}

#[test]
fn a_reload_closes_the_sessions_of_removed_users_and_keeps_the_others() {
    let shared = locked();
    let login = |input: &[u8]| {
        let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
        assert_eq!(feed(&shared, &mut s, input).0, b"STORED\r\n");
        s
    };
    let mut alice = login(b"set k 0 0 12\r\nalice secret\r\n");
    let mut bob = login(b"set k 0 0 11\r\nbob hunter2\r\n");
    let mut never = Session::for_connection(Protocol::Memcache, 0, &shared);
    assert!(!alice.revoked(&shared) && !bob.revoked(&shared));
    // alice removed, bob's password changed, carol added.
    reload(&shared, b"carol:pw2\nbob:newpass\nalice2:secret\n");
    assert!(alice.revoked(&shared), "removed");
    assert!(bob.revoked(&shared), "password changed");
    assert!(
        !never.revoked(&shared),
        "not logged in: the login gate decides"
    );
    assert_eq!(
        feed(&shared, &mut alice, b"get k\r\n"),
        (Vec::new(), Flow::Close),
        "no request of a removed user is served"
    );
    assert_eq!(
        one_on(&shared, b"set k 0 0 12\r\nalice secret\r\n"),
        "CLIENT_ERROR authentication failure\r\n"
    );
    let mut carol = login(b"set k 0 0 9\r\ncarol pw2\r\n");
    let mut bob2 = login(b"set k 0 0 11\r\nbob newpass\r\n");
    // A reload that keeps carol and bob: their sessions stay and are served.
    reload(&shared, b"bob:newpass\ncarol:pw2\n");
    assert!(!carol.revoked(&shared) && !bob2.revoked(&shared));
    assert_eq!(feed(&shared, &mut carol, b"get k\r\n").0, b"END\r\n");
    assert_eq!(feed(&shared, &mut bob2, b"get k\r\n").0, b"END\r\n");
    assert_eq!(feed(&shared, &mut never, b"get k\r\n").0, UNAUTH.as_bytes());
}

#[test]
fn a_reload_closes_a_binary_sasl_session_of_a_removed_user() {
    let shared = locked();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let (out, _) = feed(&shared, &mut s, &frame(0x21, b"PLAIN", b"\0alice\0secret"));
    assert_eq!(frames(&out), vec![(0, b"Authenticated".to_vec())]);
    reload(&shared, b"bob:hunter2\n");
    assert!(s.revoked(&shared));
    let (out, flow) = feed(&shared, &mut s, &frame(0x00, b"k", b""));
    assert_eq!((out.len(), flow), (0, Flow::Close));
}

fn one_on(shared: &Shared, input: &[u8]) -> String {
    let mut s = Session::for_connection(Protocol::Memcache, 0, shared);
    String::from_utf8(feed(shared, &mut s, input).0).unwrap()
}

#[test]
fn without_an_auth_file_nothing_changes() {
    let shared = shared(1 << 20);
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    assert!(!s.has_partial_request());
    assert_eq!(feed(&shared, &mut s, b"get k\r\n").0, b"END\r\n");
}

#[test]
fn binary_requests_before_a_login_get_auth_error_and_a_close() {
    let shared = locked();
    // A session made without the shared state finds the gate on its first bytes.
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut get = vec![
        0x80, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef,
    ];
    get.extend_from_slice(&[0; 8]);
    get.push(b'k');
    let (out, flow) = feed(&shared, &mut s, &get[..10]);
    assert_eq!((out.len(), flow), (0, Flow::Continue));
    let (out, flow) = feed(&shared, &mut s, &get[10..]);
    assert_eq!(flow, Flow::Close);
    assert_eq!(out[0], 0x81);
    assert_eq!(&out[6..8], &[0x00, 0x20], "status Auth error");
    assert_eq!(&out[12..16], &[0xde, 0xad, 0xbe, 0xef], "opaque echoed");
    assert!(out.ends_with(b"Auth failure."));
}

/// A binary request frame (no extras).
fn frame(opcode: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80, opcode, 0, 0, 0, 0, 0, 0];
    f[2..4].copy_from_slice(&u16::try_from(key.len()).unwrap().to_be_bytes());
    f.extend_from_slice(
        &u32::try_from(key.len() + value.len())
            .unwrap()
            .to_be_bytes(),
    );
    f.extend_from_slice(&[0, 0, 0, 7]);
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(key);
    f.extend_from_slice(value);
    f
}

/// (status, body) of each response frame in `out`.
fn frames(mut out: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut all = Vec::new();
    while out.len() >= 24 {
        let body = u32::from_be_bytes([out[8], out[9], out[10], out[11]]) as usize;
        all.push((
            u16::from_be_bytes([out[6], out[7]]),
            out[24..24 + body].to_vec(),
        ));
        out = &out[24 + body..];
    }
    all
}

#[test]
fn sasl_plain_logs_a_binary_connection_in() {
    let shared = locked();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let mut input = frame(0x20, b"", b"");
    input.extend(frame(0x0b, b"", b""));
    input.extend(frame(0x21, b"PLAIN", b"\0alice\0wrong"));
    input.extend(frame(0x22, b"PLAIN", b"\0alice\0secret"));
    input.extend(frame(0x21, b"CRAM-MD5", b"x"));
    input.extend(frame(0x21, b"PLAIN", b"bob\0alice\0secret"));
    input.extend(frame(0x21, b"PLAIN", b"\0alice\0secret"));
    input.extend(frame(0x00, b"k", b""));
    let (out, flow) = feed(&shared, &mut s, &input);
    assert_eq!(flow, Flow::Continue);
    let auth_failure = (0x20, b"Auth failure.".to_vec());
    assert_eq!(
        frames(&out),
        vec![
            (0, b"PLAIN".to_vec()),
            (0, b"1.6.18".to_vec()),
            auth_failure.clone(),
            auth_failure.clone(),
            auth_failure.clone(),
            auth_failure,
            (0, b"Authenticated".to_vec()),
            (1, b"Not found".to_vec()),
        ]
    );
    let t = shared.totals();
    assert_eq!((t.auth_cmds, t.auth_errors), (5, 4));
}

#[test]
fn sasl_bounds_and_the_binary_protocol_without_an_auth_file() {
    let shared = locked();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    // Data over the bound: refused from the header, its bytes swallowed (not buffered).
    let mut big = frame(0x21, b"PLAIN", &[b'a'; 1025]);
    big.extend(frame(0x0b, b"", b""));
    let (out, flow) = feed(&shared, &mut s, &big);
    assert_eq!(flow, Flow::Continue);
    assert_eq!(
        frames(&out),
        vec![(0x82, b"Out of memory".to_vec()), (0, b"1.6.18".to_vec())]
    );
    // A set before the login: refused from its header, closed.
    let set = [
        vec![0x80, 0x01, 0, 1, 8, 0, 0, 0, 0, 0, 0x10, 0x09],
        vec![0; 20],
        b"k".to_vec(),
    ]
    .concat();
    let (out, flow) = feed(&shared, &mut s, &set);
    assert_eq!(
        (frames(&out), flow),
        (vec![(0x20, b"Auth failure.".to_vec())], Flow::Close)
    );
    // No --auth-file: SASL is an unknown command, as memcached without -S answers it.
    let open = shared_open();
    let mut s = Session::for_connection(Protocol::Memcache, 0, &open);
    let mut input = frame(0x20, b"", b"");
    input.extend(frame(0x21, b"PLAIN", b"\0alice\0secret"));
    input.extend(frame(0x00, b"k", b""));
    let (out, _) = feed(&open, &mut s, &input);
    let unknown = (0x81, b"Unknown command".to_vec());
    assert_eq!(
        frames(&out),
        vec![unknown.clone(), unknown, (1, b"Not found".to_vec())]
    );
}

fn shared_open() -> Arc<Shared> {
    shared(1 << 20)
}

#[test]
fn stats_settings_say_auth_is_on_as_memcached_does() {
    let users = Credentials::parse(b"alice:secret\n").unwrap();
    let mut auth = Auth::new(Some(users), None, check_line);
    auth.users_file = Some("/tls/users".into());
    let shared = logged_in_by(auth);
    let mut s = Session::for_connection(Protocol::Memcache, 0, &shared);
    let (out, _) = feed(
        &shared,
        &mut s,
        b"set k 0 0 12\r\nalice secret\r\nstats settings\r\n",
    );
    let out = String::from_utf8_lossy(&out);
    // memcached 1.6.18 -Y FILE prints the file's path (and -S `yes`).
    assert!(
        out.contains("STAT auth_enabled_ascii /tls/users\r\n"),
        "{out}"
    );
    assert!(out.contains("STAT auth_enabled_sasl yes\r\n"), "{out}");
}
