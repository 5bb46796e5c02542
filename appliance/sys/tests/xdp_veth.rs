//! The XDP program and an AF_XDP socket against the real kernel: a veth pair whose peer end
//! is in a network namespace, the program attached to the near end; a UDP datagram to the
//! steered port arrives on the socket, one to another port does not. Needs root and `ip`;
//! skipped (passes with a note) otherwise.

use std::os::fd::AsFd;
use std::process::Command;
use std::time::{Duration, Instant};

use ringstore_sys as sys;

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .status()
        .is_ok_and(|s| s.success())
}

/// A veth pair `a` (here, 10.77.N.1) and `b` (in namespace `ns`, 10.77.N.2), removed on drop.
struct Veth {
    a: String,
    ns: String,
}

impl Veth {
    fn new(tag: &str) -> Option<Veth> {
        let n = std::process::id() % 200 + 20;
        let v = Veth {
            a: format!("rsx{tag}{n}a"),
            ns: format!("rsx-{tag}-{}", std::process::id()),
        };
        let b = format!("rsx{tag}{n}b");
        let ok = sh(&["ip", "netns", "add", &v.ns])
            && sh(&[
                "ip", "link", "add", &v.a, "type", "veth", "peer", "name", &b,
            ])
            && sh(&["ip", "link", "set", &b, "netns", &v.ns])
            && sh(&["ip", "addr", "add", &format!("10.77.{n}.1/24"), "dev", &v.a])
            && sh(&["ip", "link", "set", &v.a, "up"])
            && sh(&[
                "ip",
                "-n",
                &v.ns,
                "addr",
                "add",
                &format!("10.77.{n}.2/24"),
                "dev",
                &b,
            ])
            && sh(&["ip", "-n", &v.ns, "link", "set", &b, "up"])
            && sh(&["ip", "-n", &v.ns, "link", "set", "lo", "up"]);
        ok.then_some(v)
    }
    fn peer_ip(&self) -> String {
        format!("10.77.{}.1", std::process::id() % 200 + 20)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

fn send_from_ns(ns: &str, ip: &str, port: u16, text: &str) {
    // bash's /dev/udp needs no extra tools.
    let script = format!("printf '{text}' > /dev/udp/{ip}/{port}");
    assert!(sh(&["ip", "netns", "exec", ns, "bash", "-c", &script]));
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario over one veth pair: set up, steer, send both kinds, check, tear down"
)]
fn udp_to_the_port_reaches_the_socket_and_other_udp_does_not() {
    if !rustix::process::geteuid().is_root() || !sh(&["ip", "-V"]) {
        eprintln!("skipped: needs root and iproute2");
        return;
    }
    let Some(veth) = Veth::new("t") else {
        eprintln!("skipped: cannot create a veth pair here");
        return;
    };
    let ifindex = sys::ifindex(&veth.a).unwrap();
    let queues = sys::rx_queue_count(&veth.a).unwrap();
    assert!(queues >= 1);
    let map = sys::xskmap_create(queues).unwrap();
    let prog = sys::steer_program(std::os::fd::AsRawFd::as_raw_fd(&map), 11299);
    let prog = sys::prog_load_xdp(&prog, "test_steer").unwrap();
    let (link, how) = sys::xdp_link_attach(prog.as_fd(), ifindex, true).unwrap();
    eprintln!("attached {}", how.name());
    let cfg = sys::XskConfig {
        frames: 256,
        frame_size: 4096,
        ring_size: 128,
        fill_frames: 128,
    };
    let mut xsks = Vec::new();
    for q in 0..queues {
        let mut xsk = sys::Xsk::open(ifindex, q, cfg, true)
            .or_else(|_| sys::Xsk::open(ifindex, q, cfg, false))
            .unwrap();
        assert_eq!(xsk.mode(), sys::XskMode::Copy, "veth has no zero-copy");
        sys::xskmap_set(map.as_fd(), q, xsk.as_fd()).unwrap();
        let mut none = Vec::new();
        assert_eq!(xsk.rx_burst(16, &mut none), 0);
        xsks.push(xsk);
    }
    let got = |xsks: &mut Vec<sys::Xsk>, want: &[u8], wait_ms: u64| {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        while Instant::now() < deadline {
            for xsk in xsks.iter_mut() {
                let mut frames = Vec::new();
                xsk.rx_burst(16, &mut frames);
                for f in frames {
                    let hit = xsk.bytes(&f).ends_with(want);
                    xsk.recycle(f);
                    if hit {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    };
    send_from_ns(&veth.ns, &veth.peer_ip(), 11299, "steered");
    assert!(
        got(&mut xsks, b"steered", 3000),
        "UDP to the port reaches the socket"
    );
    // A burst never hands out more than asked, and the rest waits in the ring.
    let script = format!(
        "for i in $(seq 40); do printf burst > /dev/udp/{}/11299; done",
        veth.peer_ip()
    );
    assert!(sh(&[
        "ip", "netns", "exec", &veth.ns, "bash", "-c", &script
    ]));
    let (mut seen, mut max_burst) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while seen < 40 && Instant::now() < deadline {
        for xsk in xsks.iter_mut() {
            let mut frames = Vec::new();
            let n = xsk.rx_burst(16, &mut frames);
            assert_eq!(n as usize, frames.len());
            max_burst = max_burst.max(frames.len());
            for f in frames {
                seen += usize::from(xsk.bytes(&f).ends_with(b"burst"));
                xsk.recycle(f);
            }
        }
    }
    assert_eq!(seen, 40, "every datagram of the burst arrived");
    // All 40 were queued before the first burst: it takes exactly the 16 asked for.
    assert_eq!(max_burst, 16, "a burst takes at most what is asked");
    send_from_ns(&veth.ns, &veth.peer_ip(), 11298, "passed");
    assert!(
        !got(&mut xsks, b"passed", 300),
        "other UDP passes to the kernel"
    );
    // An empty slot passes: clear it, and the frame is not redirected.
    for q in 0..queues {
        sys::xskmap_clear(map.as_fd(), q).unwrap();
    }
    send_from_ns(&veth.ns, &veth.peer_ip(), 11299, "cleared");
    assert!(!got(&mut xsks, b"cleared", 300));
    // Transmit: a frame goes out and its completion frees it again.
    let xsk = &mut xsks[0];
    let before = xsk.free_frames();
    let mut f = xsk.alloc().unwrap();
    assert!(xsk.resize(&mut f, 60));
    xsk.bytes(&f).fill(0xff);
    let mut out = vec![f];
    assert_eq!(xsk.transmit(&mut out), 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while xsk.pump_tx() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(xsk.free_frames(), before, "the sent frame completed");
    drop(xsks);
    drop(link);
    let shown = Command::new("ip")
        .args(["link", "show", &veth.a])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&shown.stdout).contains("xdp"),
        "closing the link detaches the program"
    );
}
