//! The datapath interface against an in-memory frame backend: frames in, reply frames out,
//! foreign, short and multi-datagram frames dropped, TX room honoured.

use super::*;
use ringstore_proto::wire::udp4::Udp4Addrs;

/// A frame backend over vectors: `rx` queued frames, `sent` what was transmitted.
#[derive(Default)]
pub(crate) struct MemBackend {
    pub rx: std::collections::VecDeque<Vec<u8>>,
    pub held: Vec<Option<Vec<u8>>>,
    pub tx_bufs: Vec<Vec<u8>>,
    pub tx_free: usize,
    /// Bytes of each TX buffer.
    pub tx_size: usize,
    pub sent: Vec<Vec<u8>>,
    pub counters: Counters,
}

impl MemBackend {
    pub(crate) fn new(tx_free: usize) -> MemBackend {
        MemBackend {
            tx_free,
            tx_size: 2048,
            ..MemBackend::default()
        }
    }
}

impl FrameBackend for MemBackend {
    fn mode(&self) -> Mode {
        Mode::XdpCopy
    }
    fn rx_burst(&mut self, burst: &mut Vec<RxDesc>, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(frame) = self.rx.pop_front() else {
                break;
            };
            burst.push(RxDesc {
                id: self.held.len() as u64,
                len: u32::try_from(frame.len()).unwrap(),
            });
            self.held.push(Some(frame));
            n += 1;
        }
        self.counters.rx += n as u64;
        n
    }
    fn rx_frame(&self, rx: RxDesc) -> &[u8] {
        self.held[usize::try_from(rx.id).unwrap()]
            .as_deref()
            .expect("not recycled")
    }
    fn recycle(&mut self, rx: RxDesc) {
        assert!(
            self.held[usize::try_from(rx.id).unwrap()].take().is_some(),
            "recycled twice"
        );
    }
    fn tx_alloc(&mut self) -> Option<TxDesc> {
        if self.tx_free == 0 {
            return None;
        }
        self.tx_free -= 1;
        self.tx_bufs.push(vec![0; self.tx_size]);
        Some(TxDesc {
            id: self.tx_bufs.len() as u64 - 1,
            len: 0,
        })
    }
    fn tx_buf(&mut self, tx: TxDesc) -> &mut [u8] {
        &mut self.tx_bufs[usize::try_from(tx.id).unwrap()]
    }
    fn tx_burst(&mut self, burst: &[TxDesc]) {
        self.tx_free += burst.iter().filter(|tx| tx.len == 0).count();
        for tx in burst.iter().filter(|tx| tx.len > 0) {
            let buf = &self.tx_bufs[usize::try_from(tx.id).unwrap()];
            self.sent.push(buf[..tx.len as usize].to_vec());
            self.counters.tx += 1;
        }
    }
    fn counters(&self) -> Counters {
        self.counters
    }
}

pub(crate) fn client() -> Udp4Addrs {
    Udp4Addrs {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: [10, 0, 0, 1],
        dst_ip: [10, 0, 0, 2],
        src_port: 40_000,
        dst_port: 11_211,
    }
}

/// A frame from `client()` to the server carrying `payload`.
pub(crate) fn request_frame(payload: &[u8]) -> Vec<u8> {
    udp4::frame_from(&client(), payload, 9).unwrap()
}

pub(crate) fn datagram(id: u16, seq: u16, count: u16, body: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    for f in [id, seq, count, 0] {
        d.extend_from_slice(&f.to_be_bytes());
    }
    d.extend_from_slice(body);
    d
}

/// An `answer` that echoes the request `n` times.
fn echo(n: usize) -> impl FnMut(frame::Frame, &[u8], &mut Reply) -> Answer {
    move |_, req, out| {
        for _ in 0..n {
            out.bytes.extend_from_slice(req);
        }
        Answer::Now
    }
}

