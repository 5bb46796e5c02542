//! A box whose data device is full (issue 36, ADR 0039), driven through the forwarded
//! memcache port: big values fill the data partition fast; in `refuse` mode the sets end in
//! the device-full error, in `evict` mode they keep being stored. The update test runs its
//! updates on such a box (`uefi.rs`), where the canary's writes are refused like any client's
//! (no key buys the delete reserve, ADR 0039) and the trial counts the device-full answer as
//! the box serving as configured.

use std::net::TcpStream;

use anyhow::{bail, ensure, Context, Result};

use super::client::{get, set, tcp};
use super::vm::Vm;

/// Value bytes of one fill item: about 2,000 of them fill the default disk.img's ~95 MB data
/// partition in 190 sets (under memcached's 1 MiB item limit).
const BIG: usize = 500_000;
/// The refusal a `data_full = refuse` box answers a set with (service `DEVICE_FULL`).
const DEVICE_FULL: &str = "SERVER_ERROR data device full storing object\r\n";

fn fill_key(i: usize) -> String {
    format!("fill{i:05}")
}

/// The value of fill item `i`: ASCII, its own number first, so a read checks it exactly.
fn fill_value(i: usize) -> String {
    let head = format!("{i}:");
    let body: String = (0..BIG - head.len())
        .map(|j| char::from(b'a' + u8::try_from((i + j) % 26).unwrap_or(0)))
        .collect();
    head + &body
}

/// `set` of fill item `i` on `stream`: the answer line.
fn set_fill(stream: &mut TcpStream, i: usize) -> Result<String> {
    set(stream, &fill_key(i), &fill_value(i))
}

/// Connections the fill holds open at once: the server places each new connection on its
/// least-loaded worker, so these reach every worker, and so every region (one a worker).
const FILL_CONNS: usize = 4;

/// `data_full = refuse`: sets items `0..` round robin over [`FILL_CONNS`] connections, each
/// dropped at its first device-full error, until all are (at most `most` sets, else the
/// device never filled); returns the number of the last one stored.
fn fill_until_refused(port: u16, most: usize) -> Result<usize> {
    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    for _ in 0..FILL_CONNS {
        conns.push(Some(tcp(port)?));
    }
    let mut last = None;
    for i in 0..most {
        let open: Vec<usize> = (0..conns.len()).filter(|&c| conns[c].is_some()).collect();
        let Some(&c) = open.get(i % open.len().max(1)) else {
            return last.context("the first sets were refused: the device was full before");
        };
        let Some(stream) = conns[c].as_mut() else {
            continue;
        };
        match set_fill(stream, i)?.as_str() {
            "STORED\r\n" => last = Some(i),
            DEVICE_FULL => conns[c] = None,
            other => bail!("set {} answered {other:?}", fill_key(i)),
        }
    }
    bail!("{most} sets of {BIG} bytes never filled the data device")
}

/// The console's `data`: every region has at most the two reserved segments (compaction's and
/// deletes') without live data, i.e. it is full; the regions as `live/all` segments.
fn every_region_full(data: &[serde_json::Value]) -> Result<String> {
    let regions = data
        .first()
        .and_then(|d| d["state"]["regions"].as_array())
        .with_context(|| format!("`data` has no regions: {data:?}"))?;
    let mut shown = Vec::new();
    for r in regions {
        let live = r["segments_with_live_data"].as_u64().unwrap_or(0);
        let all = r["segments"].as_u64().unwrap_or(u64::MAX);
        ensure!(live + 2 >= all, "region not full: {r}");
        shown.push(format!("{live}/{all}"));
    }
    Ok(shown.join(", "))
}

/// `data_full = evict`: `count` sets from item `from` on are all stored.
fn keep_storing(port: u16, from: usize, count: usize) -> Result<()> {
    let mut stream = tcp(port)?;
    for i in from..from + count {
        let answer = set_fill(&mut stream, i)?;
        ensure!(
            answer == "STORED\r\n",
            "on a full evicting device set {} answered {answer:?}",
            fill_key(i)
        );
    }
    Ok(())
}

/// Fill item `i` reads back with its exact value.
fn reads_back(port: u16, i: usize) -> Result<()> {
    let got = get(&mut tcp(port)?, &fill_key(i))?;
    ensure!(
        got.as_deref() == Some(fill_value(i).as_str()),
        "get {} answered {:?} bytes, not its {BIG}",
        fill_key(i),
        got.map(|v| v.len())
    );
    Ok(())
}

/// Slot A of the update test (`data_full = refuse`): filled until every connection is refused
/// and every region full; the last item stored, and a line saying what filled it.
pub(super) fn refusing_box_filled(vm: &mut Vm) -> Result<(usize, String)> {
    let started = std::time::Instant::now();
    let last = fill_until_refused(vm.port("memcache", 0)?, 400)?;
    let secs = started.elapsed().as_secs_f64();
    let regions = every_region_full(&vm.json("data")?)?;
    let filled = format!(
        "sets of {BIG} bytes until each of {FILL_CONNS} connections was refused, the last stored number {}, in {secs:.1} s; segments with live data per region {regions}",
        last + 1,
    );
    Ok((last, filled))
}

/// Slot B of the update test (`evict`, on A's full device): A's last value reads back, 80
/// more sets are stored, and `data` counts evicted segments.
pub(super) fn evicting_box_keeps_storing(vm: &mut Vm, last_on_a: usize) -> Result<()> {
    let port = vm.port("memcache", 0)?;
    reads_back(port, last_on_a)?;
    keep_storing(port, last_on_a + 1, 80)?;
    let data = vm.json("data")?;
    let evicted = data.first().map(|d| d["state"]["evicted_segments"].clone());
    ensure!(
        evicted.as_ref().and_then(serde_json::Value::as_u64) > Some(0),
        "slot B (evict) stored on a full device without evicting: {data:?}"
    );
    Ok(())
}
