//! Network bring-up: loopback and every NIC up, then DHCP (default) or the static `ip=` address,
//! and the default route. One lease-keeper thread per DHCP interface renews at T1.

pub mod dhcp;
pub mod link;

use std::net::Ipv4Addr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cmdline::IpSetting;
use crate::{error, info, warn};

/// How long boot waits for the first DHCP lease of every interface.
const DHCP_BOOT_WAIT: Duration = Duration::from_secs(20);
/// How long a link may take to report carrier after IFF_UP.
const CARRIER_WAIT: Duration = Duration::from_secs(5);
/// Pause between rediscovery attempts after a lease is lost.
const REDISCOVER_PAUSE: Duration = Duration::from_secs(10);

/// An interface that got an IPv4 address at boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    pub interface: String,
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
}

/// Brings the network up as `setting` says and returns what got an address.
pub fn bring_up(setting: &IpSetting) -> Vec<Configured> {
    if let Err(err) = link::set_up("lo") {
        warn!("loopback: {err}");
    }
    let nics = link::ethernet_nics();
    if nics.is_empty() {
        warn!("no Ethernet interfaces found");
    }
    for nic in &nics {
        if let Err(err) = link::set_up(nic) {
            warn!("{err}");
        }
    }
    wait_for_carrier(&nics);
    match setting {
        IpSetting::Off => {
            info!("ip=off: links up, no IPv4 addresses");
            Vec::new()
        }
        IpSetting::Static {
            client,
            gateway,
            prefix_len,
            device,
            ..
        } => {
            let Some(interface) = device.clone().or_else(|| nics.first().cloned()) else {
                error!("ip= names no device and there is no NIC");
                return Vec::new();
            };
            // ip='s HOSTNAME field was set (or passed over for the hostname key) by hostname.rs.
            let configured = Configured {
                interface,
                address: *client,
                prefix_len: *prefix_len,
                gateway: *gateway,
            };
            match apply(&configured) {
                Ok(()) => vec![configured],
                Err(err) => {
                    error!("{err}");
                    Vec::new()
                }
            }
        }
        IpSetting::Dhcp { device } => {
            let targets: Vec<String> = match device {
                Some(device) => vec![device.clone()],
                None => nics,
            };
            dhcp_all(&targets)
        }
    }
}

fn wait_for_carrier(nics: &[String]) {
    let deadline = Instant::now() + CARRIER_WAIT;
    while Instant::now() < deadline {
        let all = nics.iter().all(|nic| {
            ringstore_sys::read_trim(format!("/sys/class/net/{nic}/carrier")).as_deref()
                == Some("1")
        });
        if all {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    warn!(
        "not every NIC reports carrier after {} s",
        CARRIER_WAIT.as_secs()
    );
}

fn apply(configured: &Configured) -> std::io::Result<()> {
    link::set_ipv4(
        &configured.interface,
        configured.address,
        configured.prefix_len,
    )?;
    if let Some(gateway) = configured.gateway {
        link::add_default_route(&configured.interface, gateway)?;
    }
    info!(
        "{}: {}/{}{}",
        configured.interface,
        configured.address,
        configured.prefix_len,
        configured
            .gateway
            .map(|g| format!(" via {g}"))
            .unwrap_or_default()
    );
    Ok(())
}

fn dhcp_all(interfaces: &[String]) -> Vec<Configured> {
    let (tx, rx) = mpsc::channel();
    let mut started = 0;
    for interface in interfaces {
        let Some(mac) = link::mac_address(interface) else {
            warn!("{interface}: no MAC address, skipping DHCP");
            continue;
        };
        let tx = tx.clone();
        let interface = interface.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("dhcp-{interface}"))
            .spawn(move || lease_keeper(interface, mac, tx));
        match spawned {
            Ok(_) => started += 1,
            Err(err) => error!("cannot start the DHCP thread: {err}"),
        }
    }
    drop(tx);
    let deadline = Instant::now() + DHCP_BOOT_WAIT;
    let mut configured = Vec::new();
    for _ in 0..started {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Some(c)) => configured.push(c),
            Ok(None) => {}
            Err(_) => break,
        }
    }
    configured.sort_by(|a, b| a.interface.cmp(&b.interface));
    configured
}

/// Acquires a lease, reports it on `first`, then keeps it renewed for the life of the machine.
/// The thread holds CAP_NET_ADMIN and CAP_NET_RAW (addresses and routes from the lease), and
/// CAP_NET_BIND_SERVICE only until its socket is bound to port 68.
fn lease_keeper(interface: String, mac: [u8; 6], first: mpsc::Sender<Option<Configured>>) {
    crate::privs::restrict_thread_or_log(crate::privs::Role::DhcpOpen);
    let opened = dhcp::Client::open(&interface, mac);
    crate::privs::restrict_thread_or_log(crate::privs::Role::Dhcp);
    let mut client = match opened {
        Ok(client) => client,
        Err(err) => {
            error!("{err}");
            let _ = first.send(None);
            return;
        }
    };
    let mut first = Some(first);
    loop {
        let lease = match client.acquire(DHCP_BOOT_WAIT) {
            Ok(lease) => lease,
            Err(err) => {
                warn!("{err}");
                if let Some(first) = first.take() {
                    let _ = first.send(None);
                }
                std::thread::sleep(REDISCOVER_PAUSE);
                continue;
            }
        };
        let configured = configured_from(&interface, &lease);
        if let Err(err) = apply(&configured) {
            error!("{err}");
        }
        if let Some(first) = first.take() {
            let _ = first.send(Some(configured));
        }
        keep(&mut client, &interface, lease);
    }
}

fn configured_from(interface: &str, lease: &dhcp::Lease) -> Configured {
    Configured {
        interface: interface.to_string(),
        address: lease.address,
        prefix_len: lease.prefix_len,
        gateway: lease.router,
    }
}

/// Renews `lease` at T1 until a renewal fails past the lease's end; returns to rediscover.
fn keep(client: &mut dhcp::Client, interface: &str, mut lease: dhcp::Lease) {
    let mut granted = Instant::now();
    loop {
        let renew_at = granted + Duration::from_secs(u64::from(lease.renew_secs));
        let expires = granted + Duration::from_secs(u64::from(lease.lease_secs));
        std::thread::sleep(renew_at.saturating_duration_since(Instant::now()));
        loop {
            let left = expires.saturating_duration_since(Instant::now());
            if left.is_zero() {
                warn!("{interface}: lease on {} expired", lease.address);
                return;
            }
            match client.renew(&lease, left.min(Duration::from_secs(30))) {
                Ok(renewed) => {
                    if renewed.address != lease.address || renewed.prefix_len != lease.prefix_len {
                        if let Err(err) = apply(&configured_from(interface, &renewed)) {
                            error!("{err}");
                        }
                    }
                    info!(
                        "{interface}: lease on {} renewed for {} s",
                        renewed.address, renewed.lease_secs
                    );
                    lease = renewed;
                    granted = Instant::now();
                    break;
                }
                Err(err) => {
                    warn!("{interface}: renewal: {err}");
                    std::thread::sleep(left.min(Duration::from_secs(30)) / 2);
                }
            }
        }
    }
}
