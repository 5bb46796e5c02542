//! Interface configuration through the classic socket ioctls (SIOCSIFFLAGS, SIOCSIFADDR,
//! SIOCSIFNETMASK, SIOCADDRT): links up, one IPv4 address per interface, the default route.
//! ADR-0006 says why this is not netlink.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Names in /sys/class/net, sorted.
pub fn interfaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Ethernet interfaces (ARPHRD_ETHER) with a device behind them: the NICs.
pub fn ethernet_nics() -> Vec<String> {
    interfaces()
        .into_iter()
        .filter(|name| {
            let base = format!("/sys/class/net/{name}");
            crate::sysinfo::read_trim(&format!("{base}/type")).as_deref() == Some("1")
                && std::path::Path::new(&format!("{base}/device")).exists()
        })
        .collect()
}

/// The interface's MAC address from sysfs.
pub fn mac_address(name: &str) -> Option<[u8; 6]> {
    parse_mac(&crate::sysinfo::read_trim(&format!(
        "/sys/class/net/{name}/address"
    ))?)
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

fn control_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
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

fn ioctl(fd: &OwnedFd, request: libc::Ioctl, arg: *mut libc::c_void, what: &str) -> io::Result<()> {
    // SAFETY: `arg` points to a live, initialised struct of the type `request` expects (callers pass ifreq or rtentry).
    if unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) } < 0 {
        let err = io::Error::last_os_error();
        return Err(io::Error::new(err.kind(), format!("{what}: {err}")));
    }
    Ok(())
}

fn sockaddr_in(addr: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
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
    ioctl(
        &fd,
        libc::SIOCGIFFLAGS as libc::Ioctl,
        (&mut req as *mut libc::ifreq).cast(),
        &format!("get flags of {name}"),
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    ioctl(
        &fd,
        libc::SIOCSIFFLAGS as libc::Ioctl,
        (&mut req as *mut libc::ifreq).cast(),
        &format!("set {name} up"),
    )
}

/// Gives `name` the IPv4 address `addr/prefix_len` (replacing its primary address).
pub fn set_ipv4(name: &str, addr: Ipv4Addr, prefix_len: u8) -> io::Result<()> {
    let fd = control_socket()?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl(
        &fd,
        libc::SIOCSIFADDR as libc::Ioctl,
        (&mut req as *mut libc::ifreq).cast(),
        &format!("set address {addr} on {name}"),
    )?;
    let mut req = ifreq_for(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_in(crate::cmdline::prefix_netmask(prefix_len));
    ioctl(
        &fd,
        libc::SIOCSIFNETMASK as libc::Ioctl,
        (&mut req as *mut libc::ifreq).cast(),
        &format!("set netmask /{prefix_len} on {name}"),
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
    match ioctl(
        &fd,
        libc::SIOCADDRT as libc::Ioctl,
        (&mut route as *mut libc::rtentry).cast(),
        &format!("add default route via {gateway} dev {name}"),
    ) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        assert_eq!(
            parse_mac("52:54:00:12:34:56\n"),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x56])
        );
        assert_eq!(parse_mac("52:54:00:12:34"), None);
        assert_eq!(parse_mac("52:54:00:12:34:56:78"), None);
        assert_eq!(parse_mac("zz:54:00:12:34:56"), None);
    }

    #[test]
    fn interface_names_are_checked() {
        assert!(ifreq_for("").is_err());
        assert!(ifreq_for("a-very-long-interface-name").is_err());
        assert!(ifreq_for("eth0").is_ok());
    }
}
