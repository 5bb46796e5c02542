//! Building a worker's io_uring with the best features this kernel offers, and recording which.

use io_uring::{opcode, IoUring, Probe};
use ringstore_config::IoUringSetup;

/// The io_uring features a worker ended up using (logged once at start, see ADR-0004).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    pub single_issuer: bool,
    pub defer_taskrun: bool,
    pub coop_taskrun: bool,
    /// Provided buffer ring for recv (else a buffer per connection).
    pub buf_ring: bool,
    /// Kernel polls sockets internally (no io-wq thread per blocked recv).
    pub fast_poll: bool,
    /// Completion-queue overflow is kept, not dropped.
    pub nodrop: bool,
}

impl std::fmt::Display for Features {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flags = [
            ("single_issuer", self.single_issuer),
            ("defer_taskrun", self.defer_taskrun),
            ("coop_taskrun", self.coop_taskrun),
            ("buf_ring", self.buf_ring),
            ("fast_poll", self.fast_poll),
            ("nodrop", self.nodrop),
        ];
        let on: Vec<&str> = flags
            .iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect();
        let off: Vec<&str> = flags
            .iter()
            .filter(|(_, on)| !*on)
            .map(|(n, _)| *n)
            .collect();
        write!(f, "on=[{}] off=[{}]", on.join(","), off.join(","))
    }
}

/// Submission queue entries per worker ring.
pub(crate) const SQ_ENTRIES: u32 = 1024;
/// Completion queue entries (connections × in-flight ops per connection, with headroom).
const CQ_ENTRIES: u32 = 8192;

/// Creates a ring on the calling thread (SINGLE_ISSUER binds it to this thread), trying
/// SINGLE_ISSUER+DEFER_TASKRUN, then COOP_TASKRUN, then a plain ring.
///
/// `setup` (the hidden `io-uring-setup` key, for measurement) starts further down that list.
pub(crate) fn build(setup: IoUringSetup) -> std::io::Result<(IoUring, Features)> {
    let attempts: [(bool, bool, bool); 3] = [
        (true, true, true),
        (false, false, true),
        (false, false, false),
    ];
    let skip = match setup {
        IoUringSetup::Full => 0,
        IoUringSetup::Coop => 1,
        IoUringSetup::Plain => 2,
    };
    let mut last_err = None;
    for (single_issuer, defer_taskrun, coop_taskrun) in attempts.into_iter().skip(skip) {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(CQ_ENTRIES).setup_clamp();
        if single_issuer {
            builder.setup_single_issuer();
        }
        if defer_taskrun {
            builder.setup_defer_taskrun();
        }
        if coop_taskrun {
            builder.setup_coop_taskrun();
        }
        match builder.build(SQ_ENTRIES) {
            Ok(ring) => {
                let params = ring.params();
                let features = Features {
                    single_issuer,
                    defer_taskrun,
                    coop_taskrun,
                    buf_ring: false,
                    fast_poll: params.is_feature_fast_poll(),
                    nodrop: params.is_feature_nodrop(),
                };
                return Ok((ring, features));
            }
            Err(err) => last_err = Some(err),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("io_uring_setup failed")))
}

/// Whether a worker could set up its ring here (`--io auto`): a ring as a worker builds it,
/// and the opcodes it needs. Err: why not, in the words the log and `--io io_uring` give.
pub(crate) fn probe(setup: IoUringSetup) -> Result<(), String> {
    let ring = match build(setup) {
        Ok((ring, _)) => ring,
        Err(err) => {
            return Err(match err.raw_os_error() {
                Some(libc::EPERM) => {
                    "io_uring not permitted (seccomp or kernel.io_uring_disabled)".to_string()
                }
                Some(libc::ENOSYS) => enosys_cause(
                    std::fs::read_to_string("/proc/self/status")
                        .ok()
                        .as_deref()
                        .and_then(seccomp_mode),
                    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok(),
                ),
                _ => format!("io_uring_setup failed: {err}"),
            })
        }
    };
    if supports_needed_ops(&ring) {
        Ok(())
    } else {
        Err("this kernel's io_uring lacks recv/send/accept/timeout".to_string())
    }
}

