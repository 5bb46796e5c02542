//! Sender CPU per memcache-like reply (VALUE line, value, END) on loopback TCP, three ways:
//! copy into one buffer + IORING_OP_SEND, IORING_OP_SENDMSG with an iovec, and
//! IORING_OP_SENDMSG_ZC with the same iovec (waiting for its notification before the next
//! reply, as a pinned value would be held). 2 GiB per mode and size; a reader thread
//! discards. ADR 0027 quotes its output.
use io_uring::{cqueue, opcode, types, IoUring};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn main() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || loop {
        let (mut s, _) = l.accept().unwrap();
        std::thread::spawn(move || {
            let mut b = vec![0u8; 1 << 20];
            while s.read(&mut b).map(|n| n > 0).unwrap_or(false) {}
        });
    });
    let mut ring = IoUring::new(64).unwrap();
    for len in [16usize << 10, 100 << 10, 512 << 10] {
        let value = vec![7u8; len];
        let head = b"VALUE k 0 524288\r\n".to_vec();
        let tail = b"\r\nEND\r\n".to_vec();
        let total = head.len() + len + tail.len();
        let iters = (2usize << 30) / total; // 2 GiB per mode
        for mode in ["copy+send", "sendmsg iovec", "sendmsg_zc iovec"] {
            let s = TcpStream::connect(addr).unwrap();
            s.set_nodelay(true).unwrap();
            let fd = types::Fd(s.as_raw_fd());
            let mut out = Vec::new();
            let t0 = thread_cpu_ns();
            let w0 = std::time::Instant::now();
            for _ in 0..iters {
                let mut sent = 0;
                while sent < total {
                    // Build the pieces from `sent`.
                    let pieces = [&head[..], &value[..], &tail[..]];
                    let mut iov = Vec::new();
                    let mut skip = sent;
                    for p in pieces {
                        if skip >= p.len() {
                            skip -= p.len();
                            continue;
                        }
                        iov.push(libc::iovec {
                            iov_base: p[skip..].as_ptr() as *mut _,
                            iov_len: p.len() - skip,
                        });
                        skip = 0;
                    }
                    // SAFETY: all-zero is a valid msghdr (null pointers, zero lengths).
                    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                    msg.msg_iov = iov.as_mut_ptr();
                    msg.msg_iovlen = iov.len() as _;
                    let e = match mode {
                        "copy+send" => {
                            out.clear();
                            out.extend_from_slice(&head);
                            out.extend_from_slice(&value);
                            out.extend_from_slice(&tail);
                            opcode::Send::new(fd, out[sent..].as_ptr(), (total - sent) as u32)
                                .build()
                        }
                        "sendmsg iovec" => opcode::SendMsg::new(fd, &msg).build(),
                        _ => opcode::SendMsgZc::new(fd, &msg).build(),
                    };
                    // `msg`, `iov`, `out` and the pieces outlive the wait below, which returns
                    // only after the send's completion (and its notification).
                    // SAFETY: every pointer in the entry stays valid until then (above).
                    unsafe { ring.submission().push(&e.user_data(1)).unwrap() };
                    let zc = mode.starts_with("sendmsg_zc");
                    let mut res = None;
                    let mut notif = !zc;
                    while res.is_none() || !notif {
                        ring.submit_and_wait(1).unwrap();
                        for c in ring.completion() {
                            if cqueue::notif(c.flags()) {
                                notif = true;
                                continue;
                            }
                            if !cqueue::more(c.flags()) {
                                notif = true;
                            }
                            res = Some(c.result());
                        }
                    }
                    let r = res.unwrap();
                    assert!(r > 0, "send failed {r}");
                    sent += r as usize;
                }
            }
            let cpu = thread_cpu_ns() - t0;
            let wall = w0.elapsed().as_secs_f64();
            println!(
                "{:>7} B  {:<17} {:>7.2} µs sender CPU/reply  {:>6.2} GB/s wall",
                len,
                mode,
                cpu as f64 / iters as f64 / 1000.0,
                (iters * total) as f64 / wall / 1e9
            );
        }
    }
}
