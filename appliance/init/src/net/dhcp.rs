//! DHCPv4 client: DISCOVER/OFFER/REQUEST/ACK over a UDP socket bound to one interface
//! (SO_BINDTODEVICE + SO_BROADCAST, broadcast flag set so replies reach an address-less
//! interface), and RENEW at T1. Packets are built and parsed with `dhcproto`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use dhcproto::v4::{self, DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};

/// Largest DHCP datagram we read; anything longer is truncated and fails to parse.
const PACKET_MAX: usize = 1500;
/// Lease used when the server gives none (RFC 2131 does not allow that, but be safe).
const DEFAULT_LEASE_SECS: u32 = 3600;

/// What the server handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    pub router: Option<Ipv4Addr>,
    pub server: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub lease_secs: u32,
    /// Renewal time (T1), seconds after the ACK.
    pub renew_secs: u32,
}

/// A parsed reply that belongs to us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Offer(Lease),
    Ack(Lease),
    Nak,
}

/// Why no lease was obtained.
#[derive(Debug, thiserror::Error)]
pub enum DhcpError {
    #[error("DHCP socket on {interface}: {source}")]
    Socket {
        interface: String,
        source: io::Error,
    },
    #[error("no DHCP {what} on {interface} within {secs} s")]
    Timeout {
        interface: String,
        what: &'static str,
        secs: u64,
    },
    #[error("DHCP server refused the request on {interface} (NAK)")]
    Refused { interface: String },
    #[error("cannot encode a DHCP packet: {0}")]
    Encode(String),
}

fn new_message(xid: u32, mac: &[u8; 6], ciaddr: Ipv4Addr, kind: MessageType) -> Message {
    let unspecified = Ipv4Addr::UNSPECIFIED;
    let mut msg = Message::new_with_id(xid, ciaddr, unspecified, unspecified, unspecified, mac);
    msg.set_flags(v4::Flags::default().set_broadcast());
    let opts = msg.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    let mut client_id = vec![1u8];
    client_id.extend_from_slice(mac);
    opts.insert(DhcpOption::ClientIdentifier(client_id));
    opts.insert(DhcpOption::ParameterRequestList(vec![
        OptionCode::SubnetMask,
        OptionCode::Router,
        OptionCode::DomainNameServer,
        OptionCode::AddressLeaseTime,
        OptionCode::Renewal,
    ]));
    msg
}

fn encode(msg: &Message) -> Result<Vec<u8>, DhcpError> {
    let mut buf = Vec::with_capacity(512);
    msg.encode(&mut Encoder::new(&mut buf))
        .map_err(|e| DhcpError::Encode(e.to_string()))?;
    Ok(buf)
}

/// DHCPDISCOVER.
pub fn discover(xid: u32, mac: &[u8; 6]) -> Result<Vec<u8>, DhcpError> {
    encode(&new_message(
        xid,
        mac,
        Ipv4Addr::UNSPECIFIED,
        MessageType::Discover,
    ))
}

/// DHCPREQUEST: selecting an offer (`server` given, `ciaddr` unspecified) or renewing (`ciaddr` = our address).
pub fn request(
    xid: u32,
    mac: &[u8; 6],
    address: Ipv4Addr,
    server: Option<Ipv4Addr>,
    renewing: bool,
) -> Result<Vec<u8>, DhcpError> {
    let ciaddr = if renewing {
        address
    } else {
        Ipv4Addr::UNSPECIFIED
    };
    let mut msg = new_message(xid, mac, ciaddr, MessageType::Request);
    if !renewing {
        msg.opts_mut()
            .insert(DhcpOption::RequestedIpAddress(address));
        if let Some(server) = server {
            msg.opts_mut().insert(DhcpOption::ServerIdentifier(server));
        }
    }
    encode(&msg)
}

