//! What the runtime lends `/metrics` through [`ringstore_service::Started`] (the service reads
//! no clock and no file itself): a monotonic nanosecond clock for the latency histograms, and
//! each worker thread's CPU time.

use std::sync::OnceLock;

/// The monotonic reading ([`crate::sys::monotonic_ns`]) [`mono_ns`] counts from (the first
/// call of either).
pub(crate) fn mono_origin() -> u64 {
    static ORIGIN: OnceLock<u64> = OnceLock::new();
    *ORIGIN.get_or_init(crate::sys::monotonic_ns)
}

/// Monotonic nanoseconds since [`mono_origin`]; the loop's [`crate::clock::Clock::now`]
/// reads the same scale into `Now::mono_ns`, so a session's start and end readings compare.
pub(crate) fn mono_ns() -> u64 {
    crate::sys::monotonic_ns().saturating_sub(mono_origin())
}

/// Calls `each(worker, ns)` for every worker thread (`ringstore-w<N>`) whose CPU time it can
/// read: one pass over `/proc/self/task` (two small procfs reads per thread).
pub(crate) fn worker_cpu(each: &mut dyn FnMut(usize, u64)) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let index = comm
            .trim()
            .strip_prefix("ringstore-w")
            .and_then(|i| i.parse::<usize>().ok());
        if let Some((worker, ns)) = index.zip(thread_cpu_ns(tid)) {
            each(worker, ns);
        }
    }
}

/// A thread's time on CPU in nanoseconds: the first field of its `schedstat` (a kernel with
/// scheduler info), else user plus system time from its `stat`, in USER_HZ (100) ticks.
fn thread_cpu_ns(tid: u32) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        return text.split_whitespace().next()?.parse().ok();
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks: u64 = rest.next()?.parse::<u64>().ok()? + rest.next()?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}