/// The `Seccomp:` mode in a `/proc/self/status` text: 0 none, 1 strict, 2 a filter.
fn seccomp_mode(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Why `io_uring_setup` answered ENOSYS, in the log's words. A seccomp filter answers ENOSYS
/// for calls it does not list (podman's default profile does), so ENOSYS alone does not mean
/// the kernel lacks io_uring: with a filter on this process the filter is the likely cause,
/// and a kernel that has the `kernel.io_uring_disabled` sysctl was built with io_uring.
fn enosys_cause(seccomp: Option<u32>, io_uring_disabled: Option<String>) -> String {
    let sysctl = io_uring_disabled
        .as_deref()
        .map(str::trim)
        .map_or_else(|| "absent".to_string(), str::to_string);
    match seccomp {
        Some(mode @ 1..) => format!(
            "io_uring refused (ENOSYS) with a seccomp filter on this process (Seccomp: {mode}): \
             probably the container's seccomp profile (kernel.io_uring_disabled: {sysctl})"
        ),
        _ if io_uring_disabled.is_some() => format!(
            "io_uring refused (ENOSYS) with no seccomp filter on this process, though this kernel \
             has io_uring (kernel.io_uring_disabled: {sysctl}): probably a sandbox such as gVisor"
        ),
        Some(_) => "io_uring not in this kernel (ENOSYS; no seccomp filter on this process, \
                    no kernel.io_uring_disabled sysctl)"
            .to_string(),
        None => "io_uring refused (ENOSYS; /proc/self/status unreadable, so seccomp or a kernel \
                 without io_uring)"
            .to_string(),
    }
}

/// Whether the kernel supports the opcodes the worker needs.
pub(crate) fn supports_needed_ops(ring: &IoUring) -> bool {
    let mut probe = Probe::new();
    if ring.submitter().register_probe(&mut probe).is_err() {
        return false;
    }
    [
        opcode::Recv::CODE,
        opcode::Send::CODE,
        opcode::Read::CODE,
        opcode::Timeout::CODE,
        opcode::Accept::CODE,
    ]
    .iter()
    .all(|&code| probe.is_supported(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_ring_and_reports_features() {
        let (ring, features) = build(IoUringSetup::Full).expect("io_uring available");
        assert!(supports_needed_ops(&ring));
        let text = features.to_string();
        assert!(text.starts_with("on=[") && text.contains("off=["), "{text}");
    }

    #[test]
    fn enosys_names_the_probable_cause() {
        let status = "Name:\tringstore\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        assert_eq!(seccomp_mode(status), Some(2));
        assert_eq!(seccomp_mode("Name:\tx\n"), None);
        assert_eq!(
            enosys_cause(Some(2), Some("0\n".into())),
            "io_uring refused (ENOSYS) with a seccomp filter on this process (Seccomp: 2): \
             probably the container's seccomp profile (kernel.io_uring_disabled: 0)"
        );
        assert_eq!(
            enosys_cause(Some(2), None),
            "io_uring refused (ENOSYS) with a seccomp filter on this process (Seccomp: 2): \
             probably the container's seccomp profile (kernel.io_uring_disabled: absent)"
        );
        assert!(enosys_cause(Some(0), Some("0".into())).contains("probably a sandbox"));
        assert!(enosys_cause(Some(0), None).starts_with("io_uring not in this kernel (ENOSYS;"));
        assert!(enosys_cause(None, None).contains("unreadable"));
    }

    #[test]
    fn a_plain_setup_asks_for_no_optional_flags() {
        let (_, features) = build(IoUringSetup::Plain).expect("io_uring available");
        assert!(!features.single_issuer && !features.defer_taskrun && !features.coop_taskrun);
    }
}
