//! Sans-IO packet formats of memcache over UDP: memcached's 8-byte frame header
//! ([`frame`]), and the Ethernet/IPv4/UDP headers a frame-level datapath (AF_XDP, a NIC's
//! own rings) parses and writes in place ([`udp4`]). No socket, no allocation: callers own
//! every buffer.

pub mod frame;
pub mod udp4;
