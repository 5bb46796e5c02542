//! Sans-IO protocol codecs: memcache text/meta, HTTP/1.1 and the memcache-over-UDP packet formats; bytes in, typed requests out, never a socket.
#![forbid(unsafe_code)]

pub mod http;
pub mod memcache;
pub mod wire;
