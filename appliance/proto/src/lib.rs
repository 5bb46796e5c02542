//! Sans-IO protocol codecs: memcache text/meta and HTTP/1.1; bytes in, typed requests out, never a socket.
#![forbid(unsafe_code)]

pub mod http;
pub mod memcache;
