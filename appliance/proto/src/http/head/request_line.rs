//! The request line: `method SP request-target SP HTTP-version` (RFC 9112 §3), and the check
//! that the first bytes of a request can begin a method at all.
use super::syntax::is_tchar;
use super::{HeadError, Method, Version, METHOD_MAX};

pub(super) fn parse_request_line(line: &[u8]) -> Result<(Method, &[u8], Version), HeadError> {
    let sp = line
        .iter()
        .position(|&b| b == b' ')
        .ok_or(HeadError::Malformed)?;
    let method_bytes = &line[..sp];
    if method_bytes.is_empty()
        || method_bytes.len() > METHOD_MAX
        || !method_bytes.iter().all(|&b| is_tchar(b))
    {
        return Err(HeadError::Malformed);
    }
    let rest = &line[sp + 1..];
    let sp = rest
        .iter()
        .position(|&b| b == b' ')
        .ok_or(HeadError::Malformed)?;
    let target = &rest[..sp];
    if target.is_empty() || !target.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
        return Err(HeadError::Malformed);
    }
    let version = match &rest[sp + 1..] {
        b"HTTP/1.0" => Version::Http10,
        // 1.1, and higher minors of major 1 served as 1.1 (RFC 9110 §2.5).
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', minor] if (b'1'..=b'9').contains(minor) => {
            Version::Http11
        }
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            return Err(HeadError::VersionNotSupported)
        }
        _ => return Err(HeadError::Malformed),
    };
    let method = match method_bytes {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        _ => Method::Other,
    };
    Ok((method, target, version))
}

/// Refuses a request whose first bytes cannot begin a method (see [`METHOD_MAX`]).
pub(super) fn check_method_prefix(buf: &[u8]) -> Result<(), HeadError> {
    for (i, &b) in buf.iter().enumerate().take(METHOD_MAX + 1) {
        if b == b' ' {
            return if i == 0 {
                Err(HeadError::Malformed)
            } else {
                Ok(())
            };
        }
        if !is_tchar(b) {
            return Err(HeadError::Malformed);
        }
    }
    if buf.len() > METHOD_MAX {
        return Err(HeadError::Malformed);
    }
    Ok(())
}
