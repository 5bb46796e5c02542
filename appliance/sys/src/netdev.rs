//! Interface configuration through the classic socket ioctls (SIOCGIFFLAGS/SIOCSIFFLAGS,
//! SIOCSIFADDR, SIOCSIFNETMASK, SIOCADDRT): a link up, one IPv4 address, the default route.
//! ADR-0006 says why this is not netlink. Raw: rustix wraps none of these ioctls (its
//! `ioctl` module is itself `unsafe` and would add nothing over libc here).

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// The longest interface name the kernel takes (IFNAMSIZ less the NUL).
const IFNAME_LEN_MAX: usize = libc::IFNAMSIZ - 1;

fn control_socket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() > IFNAME_LEN_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

/// ioctl on the control socket with an `ifreq`.
fn ioctl_ifreq(
    fd: &OwnedFd,
    request: libc::Ioctl,
    req: &mut libc::ifreq,
    what: &str,
) -> io::Result<()> {
    // SAFETY: `req` is a live, initialised ifreq, the type every SIOC*IF* request here expects.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, req as *mut libc::ifreq) };
    ioctl_result(rc, what)
}

fn ioctl_result(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc < 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
    }
    Ok(())
}

/// `AF_INET` (2) in a `sockaddr`'s family field.
#[expect(clippy::cast_possible_truncation, reason = "AF_INET is 2")]
const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;
/// `IFF_UP` (1) in an `ifreq`'s flags field.
#[expect(clippy::cast_possible_truncation, reason = "IFF_UP is 1")]
const IFF_UP: libc::c_short = libc::IFF_UP as libc::c_short;

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: AF_INET,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(addr).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and sockaddr has no invalid bit patterns.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Sets IFF_UP on `name`.
pub fn set_up(name: &str) -> io::Result<()> {
    let fd = control_socket()?;
    let mut req = ifreq_for(name)?;
    ioctl_ifreq(
        &fd,
        libc::SIOCGIFFLAGS as libc::Ioctl,
        &mut req,
        &format!("get flags of {name}"),
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | IFF_UP;
    ioctl_ifreq(
        &fd,
        libc::SIOCSIFFLAGS as libc::Ioctl,
        &mut req,
        &format!("set {name} up"),
    )
}

/// Gives `name` the IPv4 address `addr` with `netmask` (replacing its primary address).
pub fn set_ipv4(name: &str, addr: Ipv4Addr, netmask: Ipv4Addr) -> io::Result<()> {
    let fd = control_socket()?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl_ifreq(
        &fd,
        libc::SIOCSIFADDR as libc::Ioctl,
        &mut req,
        &format!("set address {addr} on {name}"),
    )?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_in(netmask);
    ioctl_ifreq(
        &fd,
        libc::SIOCSIFNETMASK as libc::Ioctl,
        &mut req,
        &format!("set netmask {netmask} on {name}"),
    )
}

/// Adds `default via gateway dev name`; an existing default route is left alone.
pub fn add_default_route(name: &str, gateway: Ipv4Addr) -> io::Result<()> {
    let fd = control_socket()?;
    let mut dev = std::ffi::CString::new(name)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?
        .into_bytes_with_nul();
    // SAFETY: rtentry is plain old data; all-zero is a valid value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    route.rt_dst = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_genmask = sockaddr_in(Ipv4Addr::UNSPECIFIED);
    route.rt_gateway = sockaddr_in(gateway);
    route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    route.rt_dev = dev.as_mut_ptr().cast();
    // SAFETY: `route` is a live rtentry whose rt_dev points into `dev`, which outlives the call.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::SIOCADDRT as libc::Ioctl,
            &mut route as *mut libc::rtentry,
        )
    };
    match ioctl_result(rc, &format!("add default route via {gateway} dev {name}")) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_checked() {
        assert!(ifreq_for("").is_err());
        assert!(ifreq_for("a-very-long-interface-name").is_err());
        assert!(ifreq_for("eth0").is_ok());
        assert!(ifreq_for(&"x".repeat(IFNAME_LEN_MAX)).is_ok());
        assert!(ifreq_for(&"x".repeat(IFNAME_LEN_MAX + 1)).is_err());
        assert!(set_up("no-such-if0").is_err());
    }
}
