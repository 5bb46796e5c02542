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
                Some(libc::ENOSYS) => "io_uring not in this kernel (ENOSYS)".to_string(),
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
    fn a_plain_setup_asks_for_no_optional_flags() {
        let (_, features) = build(IoUringSetup::Plain).expect("io_uring available");
        assert!(!features.single_issuer && !features.defer_taskrun && !features.coop_taskrun);
    }
}