/// Parses a datagram; `None` unless it is a BOOTREPLY for our `xid` and `mac` of a kind we use.
pub fn parse_reply(bytes: &[u8], xid: u32, mac: &[u8; 6]) -> Option<Reply> {
    let msg = Message::decode(&mut Decoder::new(bytes)).ok()?;
    if msg.opcode() != v4::Opcode::BootReply || msg.xid() != xid || msg.chaddr().get(..6)? != mac {
        return None;
    }
    let opts = msg.opts();
    let kind = opts.msg_type()?;
    if kind == MessageType::Nak {
        return Some(Reply::Nak);
    }
    let prefix_len = match opts.get(OptionCode::SubnetMask) {
        Some(DhcpOption::SubnetMask(mask)) => crate::cmdline::netmask_prefix(*mask).unwrap_or(24),
        _ => 24,
    };
    let router = match opts.get(OptionCode::Router) {
        Some(DhcpOption::Router(routers)) => routers.first().copied(),
        _ => None,
    };
    let dns = match opts.get(OptionCode::DomainNameServer) {
        Some(DhcpOption::DomainNameServer(servers)) => servers.iter().take(4).copied().collect(),
        _ => Vec::new(),
    };
    let server = match opts.get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(ip)) => Some(*ip),
        _ => None,
    };
    let lease_secs = match opts.get(OptionCode::AddressLeaseTime) {
        Some(DhcpOption::AddressLeaseTime(secs)) => (*secs).max(60),
        _ => DEFAULT_LEASE_SECS,
    };
    let renew_secs = match opts.get(OptionCode::Renewal) {
        Some(DhcpOption::Renewal(secs)) if *secs < lease_secs => *secs,
        _ => lease_secs / 2,
    };
    let lease = Lease {
        address: msg.yiaddr(),
        prefix_len,
        router,
        server,
        dns,
        lease_secs,
        renew_secs,
    };
    match kind {
        MessageType::Offer => Some(Reply::Offer(lease)),
        MessageType::Ack => Some(Reply::Ack(lease)),
        _ => None,
    }
}

/// A UDP socket on port 68 bound to one interface.
pub struct Client {
    interface: String,
    mac: [u8; 6],
    socket: UdpSocket,
    xid_seed: u32,
}

impl Client {
    pub fn open(interface: &str, mac: [u8; 6]) -> Result<Client, DhcpError> {
        let socket = ringstore_sys::bind_udp_to_device(interface, 68).map_err(|source| {
            DhcpError::Socket {
                interface: interface.to_string(),
                source,
            }
        })?;
        // The xid only has to differ between our own transactions and other clients' ones.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let xid_seed = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]) ^ nanos;
        Ok(Client {
            interface: interface.to_string(),
            mac,
            socket,
            xid_seed,
        })
    }

    fn next_xid(&mut self) -> u32 {
        self.xid_seed = self
            .xid_seed
            .wrapping_mul(1_664_525)
            .wrapping_add(1_013_904_223);
        self.xid_seed
    }

    fn err_socket(&self, source: io::Error) -> DhcpError {
        DhcpError::Socket {
            interface: self.interface.clone(),
            source,
        }
    }

