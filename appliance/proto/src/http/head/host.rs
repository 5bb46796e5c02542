//! Validating a `Host` field value (RFC 9112 §3.2, with RFC 3986's host syntax).

/// RFC 9112 §3.2 `Host = uri-host [ ":" port ]`, with RFC 3986's `uri-host = IP-literal /
/// IPv4address / reg-name` (an IPv4 address is also a reg-name) and `port = *DIGIT`. An
/// empty value is valid: a client sends one when the target has no authority.
pub(super) fn valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(literal) => {
            let Some(close) = literal.iter().position(|&b| b == b']') else {
                return false;
            };
            if !valid_ip_literal(&literal[..close]) {
                return false;
            }
            match &literal[close + 1..] {
                [] => (&b""[..], None),
                [b':', port @ ..] => (&b""[..], Some(port)),
                _ => return false,
            }
        }
        None => match value.iter().rposition(|&b| b == b':') {
            Some(colon) => (&value[..colon], Some(&value[colon + 1..])),
            None => (value, None),
        },
    };
    port.is_none_or(|p| p.iter().all(u8::is_ascii_digit)) && valid_reg_name(host)
}

/// `reg-name = *( unreserved / pct-encoded / sub-delims )`.
fn valid_reg_name(name: &[u8]) -> bool {
    let mut i = 0;
    while i < name.len() {
        let b = name[i];
        if b == b'%' {
            match name.get(i + 1..i + 3) {
                Some([h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => i += 3,
                _ => return false,
            }
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)) {
            return false;
        }
        i += 1;
    }
    true
}

/// What may sit between `[` and `]`: an IPv6 address (checked by its characters and by
/// having a colon; a full RFC 4291 check is beyond what routing a request needs) or
/// `IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" )`.
fn valid_ip_literal(inner: &[u8]) -> bool {
    if let Some(future) = inner
        .strip_prefix(b"v")
        .or_else(|| inner.strip_prefix(b"V"))
    {
        let Some(dot) = future.iter().position(|&b| b == b'.') else {
            return false;
        };
        let (version, rest) = (&future[..dot], &future[dot + 1..]);
        return !version.is_empty()
            && version.iter().all(u8::is_ascii_hexdigit)
            && !rest.is_empty()
            && rest
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:".contains(&b));
    }
    inner.contains(&b':')
        && inner
            .iter()
            .all(|&b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
}
