//! Every thread of PID 1 with its capabilities, from /proc/self/task/*/status, for the
//! console's `threads`: shows that the serving threads run with none and PID 1's own threads
//! with only their role's (ADR-0008, ADR-0015).

/// Most threads listed; the appliance runs a few per CPU.
const THREADS_MAX: usize = 1024;

/// One thread's privileges as the kernel reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadPrivs {
    pub tid: u32,
    /// The kernel's thread name (`comm`, at most 15 bytes).
    pub name: String,
    pub cap_eff: String,
    pub cap_prm: String,
    /// The bounding set: what the thread and its later children can ever hold.
    pub cap_bnd: String,
    pub no_new_privs: String,
}

/// Reads the fields of one /proc/PID/task/TID/status file; `None` when any is missing.
pub fn parse_status(tid: u32, text: &str) -> Option<ThreadPrivs> {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
    };
    Some(ThreadPrivs {
        tid,
        name: field("Name")?,
        cap_eff: field("CapEff")?,
        cap_prm: field("CapPrm")?,
        cap_bnd: field("CapBnd")?,
        no_new_privs: field("NoNewPrivs")?,
    })
}

/// Every thread of this process, ordered by thread id.
pub fn all() -> Vec<ThreadPrivs> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out: Vec<ThreadPrivs> = dir
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .take(THREADS_MAX)
        .filter_map(|tid| {
            parse_status(
                tid,
                &std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?,
            )
        })
        .collect();
    out.sort_by_key(|t| t.tid);
    out
}

/// `TID NAME capeff HEX capprm HEX capbnd HEX nnp 0|1` lines, a header first.
pub fn lines() -> Vec<String> {
    let mut out = vec![format!(
        "{:>6} {:<15} {:<23} {:<23} {:<23} nnp",
        "tid", "name", "capeff", "capprm", "capbnd"
    )];
    out.extend(all().into_iter().map(|t| {
        format!(
            "{:>6} {:<15} capeff {} capprm {} capbnd {} nnp {}",
            t.tid, t.name, t.cap_eff, t.cap_prm, t.cap_bnd, t.no_new_privs
        )
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read() {
        let text = "Name:\tringstore-w0\nUmask:\t0022\nState:\tS (sleeping)\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000400000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";
        let t = parse_status(7, text).unwrap();
        assert_eq!(
            t,
            ThreadPrivs {
                tid: 7,
                name: "ringstore-w0".into(),
                cap_eff: "0000000000000000".into(),
                cap_prm: "0000000000000000".into(),
                cap_bnd: "0000000000400000".into(),
                no_new_privs: "1".into()
            }
        );
        assert_eq!(
            parse_status(7, "Name:\tx\nCapEff:\t0\n"),
            None,
            "a missing field is not guessed"
        );
    }

    #[test]
    fn this_process_lists_its_own_threads() {
        let threads = all();
        assert!(
            threads.iter().any(|t| t.tid == std::process::id()),
            "the main thread is missing: {threads:?}"
        );
        assert!(threads.windows(2).all(|w| w[0].tid < w[1].tid));
        assert!(lines()[1..]
            .iter()
            .all(|l| l.contains("capeff ") && l.contains(" capbnd ") && l.contains(" nnp ")));
        let own = threads
            .iter()
            .find(|t| t.tid == std::process::id())
            .unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(
            status.contains(&format!("CapBnd:\t{}", own.cap_bnd)),
            "CapBnd {} is not the kernel's:\n{status}",
            own.cap_bnd
        );
    }
}
