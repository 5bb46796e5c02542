//! Capabilities per thread of PID 1. Linux keeps every capability set, the bounding set and
//! no_new_privs per thread, and a new thread inherits its creator's; so each thread narrows its
//! own sets, as its first act, to the role it has (ADR-0015):
//!
//! | role | capabilities | why |
//! | --- | --- | --- |
//! | [`Role::Boot`] (PID 1's main thread until boot is done) | `SYS_ADMIN SYS_BOOT SYS_RESOURCE NET_ADMIN NET_RAW NET_BIND_SERVICE SETPCAP` | mounts and the printk sysctl; ctrl-alt-del; rlimits; links, addresses, routes; the DHCP threads it spawns need theirs; narrowing again |
//! | [`Role::Console`] (PID 1's main thread afterwards, the signal thread) | `SYS_BOOT` | reboot(2) for `reboot`/`poweroff`, SIGTERM, ctrl-alt-del |
//! | [`Role::DhcpOpen`] (a DHCP thread until its socket is bound) | `NET_ADMIN NET_RAW NET_BIND_SERVICE SETPCAP` | binding UDP port 68; narrowing again |
//! | [`Role::Dhcp`] (a DHCP thread afterwards) | `NET_ADMIN NET_RAW` | addresses and routes from each lease |
//! | [`Role::Serving`] (the thread that starts the server, so every server thread) | none | |
//!
//! A role that narrows again later keeps CAP_SETPCAP: without it the bounding set cannot shrink.
//! Nothing in PID 1 ever executes a program, so every role also sets no_new_privs.

use caps::{CapSet, Capability, CapsHashSet};

/// The capability sets one thread of PID 1 keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Boot,
    Console,
    DhcpOpen,
    Dhcp,
    Serving,
}

impl Role {
    /// The capabilities of this role: bounding, permitted and effective sets alike.
    pub fn capabilities(self) -> &'static [Capability] {
        use Capability::*;
        match self {
            Role::Boot => &[
                CAP_SYS_ADMIN,
                CAP_SYS_BOOT,
                CAP_SYS_RESOURCE,
                CAP_NET_ADMIN,
                CAP_NET_RAW,
                CAP_NET_BIND_SERVICE,
                CAP_SETPCAP,
            ],
            Role::Console => &[CAP_SYS_BOOT],
            Role::DhcpOpen => &[
                CAP_NET_ADMIN,
                CAP_NET_RAW,
                CAP_NET_BIND_SERVICE,
                CAP_SETPCAP,
            ],
            Role::Dhcp => &[CAP_NET_ADMIN, CAP_NET_RAW],
            Role::Serving => &[],
        }
    }

    /// The role's capabilities as the kernel's bit mask (`CapEff:` in /proc/PID/status).
    pub fn mask(self) -> u64 {
        self.capabilities()
            .iter()
            .fold(0, |mask, cap| mask | cap.bitmask())
    }

    fn name(self) -> &'static str {
        match self {
            Role::Boot => "boot",
            Role::Console => "console",
            Role::DhcpOpen => "dhcp-open",
            Role::Dhcp => "dhcp",
            Role::Serving => "serving",
        }
    }
}

/// Why a thread could not narrow its privileges.
#[derive(Debug, thiserror::Error)]
pub enum PrivError {
    #[error("no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("drop capability {cap} from the bounding set: {source}")]
    Bounding { cap: u32, source: std::io::Error },
    #[error("set the {set:?} capabilities: {message}")]
    Set { set: CapSet, message: String },
}

/// Highest capability number the bounding set is probed for; the kernel answers EINVAL past its
/// last one (40 in 6.12), so capabilities newer than the `caps` crate are dropped too.
const CAP_MAX: u32 = 63;

/// Sets no_new_privs and narrows the calling thread's bounding, permitted and effective sets to
/// `role`'s capabilities; inheritable and ambient end empty. Threads spawned afterwards inherit
/// the narrowed sets. Sets can only shrink: a role wider than what the thread holds keeps only
/// what it holds.
pub fn restrict_thread(role: Role) -> Result<(), PrivError> {
    ringstore_sys::set_no_new_privs().map_err(PrivError::NoNewPrivs)?;
    let keep = role.mask();
    // The bounding set can only shrink while CAP_SETPCAP is still effective, so it goes first.
    for cap in 0..=CAP_MAX {
        if keep & (1 << cap) != 0 {
            continue;
        }
        match ringstore_sys::bounding_set_has(cap) {
            Ok(true) => {}
            Ok(false) => continue,
            // EINVAL: past the kernel's last capability.
            Err(_) => break,
        }
        ringstore_sys::bounding_set_drop(cap)
            .map_err(|source| PrivError::Bounding { cap, source })?;
    }
    let set_error = |set: CapSet| {
        move |e: caps::errors::CapsError| PrivError::Set {
            set,
            message: e.to_string(),
        }
    };
    caps::clear(None, CapSet::Ambient).map_err(set_error(CapSet::Ambient))?;
    caps::clear(None, CapSet::Inheritable).map_err(set_error(CapSet::Inheritable))?;
    // Effective before permitted: effective must stay a subset of permitted at every step.
    for set in [CapSet::Effective, CapSet::Permitted] {
        let held = caps::read(None, set).map_err(set_error(set))?;
        let kept: CapsHashSet = role
            .capabilities()
            .iter()
            .copied()
            .filter(|cap| held.contains(cap))
            .collect();
        caps::set(None, set, &kept).map_err(set_error(set))?;
    }
    Ok(())
}

