//! QEMU test of a large object on the appliance's data disk (ADR 0013): an HTTP PUT bigger
//! than `item-size-max` streams to the virtio-blk disk in chunks, reads back whole and by
//! range, and is still there, byte for byte, after a clean poweroff and a power cut.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Result};

use super::{boot_ready, console_line_with, ScratchDisks, DISK_PROFILE};
use crate::client::tcp;
use crate::image::Image;
use crate::vm::Vm;

/// 12 MiB: 12 times `item-size-max`, and it fits one worker's half of the 64 MiB disk.
const OBJECT_LEN: usize = 12 << 20;

/// The object's bytes: every 4 KiB block names its offset, so a misplaced block shows.
fn object() -> Vec<u8> {
    let mut v = Vec::with_capacity(OBJECT_LEN);
    let mut block = 0u64;
    while v.len() < OBJECT_LEN {
        let line = format!("block {block:>10} of the large object;");
        v.extend(line.bytes().cycle().take(4096));
        block += 1;
    }
    v.truncate(OBJECT_LEN);
    v
}

/// One HTTP exchange; returns (status line, headers, body), reading the body by its
/// Content-Length (bounded by `OBJECT_LEN`).
fn http(port: u16, head: &str, body: &[u8]) -> Result<(String, String, Vec<u8>)> {
    let mut s: TcpStream = tcp(port)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(head.as_bytes())?;
    for piece in body.chunks(256 << 10) {
        s.write_all(piece)?;
    }
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let head_end = loop {
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = s.read(&mut buf)?;
        if n == 0 || got.len() > 64 << 10 {
            bail!("no response head: {:?}", String::from_utf8_lossy(&got));
        }
        got.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(Ok(0), str::parse)?;
    anyhow::ensure!(
        len <= OBJECT_LEN,
        "Content-Length {len} larger than the object"
    );
    let mut body = got[head_end..].to_vec();
    while body.len() < len {
        let n = s.read(&mut buf)?;
        if n == 0 {
            bail!("body ended after {} of {len} bytes", body.len());
        }
        body.extend_from_slice(&buf[..n]);
    }
    let status = head.lines().next().unwrap_or_default().to_string();
    Ok((status, head, body))
}

fn check_object(port: u16, want: &[u8], when: &str) -> Result<()> {
    let (status, _, body) = http(
        port,
        "GET /big HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
        &[],
    )?;
    anyhow::ensure!(status == "HTTP/1.1 200 OK", "{when}: GET answered {status}");
    anyhow::ensure!(
        body == want,
        "{when}: {} bytes read back, first difference at {:?}",
        body.len(),
        body.iter().zip(want).position(|(a, b)| a != b)
    );
    let (first, last) = (5 << 20, (5 << 20) + 300_000);
    let (status, head, body) = http(
        port,
        &format!("GET /big HTTP/1.1\r\nHost: h\r\nRange: bytes={first}-{last}\r\nConnection: close\r\n\r\n"),
        &[],
    )?;
    anyhow::ensure!(
        status == "HTTP/1.1 206 Partial Content"
            && head.contains(&format!("Content-Range: bytes {first}-{last}/{OBJECT_LEN}")),
        "{when}: range GET answered {head}"
    );
    anyhow::ensure!(body == want[first..=last], "{when}: range bytes differ");
    Ok(())
}

pub fn large_object_survives_poweroff_and_power_cut(image: &Image) -> Result<String> {
    let disks = ScratchDisks::create("large", DISK_PROFILE)?;
    let want = object();
    let vm = boot_ready(image, "large-1", "", &disks)?;
    let port = vm.port("http", 0)?;
    let put = format!(
        "PUT /big HTTP/1.1\r\nHost: h\r\nContent-Length: {OBJECT_LEN}\r\nConnection: close\r\n\r\n"
    );
    let started = std::time::Instant::now();
    let (status, _, _) = http(port, &put, &want)?;
    let put_s = started.elapsed().as_secs_f64();
    anyhow::ensure!(status == "HTTP/1.1 201 Created", "PUT answered {status}");
    check_object(port, &want, "after the PUT")?;
    // Acknowledged means durable: pull the plug at once.
    vm.power_cut()?;

    let mut vm = boot_ready(image, "large-2", "", &disks)?;
    console_line_with(&vm, "data device /dev/vda: recovered by scanning the logs")?;
    check_object(vm.port("http", 0)?, &want, "after the power cut")?;
    vm.poweroff()?;
    drop(vm);

    let mut vm: Vm = boot_ready(image, "large-3", "", &disks)?;
    console_line_with(
        &vm,
        "data device /dev/vda: recovered from the shutdown checkpoint",
    )?;
    check_object(vm.port("http", 0)?, &want, "after the poweroff")?;
    vm.poweroff()?;
    Ok(format!(
        "12 MiB PUT in {put_s:.1} s under TCG; whole and ranged GETs exact after a power cut and a poweroff"
    ))
}
