//! The memory part: RSS empty and with 1M items, and bytes per item, against memcached.

use super::doc::{mark, Doc};
use super::memory;
use super::procs;
use super::report::{Better, Table};
use super::subject::Subject;
use anyhow::Result;

/// Items for the memory-per-item measurement.
const MEMORY_ITEMS: usize = 1_000_000;

/// memcached against the subject, each with a 512 MiB budget.
pub(super) fn memory_part(subject: &Subject, doc: &mut Doc) -> Result<()> {
    let base = {
        let mut server = procs::start_memcached(512)?;
        doc.command(&server.command);
        memory::measure(&mut server, MEMORY_ITEMS)?
    };
    let name = subject.memcache_name();
    let subj = match subject.start_memcache(512, None) {
        Ok(mut server) => {
            doc.command(&server.command);
            memory::measure(&mut server, MEMORY_ITEMS)
        }
        Err(e) => Err(e),
    };
    let subj = subj
        .map_err(|e| doc.note(format!("memory: {name}: {e:#}")))
        .ok();
    let mib = |v: u64| v as f64 / (1024.0 * 1024.0);
    let mut table = Table::new("memcached", name);
    table.row(
        "RSS empty (MiB)",
        mib(base.rss_empty),
        subj.as_ref().map(|r| mib(r.rss_empty)),
        Better::Neither,
        1,
    );
    table.row(
        "RSS with 1M items (MiB)",
        mib(base.rss_full),
        subj.as_ref().map(|r| mib(r.rss_full)),
        Better::Neither,
        1,
    );
    table.row(
        "bytes per item (100 B values, 13 B keys)",
        base.bytes_per_item(),
        subj.as_ref().map(|r| r.bytes_per_item()),
        Better::Lower,
        1,
    );
    if let Some(s) = &subj {
        let ratio = s.bytes_per_item() / base.bytes_per_item();
        doc.targets.push(format!(
            "memory per item {ratio:.2}× memcached (target ≤ 1.0×) {}",
            mark(ratio <= 1.0)
        ));
    }
    doc.command(&format!("memory: {MEMORY_ITEMS} pipelined sets of {} B values; RSS from /proc/PID/status VmRSS before and after; curr_items checked", memory::VALUE_LEN));
    doc.sections.push(format!(
        "## Memory per item ({MEMORY_ITEMS} items, both with a 512 MiB budget)\n\n{}",
        table.markdown()
    ));
    Ok(())
}
