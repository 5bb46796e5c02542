//! Sans-IO protocol codecs: memcache text/meta, HTTP/1.1, the memcache-over-UDP packet formats and a DER reader; bytes in, typed requests out, never a socket.
#![forbid(unsafe_code)]

pub mod der;
pub mod http;
pub mod memcache;
pub mod wire;
