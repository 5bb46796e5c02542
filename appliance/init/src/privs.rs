//! Dropping privileges on the serving side: the thread that starts the data plane sets
//! no_new_privs and clears every capability set (bounding included) first, so each worker it
//! spawns inherits none. PID 1's own threads keep theirs (reboot, sysfs writes).

use caps::CapSet;

/// Sets no_new_privs and empties the calling thread's capability sets.
pub fn drop_thread_privileges() -> Result<(), String> {
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) takes no pointers.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    // The bounding set can only shrink while CAP_SETPCAP is still effective, so it goes first.
    for cap in caps::all() {
        if caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(|e| format!("drop {cap} from the bounding set: {e}"))?;
        }
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|e| format!("clear {set:?} capabilities: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_ends_with_no_capabilities() {
        let result = std::thread::spawn(|| {
            let dropped = drop_thread_privileges();
            (
                dropped,
                caps::read(None, CapSet::Effective).map(|s| s.len()),
                caps::read(None, CapSet::Permitted).map(|s| s.len()),
            )
        })
        .join()
        .unwrap();
        let (dropped, effective, permitted) = result;
        // Unprivileged test runners have nothing to drop from the bounding set's view but may not clear it.
        if dropped.is_ok() {
            assert_eq!(effective.unwrap(), 0);
            assert_eq!(permitted.unwrap(), 0);
        }
        // SAFETY: prctl(PR_GET_NO_NEW_PRIVS) takes no pointers; checked on this (untouched) thread.
        let no_new_privs = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
        assert_eq!(no_new_privs, 0, "the test thread itself is untouched");
    }
}
