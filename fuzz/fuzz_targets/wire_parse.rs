//! Fuzz target: the memcache-over-UDP packet formats. A frame's Ethernet/IPv4/UDP headers
//! and memcached's frame header must parse without panicking; whatever parses is answered
//! the way a datapath would (reply headers written in place, the reply framed), and the
//! written reply must parse back with the addresses swapped and the payload intact.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringstore_proto::wire::{frame, udp4};

fuzz_target!(|data: &[u8]| {
    if let Ok((f, request)) = frame::parse_request(data) {
        if let Some(frames) = frame::ReplyFrames::new(f, request.len() * 3, 64) {
            let mut total = 0;
            for seq in 0..frames.count() {
                total += frames.datagram(seq).1.len();
            }
            assert_eq!(total, request.len() * 3);
        }
    }
    let Ok(got) = udp4::parse(data) else { return };
    assert!(got.payload_at + got.payload.len() <= data.len());
    let mut buf = vec![0u8; udp4::HEADERS_LEN + got.payload.len()];
    buf[udp4::HEADERS_LEN..].copy_from_slice(got.payload);
    let n = udp4::write_reply_headers(&mut buf, &got.addrs, got.payload.len(), 7)
        .expect("a received payload fits a reply");
    let back = udp4::parse(&buf[..n]).expect("a written reply parses");
    assert_eq!(back.payload, got.payload);
    assert_eq!(back.addrs.src_ip, got.addrs.dst_ip);
    assert_eq!(back.addrs.dst_port, got.addrs.src_port);
});