/// [`restrict_thread`], logging a failure (a thread that keeps more than its role still works;
/// the console's `threads` shows what it holds).
pub fn restrict_thread_or_log(role: Role) {
    if let Err(err) = restrict_thread(role) {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        crate::error!(
            "thread {thread}: cannot narrow privileges to the {} role: {err}",
            role.name()
        );
    }
}

/// Sets no_new_privs and empties the calling thread's capability sets (the serving side).
pub fn drop_thread_privileges() -> Result<(), PrivError> {
    restrict_thread(Role::Serving)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's sets from /proc/thread-self/status.
    fn own_sets() -> (u64, u64, u64) {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let field = |key: &str| {
            let hex = status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap()
                .trim();
            u64::from_str_radix(hex, 16).unwrap()
        };
        (field("CapEff:"), field("CapPrm:"), field("CapBnd:"))
    }

    #[test]
    fn role_masks_are_the_kernel_bits() {
        // CAP_SYS_BOOT is 22, CAP_NET_ADMIN 12, CAP_NET_RAW 13 (linux/capability.h).
        assert_eq!(Role::Console.mask(), 0x40_0000);
        assert_eq!(Role::Dhcp.mask(), 0x3000);
        assert_eq!(Role::DhcpOpen.mask(), 0x3500);
        // Roles that are narrowed again later keep CAP_SETPCAP (8) for the bounding set.
        for (first, then) in [(Role::Boot, Role::Console), (Role::DhcpOpen, Role::Dhcp)] {
            assert_ne!(first.mask() & (1 << 8), 0, "{first:?} before {then:?}");
        }
        assert_eq!(Role::Serving.mask(), 0);
        for narrower in [Role::Console, Role::DhcpOpen, Role::Dhcp] {
            assert_eq!(
                narrower.mask() & !Role::Boot.mask(),
                0,
                "{narrower:?} needs nothing the boot role does not have"
            );
        }
        assert_eq!(Role::Dhcp.mask() & !Role::DhcpOpen.mask(), 0);
    }

    #[test]
    fn a_thread_ends_with_no_capabilities() {
        let (dropped, (eff, prm, bnd)) = std::thread::spawn(|| {
            let dropped = drop_thread_privileges();
            (dropped.is_ok(), own_sets())
        })
        .join()
        .unwrap();
        // An unprivileged test runner may not drop from the bounding set (no CAP_SETPCAP).
        if dropped {
            assert_eq!((eff, prm, bnd), (0, 0, 0));
        }
        // Checked on this (untouched) thread.
        let no_new_privs = ringstore_sys::no_new_privs().unwrap();
        assert!(!no_new_privs, "the test thread itself is untouched");
    }

    #[test]
    fn each_thread_narrows_in_steps_as_pid1_does() {
        // PID 1: boot set, then a DHCP thread spawned from it narrows twice, and PID 1 itself
        // narrows to the console set.
        let before = own_sets();
        let steps = std::thread::spawn(|| {
            let boot = restrict_thread(Role::Boot).map_err(|e| e.to_string());
            let dhcp = std::thread::spawn(|| {
                let open = restrict_thread(Role::DhcpOpen).map_err(|e| e.to_string());
                let bound = restrict_thread(Role::Dhcp).map_err(|e| e.to_string());
                (open, bound, own_sets())
            })
            .join()
            .unwrap();
            let console = restrict_thread(Role::Console).map_err(|e| e.to_string());
            (boot, dhcp, console, own_sets())
        })
        .join()
        .unwrap();
        let (boot, (open, bound, dhcp_sets), console, console_sets) = steps;
        if before.2 & (1 << 8) == 0 {
            // No CAP_SETPCAP to start with: nothing can narrow the bounding set.
            assert!(boot.is_err());
            return;
        }
        for step in [&boot, &open, &bound, &console] {
            assert_eq!(step, &Ok(()));
        }
        let dhcp = before.2 & Role::Dhcp.mask();
        assert_eq!(dhcp_sets, (before.0 & dhcp, before.1 & dhcp, dhcp));
        let console = before.2 & Role::Console.mask();
        assert_eq!(
            console_sets,
            (before.0 & console, before.1 & console, console)
        );
    }

    #[test]
    fn a_thread_keeps_only_its_role_and_passes_it_on() {
        let before = own_sets();
        let (result, after, child) = std::thread::spawn(|| {
            let result = restrict_thread(Role::Dhcp).map_err(|e| e.to_string());
            let after = own_sets();
            let child = std::thread::spawn(own_sets).join().unwrap();
            (result, after, child)
        })
        .join()
        .unwrap();
        match result {
            Ok(()) => {
                let (eff, prm, bnd) = after;
                assert_eq!(eff & !Role::Dhcp.mask(), 0, "effective {eff:x}");
                assert_eq!(prm & !Role::Dhcp.mask(), 0, "permitted {prm:x}");
                assert_eq!(bnd, before.2 & Role::Dhcp.mask(), "bounding {bnd:x}");
                assert_eq!(
                    child, after,
                    "a thread spawned later inherits the narrowed sets"
                );
            }
            // Without CAP_SETPCAP the bounding set cannot shrink; that must be reported.
            Err(err) => assert!(
                before.2 & !Role::Dhcp.mask() != 0 && err.contains("bounding"),
                "{err}"
            ),
        }
        assert_eq!(own_sets(), before, "the test thread itself is untouched");
    }
}