#[test]
fn a_request_frame_gets_reply_frames_addressed_back() {
    let mut b = MemBackend::new(64);
    b.rx.push_back(request_frame(&datagram(7, 0, 1, b"get k\r\n")));
    let mut scratch = PollScratch::default();
    let polled = poll_frames(&mut b, 11_211, &[], 64, 64, &mut scratch, echo(1));
    assert_eq!(
        polled,
        Polled {
            frames: 1,
            replied: 1,
            datagrams: 1,
            dropped: 0
        }
    );
    assert_eq!(b.sent.len(), 1);
    let reply = udp4::parse(&b.sent[0]).expect("a valid reply frame");
    assert_eq!(reply.addrs.dst_ip, client().src_ip);
    assert_eq!(reply.addrs.dst_port, client().src_port);
    assert_eq!(reply.addrs.dst_mac, client().src_mac);
    assert_eq!(reply.payload, datagram(7, 0, 1, b"get k\r\n"));
    assert!(
        b.held.iter().all(Option::is_none),
        "every RX buffer recycled"
    );
}

#[test]
fn a_long_reply_is_split_and_sent_whole_or_not_at_all() {
    let body = vec![b'v'; 1000];
    let mut b = MemBackend::new(64);
    b.rx.push_back(request_frame(&datagram(3, 0, 1, &body)));
    let mut scratch = PollScratch::default();
    // 5000 bytes: 4 datagrams of at most 1392 bytes of reply each.
    let polled = poll_frames(&mut b, 11_211, &[], 64, 64, &mut scratch, echo(5));
    assert_eq!(polled.datagrams, 4);
    let mut joined = Vec::new();
    for (seq, f) in b.sent.iter().enumerate() {
        let p = udp4::parse(f).unwrap().payload;
        assert!(p.len() <= frame::DATAGRAM_MAX);
        assert_eq!(
            &p[..8],
            &datagram(3, u16::try_from(seq).unwrap(), 4, b"")[..]
        );
        joined.extend_from_slice(&p[8..]);
    }
    assert_eq!(joined.len(), 5000);
    // Room for 3 only: nothing goes out, the request counts as dropped.
    let mut b = MemBackend::new(64);
    b.rx.push_back(request_frame(&datagram(3, 0, 1, &body)));
    let polled = poll_frames(&mut b, 11_211, &[], 64, 3, &mut scratch, echo(5));
    assert_eq!((polled.datagrams, polled.dropped), (0, 1));
    assert!(b.sent.is_empty());
}

#[test]
fn foreign_short_multi_and_disallowed_frames_are_dropped() {
    let mut b = MemBackend::new(64);
    let good = request_frame(&datagram(1, 0, 1, b"x"));
    let mut other_port = good.clone();
    // Not to the memcache port (the checksum no longer matters: refused either way).
    other_port[36..38].copy_from_slice(&53u16.to_be_bytes());
    b.rx.push_back(other_port);
    b.rx.push_back(request_frame(b"short"));
    b.rx.push_back(request_frame(&datagram(1, 0, 2, b"part one")));
    b.rx.push_back(request_frame(&datagram(1, 1, 2, b"part two")));
    b.rx.push_back(good[..good.len() - 3].to_vec());
    b.rx.push_back(vec![0xff; 9]);
    let mut scratch = PollScratch::default();
    let polled = poll_frames(&mut b, 11_211, &[], 64, 64, &mut scratch, echo(1));
    assert_eq!((polled.frames, polled.dropped, polled.replied), (6, 6, 0));
    assert!(b.sent.is_empty());
    // A source outside the allow list.
    b.rx.push_back(good.clone());
    let allow = ["192.168.0.0/16".parse().unwrap()];
    let polled = poll_frames(&mut b, 11_211, &allow, 64, 64, &mut scratch, echo(1));
    assert_eq!(polled.dropped, 1);
    let allow = ["10.0.0.0/8".parse().unwrap()];
    b.rx.push_back(good);
    let polled = poll_frames(&mut b, 11_211, &allow, 64, 64, &mut scratch, echo(1));
    assert_eq!(polled.replied, 1);
}

