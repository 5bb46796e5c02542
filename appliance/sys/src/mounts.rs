//! mount(2) for PID 1's filesystems, through rustix.

use std::io;

pub use rustix::mount::MountFlags;

/// Mounts `fstype` (named `source`) on `target` with `flags` and the option string `data`.
pub fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> io::Result<()> {
    let data =
        std::ffi::CString::new(data).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    Ok(rustix::mount::mount(
        source,
        target,
        fstype,
        flags,
        data.as_c_str(),
    )?)
}
