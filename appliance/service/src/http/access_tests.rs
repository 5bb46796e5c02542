//! `--http-tokens` in an HTTP session: 401 with `WWW-Authenticate: Bearer` without a valid
//! token, 403 for a read token's writes and for keys outside a token's prefix.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::auth::{Auth, HttpTokens};
use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 5_000,
    mono_ns: 5_000 * 1_000_000,
};

fn hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn shared() -> Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: 1 << 20,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .unwrap();
    let file = format!(
        "reader {} read\nwriter {} write\nusers {} write users/\n\
         app1 subject:CN=app1 write app1/\napp2 subject:CN=app2 read\n",
        hex("r-token"),
        hex("w-token"),
        hex("u-token")
    );
    let tokens = HttpTokens::parse(&file).unwrap();
    Shared::with(
        store,
        ServiceConfig::default(),
        Topology::default(),
        1,
        1,
        0,
        crate::Started {
            auth: Some(Auth::new(None, Some(tokens), |_| {})),
            ..crate::Started::default()
        },
    )
}

fn request(shared: &Shared, text: &str) -> (String, Flow) {
    let mut s = Session::new(Protocol::Http, 0);
    let mut out = Vec::new();
    let flow = s.on_bytes(text.as_bytes(), NOW, shared, None, &mut out);
    (String::from_utf8(out).unwrap(), flow)
}

fn with(method: &str, path: &str, token: Option<&str>, body: &str) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let length = if method == "PUT" {
        format!("Content-Length: {}\r\n", body.len())
    } else {
        String::new()
    };
    format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}{length}\r\n{body}")
}

fn status(reply: &str) -> &str {
    &reply[9..12]
}

#[test]
fn tokens_decide_what_a_request_may_do() {
    let shared = shared();
    let (reply, flow) = request(&shared, &with("GET", "/k", None, ""));
    assert_eq!(status(&reply), "401");
    assert!(reply.contains("WWW-Authenticate: Bearer\r\n"), "{reply}");
    assert_eq!(flow, Flow::Continue, "no body: the connection stays");
    let (reply, flow) = request(&shared, &with("PUT", "/k", Some("r-token"), "hello"));
    assert_eq!(
        (status(&reply), flow),
        ("403", Flow::Close),
        "a refused body closes"
    );
    let by_hash = hex("r-token");
    // (method, path, token, body, status), in order: later rows see earlier writes.
    let cases: &[(&str, &str, Option<&str>, &str, &str)] = &[
        ("GET", "/k", Some("nope"), "", "401"),
        // The hash in the file is not the token.
        ("GET", "/k", Some(&by_hash), "", "401"),
        ("GET", "/k", Some("r-token"), "", "404"),
        ("DELETE", "/k", Some("r-token"), "", "403"),
        ("PUT", "/k", Some("w-token"), "hello", "201"),
        ("GET", "/k", Some("r-token"), "", "200"),
        // Prefix-scoped: only keys under users/.
        ("GET", "/k", Some("u-token"), "", "403"),
        ("DELETE", "/k", Some("u-token"), "", "403"),
        ("PUT", "/users/a", Some("u-token"), "v", "201"),
        ("GET", "/users/a", Some("u-token"), "", "200"),
    ];
    for &(method, path, token, body, want) in cases {
        let (reply, _) = request(&shared, &with(method, path, token, body));
        assert_eq!(status(&reply), want, "{method} {path} {token:?}");
    }
    let basic = "GET /k HTTP/1.1\r\nHost: x\r\nAuthorization: Basic cjpy\r\n\r\n";
    assert_eq!(status(&request(&shared, basic).0), "401");
    // Two Authorization fields: which one counts is ambiguous, so neither does.
    let twice = "GET /k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer r-token\r\nAuthorization: Bearer w-token\r\n\r\n";
    assert_eq!(status(&request(&shared, twice).0), "400");
}

/// (certificate CN, method, path, token, body, status).
type CertCase<'a> = (
    &'a [u8],
    &'a str,
    &'a str,
    Option<&'a str>,
    &'a str,
    &'a str,
);

fn with_certificate(shared: &Shared, cn: &[u8], text: &str) -> String {
    use ringstore_tls::der_builder::{atv, certificate, CN};
    let mut s = Session::new(Protocol::Http, 0);
    s.client_certificate(&certificate(&[vec![atv(CN, 0x0c, cn)]]));
    let mut out = Vec::new();
    let _ = s.on_bytes(text.as_bytes(), NOW, shared, None, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn a_verified_client_certificate_stands_in_for_a_token() {
    let shared = shared();
    // (certificate CN, method, path, token, body, status), in order.
    let cases: &[CertCase] = &[
        (b"app1", "PUT", "/app1/a", None, "v", "201"),
        (b"app1", "GET", "/app1/a", None, "", "200"),
        // The prefix of its line holds.
        (b"app1", "PUT", "/other", None, "v", "403"),
        // Read only.
        (b"app2", "GET", "/app1/a", None, "", "200"),
        (b"app2", "DELETE", "/app1/a", None, "", "403"),
        // Not in the file.
        (b"app3", "GET", "/app1/a", None, "", "401"),
        // A request with a token is judged by the token alone.
        (b"app2", "DELETE", "/app1/a", Some("nope"), "", "401"),
        (b"app2", "DELETE", "/app1/a", Some("w-token"), "", "204"),
    ];
    for &(cn, method, path, token, body, want) in cases {
        let reply = with_certificate(&shared, cn, &with(method, path, token, body));
        assert_eq!(status(&reply), want, "{cn:?} {method} {path} {token:?}");
    }
    // A subject line is not a token, and a connection without a certificate has none.
    let (reply, _) = request(
        &shared,
        &with("GET", "/app1/a", Some("subject:CN=app1"), ""),
    );
    assert_eq!(status(&reply), "401");
    let (reply, _) = request(&shared, &with("GET", "/app1/a", None, ""));
    assert_eq!(status(&reply), "401");
}