#[test]
fn the_burst_budget_bounds_one_poll() {
    let mut b = MemBackend::new(1000);
    for i in 0..100 {
        b.rx.push_back(request_frame(&datagram(i, 0, 1, b"get k\r\n")));
    }
    let mut scratch = PollScratch::default();
    let polled = poll_frames(&mut b, 11_211, &[], 32, 64, &mut scratch, echo(1));
    assert_eq!((polled.frames, polled.replied), (32, 32));
    assert_eq!(b.rx.len(), 68);
    // A noreply request sends nothing; a held one neither (frame backends don't hold).
    b.rx.clear();
    b.rx.push_back(request_frame(&datagram(1, 0, 1, b"x")));
    let polled = poll_frames(&mut b, 11_211, &[], 32, 64, &mut scratch, |_, _, _| {
        Answer::Now
    });
    assert_eq!((polled.replied, polled.dropped), (0, 0));
}

#[test]
fn modes_have_stable_names() {
    let names: Vec<&str> = [
        Mode::KernelUdp,
        Mode::XdpZeroCopy,
        Mode::XdpCopy,
        Mode::XdpGeneric,
        Mode::Exanic,
    ]
    .iter()
    .map(|m| m.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "kernel-udp",
            "xdp-zerocopy",
            "xdp-copy",
            "xdp-generic",
            "exanic"
        ]
    );
}

/// Collects what a reply emits.
#[derive(Default)]
struct Collect {
    room: usize,
    got: Vec<Vec<u8>>,
}

impl ReplySink for Collect {
    fn has_room(&mut self, count: usize) -> bool {
        count <= self.room
    }
    fn datagram(&mut self, header: &[u8; frame::HEADER_LEN], body: &[u8]) {
        let mut d = header.to_vec();
        d.extend_from_slice(body);
        self.got.push(d);
    }
}

fn mark(end: usize, keep_empty: bool) -> ResponseMark {
    ResponseMark { end, keep_empty }
}

#[test]
fn each_response_is_framed_on_its_own_as_memcached_does() {
    // "get nothere k1 nothere k2": an empty first response for the first miss (header
    // only), k1's value, nothing for the second miss, k2's value + END.
    let mut bytes = b"VALUE k1 0 1\r\na\r\n".to_vec();
    let first = bytes.len();
    bytes.extend_from_slice(b"VALUE k2 0 1\r\nb\r\nEND\r\n");
    let reply = Reply {
        bytes,
        marks: vec![
            mark(0, true),
            mark(first, true),
            mark(first, true),
            mark(0, false),       // out of order: ignored
            mark(1 << 20, false), // past the end: ignored
        ],
    };
    let mut sink = Collect {
        room: 16,
        ..Collect::default()
    };
    assert_eq!(
        emit(frame::Frame { request_id: 5 }, &reply, &mut sink),
        Served::Replied(3)
    );
    assert_eq!(sink.got[0], datagram(5, 0, 0, b""), "header only, count 0");
    assert_eq!(sink.got[1], datagram(5, 0, 1, b"VALUE k1 0 1\r\na\r\n"));
    assert_eq!(
        sink.got[2],
        datagram(5, 0, 1, b"VALUE k2 0 1\r\nb\r\nEND\r\n")
    );
    // A noreply command's empty response sends nothing; no response at all is NoReply.
    let quiet = Reply {
        bytes: Vec::new(),
        marks: vec![mark(0, false)],
    };
    assert_eq!(
        emit(frame::Frame { request_id: 1 }, &quiet, &mut sink),
        Served::NoReply
    );
    // No room for all three: nothing at all.
    let mut small = Collect {
        room: 2,
        ..Collect::default()
    };
    assert_eq!(
        emit(frame::Frame { request_id: 5 }, &reply, &mut small),
        Served::Dropped(DropReason::NoRoom)
    );
    assert!(small.got.is_empty());
}

#[test]
fn a_tx_buffer_too_small_for_its_frame_goes_back_unsent() {
    let mut b = MemBackend::new(8);
    b.tx_size = 40; // smaller than the 42 bytes of headers alone
    b.rx.push_back(request_frame(&datagram(1, 0, 1, b"get k\r\n")));
    let mut scratch = PollScratch::default();
    poll_frames(&mut b, 11_211, &[], 8, 8, &mut scratch, echo(1));
    assert!(b.sent.is_empty());
    assert_eq!(b.tx_free, 8, "the buffer came back");
}
