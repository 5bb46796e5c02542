//! The ExaNIC backend against the test double (`appliance/exanic-double`): memcache frames in,
//! reply frames out through the real service, a lapped reader counted as a drop, truncated
//! frames dropped, handles released. No card is involved (ADR 0021 lists what this covers).

use super::*;
use crate::datapath::tests::{datagram, request_frame};
use crate::datapath::{poll_frames, Answer, PollScratch};
use crate::handler::{Handler, ServiceHandler};
use ringstore_exanic_double as double;
use ringstore_proto::wire::udp4;
use ringstore_service::{ServiceConfig, Shared, Store, StoreConfig, Topology};

/// The production handler over a small store: requests answered as a worker answers them.
fn service() -> ServiceHandler {
    let store = Store::new(StoreConfig {
        memory_bytes: 16 << 20,
        item_size_max: 1 << 20,
        shards: 64,
        huge_pages: false,
        external_threshold: 0,
    })
    .unwrap();
    ServiceHandler(Shared::new(
        store,
        ServiceConfig::default(),
        Topology::default(),
        1,
        1,
        0,
    ))
}

/// Polls `nic` once, answering through `service` (the handler call every backend makes).
fn poll(
    nic: &mut Exanic,
    service: &ServiceHandler,
    scratch: &mut PollScratch,
) -> crate::datapath::Polled {
    let clock = crate::clock::Clock::start();
    poll_frames(
        nic,
        11_211,
        &[],
        32,
        TX_SLOTS,
        scratch,
        |_, request, reply| {
            service.udp_request(0, request, clock.now(), None, reply);
            Answer::Now
        },
    )
}

fn payloads(device: &str) -> Vec<Vec<u8>> {
    double::take_sent(device)
        .iter()
        .map(|f| {
            udp4::parse(f)
                .expect("a valid reply frame")
                .payload
                .to_vec()
        })
        .collect()
}

#[test]
fn memcache_frames_in_reply_frames_out() {
    double::create("exanic-t1");
    let service = service();
    let mut nic = Exanic::open("exanic-t1", 0).unwrap();
    assert_eq!(nic.mode(), Mode::Exanic);
    let mut scratch = PollScratch::default();
    double::inject(
        "exanic-t1",
        &request_frame(&datagram(1, 0, 1, b"set k 0 0 2\r\nhi\r\n")),
    );
    double::inject(
        "exanic-t1",
        &request_frame(&datagram(2, 0, 1, b"get k nothere\r\n")),
    );
    let polled = poll(&mut nic, &service, &mut scratch);
    assert_eq!((polled.frames, polled.replied), (2, 2));
    let sent = payloads("exanic-t1");
    assert_eq!(sent[0], datagram(1, 0, 1, b"STORED\r\n"));
    assert_eq!(sent[1], datagram(2, 0, 1, b"VALUE k 0 2\r\nhi\r\n"));
    assert_eq!(sent[2], datagram(2, 0, 1, b"END\r\n"));
    let c = nic.counters();
    assert_eq!((c.rx, c.tx, c.dropped), (2, 3, 0));
    // A 3000-byte value comes back in 3 datagrams, all in well-formed frames.
    let value = vec![b'v'; 3000];
    let mut set = b"set big 0 0 3000\r\n".to_vec();
    set.extend_from_slice(&value);
    set.extend_from_slice(b"\r\n");
    // The request itself is larger than one ExaNIC frame buffer: truncated, dropped.
    double::inject("exanic-t1", &request_frame(&datagram(3, 0, 1, &set)));
    let polled = poll(&mut nic, &service, &mut scratch);
    assert_eq!(polled.frames, 0);
    assert_eq!(nic.counters().dropped, 1);
    drop(nic);
    assert_eq!(
        double::open_count("exanic-t1"),
        0,
        "handle and buffers released"
    );
}

#[test]
fn a_lapped_reader_is_a_counted_drop_and_serving_goes_on() {
    double::create("exanic-t2");
    let service = service();
    let mut nic = Exanic::open("exanic-t2", 0).unwrap();
    let mut scratch = PollScratch::default();
    // More frames than the ring holds arrive while the worker is busy elsewhere.
    for i in 0..(u16::try_from(double::RING_FRAMES).unwrap() + 10) {
        double::inject(
            "exanic-t2",
            &request_frame(&datagram(i, 0, 1, b"version\r\n")),
        );
    }
    let polled = poll(&mut nic, &service, &mut scratch);
    assert_eq!(polled.frames, 0, "what was overwritten is gone");
    assert_eq!(nic.lapped(), 1);
    assert_eq!(nic.counters().dropped, 1);
    // The reader caught up: the next frame is served.
    double::inject(
        "exanic-t2",
        &request_frame(&datagram(99, 0, 1, b"version\r\n")),
    );
    let polled = poll(&mut nic, &service, &mut scratch);
    assert_eq!(polled.replied, 1);
    let sent = payloads("exanic-t2");
    assert_eq!(sent.len(), 1);
    assert!(sent[0].starts_with(&datagram(99, 0, 1, b"VERSION ")));
    // Garbage on the wire (not IPv4, short) is dropped by the datapath, not answered.
    double::inject("exanic-t2", &[0xff; 20]);
    double::inject("exanic-t2", &request_frame(b"short"));
    let polled = poll(&mut nic, &service, &mut scratch);
    assert_eq!((polled.frames, polled.dropped, polled.replied), (2, 2, 0));
}

#[test]
fn opening_a_missing_device_fails_cleanly() {
    let err = Exanic::open("exanic-missing", 0).unwrap_err();
    assert!(err.to_string().contains("exanic-missing"), "{err}");
    double::create("exanic-t3");
    assert!(matches!(
        Exanic::open("exanic-t3", 1),
        Err(ExanicError::Rx(_, 1))
    ));
    assert_eq!(double::open_count("exanic-t3"), 0, "the handle went back");
    assert!(matches!(
        Exanic::open("bad\0name", 0),
        Err(ExanicError::BadName(_))
    ));
}
