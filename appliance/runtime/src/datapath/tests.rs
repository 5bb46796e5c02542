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
    pub sent: Vec<Vec<u8>>,
    pub counters: Counters,
}

impl MemBackend {
    pub(crate) fn new(tx_free: usize) -> MemBackend {
        MemBackend {
            tx_free,
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
                len: frame.len() as u32,
            });
            self.held.push(Some(frame));
            n += 1;
        }
        self.counters.rx += n as u64;
        n
    }
    fn rx_frame(&self, rx: RxDesc) -> &[u8] {
        self.held[rx.id as usize].as_deref().expect("not recycled")
    }
    fn recycle(&mut self, rx: RxDesc) {
        assert!(self.held[rx.id as usize].take().is_some(), "recycled twice");
    }
    fn tx_alloc(&mut self) -> Option<TxDesc> {
        if self.tx_free == 0 {
            return None;
        }
        self.tx_free -= 1;
        self.tx_bufs.push(vec![0; 2048]);
        Some(TxDesc {
            id: self.tx_bufs.len() as u64 - 1,
            len: 0,
        })
    }
    fn tx_buf(&mut self, tx: TxDesc) -> &mut [u8] {
        &mut self.tx_bufs[tx.id as usize]
    }
    fn tx_burst(&mut self, burst: &[TxDesc]) {
        for tx in burst {
            let buf = &self.tx_bufs[tx.id as usize];
            self.sent.push(buf[..tx.len as usize].to_vec());
        }
        self.counters.tx += burst.len() as u64;
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
    let c = client();
    let mirror = Udp4Addrs {
        src_mac: c.dst_mac,
        dst_mac: c.src_mac,
        src_ip: c.dst_ip,
        dst_ip: c.src_ip,
        src_port: c.dst_port,
        dst_port: c.src_port,
    };
    let mut buf = vec![0u8; udp4::HEADERS_LEN + payload.len()];
    buf[udp4::HEADERS_LEN..].copy_from_slice(payload);
    udp4::write_reply_headers(&mut buf, &mirror, payload.len(), 9).unwrap();
    buf
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
fn echo(n: usize) -> impl FnMut(frame::Frame, &[u8], &mut Vec<u8>) -> Answer {
    move |_, req, out| {
        for _ in 0..n {
            out.extend_from_slice(req);
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
        assert_eq!(&p[..8], &datagram(3, seq as u16, 4, b"")[..]);
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