    /// Sends `packet` and waits for a reply accepted by `want`, retrying with growing waits until `total`.
    fn exchange<T>(
        &mut self,
        xid: u32,
        packet: &[u8],
        to: Ipv4Addr,
        total: Duration,
        what: &'static str,
        want: impl Fn(Reply) -> Option<T>,
    ) -> Result<T, DhcpError> {
        let deadline = Instant::now() + total;
        let mut wait = Duration::from_millis(500);
        let mut buf = [0u8; PACKET_MAX];
        while Instant::now() < deadline {
            self.socket
                .send_to(packet, SocketAddrV4::new(to, 67))
                .map_err(|e| self.err_socket(e))?;
            let round_end = (Instant::now() + wait).min(deadline);
            loop {
                let left = round_end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                self.socket
                    .set_read_timeout(Some(left))
                    .map_err(|e| self.err_socket(e))?;
                match self.socket.recv_from(&mut buf) {
                    Ok((n, SocketAddr::V4(_))) => {
                        if let Some(reply) = parse_reply(&buf[..n], xid, &self.mac) {
                            if reply == Reply::Nak {
                                return Err(DhcpError::Refused {
                                    interface: self.interface.clone(),
                                });
                            }
                            if let Some(found) = want(reply) {
                                return Ok(found);
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                | io::ErrorKind::Interrupted
                        ) => {}
                    Err(e) => return Err(self.err_socket(e)),
                }
            }
            wait = (wait * 2).min(Duration::from_secs(4));
        }
        Err(DhcpError::Timeout {
            interface: self.interface.clone(),
            what,
            secs: total.as_secs(),
        })
    }

    /// DISCOVER → OFFER → REQUEST → ACK.
    pub fn acquire(&mut self, total: Duration) -> Result<Lease, DhcpError> {
        let xid = self.next_xid();
        let packet = discover(xid, &self.mac)?;
        let offer = self.exchange(
            xid,
            &packet,
            Ipv4Addr::BROADCAST,
            total,
            "offer",
            |r| match r {
                Reply::Offer(lease) => Some(lease),
                _ => None,
            },
        )?;
        let packet = request(xid, &self.mac, offer.address, offer.server, false)?;
        self.exchange(
            xid,
            &packet,
            Ipv4Addr::BROADCAST,
            total,
            "ack",
            |r| match r {
                Reply::Ack(lease) => Some(lease),
                _ => None,
            },
        )
    }

    /// RENEW of `current` (unicast to its server when known).
    pub fn renew(&mut self, current: &Lease, total: Duration) -> Result<Lease, DhcpError> {
        let xid = self.next_xid();
        let packet = request(xid, &self.mac, current.address, current.server, true)?;
        let to = current.server.unwrap_or(Ipv4Addr::BROADCAST);
        self.exchange(xid, &packet, to, total, "renewal ack", |r| match r {
            Reply::Ack(lease) => Some(lease),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    fn server_reply(xid: u32, kind: MessageType, mac: &[u8; 6]) -> Vec<u8> {
        let mut msg = Message::new_with_id(
            xid,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::new(10, 0, 2, 15),
            Ipv4Addr::new(10, 0, 2, 2),
            Ipv4Addr::UNSPECIFIED,
            mac,
        );
        msg.set_opcode(v4::Opcode::BootReply);
        let opts = msg.opts_mut();
        opts.insert(DhcpOption::MessageType(kind));
        opts.insert(DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)));
        opts.insert(DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 2, 2)]));
        opts.insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 2, 2)));
        opts.insert(DhcpOption::AddressLeaseTime(86400));
        encode(&msg).unwrap()
    }

    #[test]
    fn discover_is_a_broadcast_request_with_our_mac() {
        let bytes = discover(7, &MAC).unwrap();
        let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(msg.opcode(), v4::Opcode::BootRequest);
        assert_eq!(msg.xid(), 7);
        assert_eq!(&msg.chaddr()[..6], &MAC);
        assert!(msg.flags().broadcast());
        assert_eq!(msg.opts().msg_type(), Some(MessageType::Discover));
    }

    #[test]
    fn request_selecting_names_address_and_server() {
        let bytes = request(
            9,
            &MAC,
            Ipv4Addr::new(10, 0, 2, 15),
            Some(Ipv4Addr::new(10, 0, 2, 2)),
            false,
        )
        .unwrap();
        let msg = Message::decode(&mut Decoder::new(&bytes)).unwrap();
        assert_eq!(
            msg.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 0, 2, 15)))
        );
        assert_eq!(msg.ciaddr(), Ipv4Addr::UNSPECIFIED);
        let renewing = request(9, &MAC, Ipv4Addr::new(10, 0, 2, 15), None, true).unwrap();
        let msg = Message::decode(&mut Decoder::new(&renewing)).unwrap();
        assert_eq!(msg.ciaddr(), Ipv4Addr::new(10, 0, 2, 15));
        assert!(msg.opts().get(OptionCode::RequestedIpAddress).is_none());
    }

    #[test]
    fn replies_are_parsed_and_filtered() {
        let offer = parse_reply(&server_reply(5, MessageType::Offer, &MAC), 5, &MAC).unwrap();
        let Reply::Offer(lease) = offer else {
            panic!("not an offer: {offer:?}")
        };
        assert_eq!(lease.address, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(lease.prefix_len, 24);
        assert_eq!(lease.router, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!((lease.lease_secs, lease.renew_secs), (86400, 43200));
        assert!(matches!(
            parse_reply(&server_reply(5, MessageType::Ack, &MAC), 5, &MAC),
            Some(Reply::Ack(_))
        ));
        assert_eq!(
            parse_reply(&server_reply(5, MessageType::Nak, &MAC), 5, &MAC),
            Some(Reply::Nak)
        );
        assert_eq!(
            parse_reply(&server_reply(6, MessageType::Ack, &MAC), 5, &MAC),
            None,
            "other xid"
        );
        assert_eq!(
            parse_reply(
                &server_reply(5, MessageType::Ack, &[1, 2, 3, 4, 5, 6]),
                5,
                &MAC
            ),
            None,
            "other mac"
        );
        assert_eq!(
            parse_reply(&discover(5, &MAC).unwrap(), 5, &MAC),
            None,
            "a request is not a reply"
        );
        assert_eq!(parse_reply(b"garbage", 5, &MAC), None);
    }
}
