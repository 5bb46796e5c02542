//! Ethernet II, IPv4 and UDP headers, as a frame-level datapath sees them: [`parse`] finds a
//! UDP datagram in a received frame (checking every length and both checksums), and
//! [`write_reply_headers`] writes the headers of the reply in front of a payload already in
//! place in the frame buffer (addresses swapped, lengths and checksums new).
//!
//! Frames this does not serve (VLAN tags, IPv6, fragments, IP options on a reply) are left
//! to the kernel by the caller; nothing on the serving path allocates ([`frame_from`], which
//! builds a whole frame for tests and tools, does).

/// Ethernet II header.
pub const ETH_LEN: usize = 14;
/// IPv4 header without options (every reply uses it).
pub const IPV4_LEN: usize = 20;
/// UDP header.
pub const UDP_LEN: usize = 8;
/// All headers of a reply frame, in front of its payload.
pub const HEADERS_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN;
/// Largest UDP payload in one IPv4 datagram.
pub const PAYLOAD_MAX: usize = 65_535 - IPV4_LEN - UDP_LEN;

const ETHERTYPE_IPV4: u16 = 0x0800;
const PROTO_UDP: u8 = 17;
const DEFAULT_TTL: u8 = 64;

/// Why a frame is not an IPv4 UDP datagram this code serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Udp4Error {
    /// Not IPv4 over Ethernet II (ARP, IPv6, a VLAN tag, ...).
    #[error("not an IPv4 frame")]
    NotIpv4,
    /// Shorter than its headers or lengths claim.
    #[error("truncated frame")]
    Truncated,
    /// Version, header length or total length inconsistent.
    #[error("malformed IPv4 header")]
    BadHeader,
    /// A fragment: reassembly is the kernel's job.
    #[error("IPv4 fragment")]
    Fragment,
    /// Not UDP.
    #[error("not UDP")]
    NotUdp,
    /// The IPv4 header or UDP checksum does not verify.
    #[error("bad checksum")]
    BadChecksum,
    /// The reply payload does not fit the buffer or one datagram.
    #[error("reply too large")]
    TooLarge,
}

/// Both ends of a UDP datagram as it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp4Addrs {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip: [u8; 4],
    pub dst_ip: [u8; 4],
    pub src_port: u16,
    pub dst_port: u16,
}

/// A UDP datagram found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp4<'a> {
    pub addrs: Udp4Addrs,
    /// Offset of the payload in the frame.
    pub payload_at: usize,
    pub payload: &'a [u8],
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// The Internet checksum's running sum of `bytes` (RFC 1071), added to `sum`.
fn sum_words(mut sum: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(2);
    for w in &mut words {
        sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a running sum into the 16-bit ones' complement checksum.
fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop leaves at most 16 bits.
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

/// The sum of the UDP pseudo header (addresses, protocol, UDP length).
fn pseudo_sum(src: [u8; 4], dst: [u8; 4], udp_len: u16) -> u64 {
    let sum = sum_words(0, &src);
    let sum = sum_words(sum, &dst);
    sum + u64::from(PROTO_UDP) + u64::from(udp_len)
}

/// Finds the UDP datagram in `frame`, checking lengths and checksums. Ethernet padding
/// after the IP datagram is allowed; a UDP checksum of 0 means none was sent (IPv4).
pub fn parse(frame: &[u8]) -> Result<Udp4<'_>, Udp4Error> {
    if frame.len() < ETH_LEN + IPV4_LEN {
        return Err(
            if frame.len() >= ETH_LEN && be16(frame, 12) != ETHERTYPE_IPV4 {
                Udp4Error::NotIpv4
            } else {
                Udp4Error::Truncated
            },
        );
    }
    if be16(frame, 12) != ETHERTYPE_IPV4 {
        return Err(Udp4Error::NotIpv4);
    }
    let ip = &frame[ETH_LEN..];
    let (version, ihl) = (ip[0] >> 4, usize::from(ip[0] & 0x0f) * 4);
    if version != 4 || ihl < IPV4_LEN {
        return Err(Udp4Error::BadHeader);
    }
    let total = usize::from(be16(ip, 2));
    if ip.len() < ihl || total < ihl + UDP_LEN {
        return Err(if ip.len() < ihl {
            Udp4Error::Truncated
        } else {
            Udp4Error::BadHeader
        });
    }
    if total > ip.len() {
        return Err(Udp4Error::Truncated);
    }
    if be16(ip, 6) & 0x3fff != 0 {
        return Err(Udp4Error::Fragment); // more-fragments flag or an offset
    }
    if ip[9] != PROTO_UDP {
        return Err(Udp4Error::NotUdp);
    }
    if fold(sum_words(0, &ip[..ihl])) != 0 {
        return Err(Udp4Error::BadChecksum);
    }
    let udp = &ip[ihl..total];
    let udp_len = be16(udp, 4);
    if usize::from(udp_len) < UDP_LEN || usize::from(udp_len) > udp.len() {
        return Err(Udp4Error::BadHeader);
    }
    let udp = &udp[..usize::from(udp_len)];
    let (src_ip, dst_ip) = (array(ip, 12), array(ip, 16));
    if be16(udp, 6) != 0 && fold(sum_words(pseudo_sum(src_ip, dst_ip, udp_len), udp)) != 0 {
        return Err(Udp4Error::BadChecksum);
    }
    let payload_at = ETH_LEN + ihl + UDP_LEN;
    Ok(Udp4 {
        addrs: Udp4Addrs {
            dst_mac: array(frame, 0),
            src_mac: array(frame, 6),
            src_ip,
            dst_ip,
            src_port: be16(udp, 0),
            dst_port: be16(udp, 2),
        },
        payload_at,
        payload: &udp[UDP_LEN..],
    })
}

/// Writes, into `buf[..HEADERS_LEN]`, the headers of the reply to a datagram from `req`
/// whose payload is already at `buf[HEADERS_LEN..HEADERS_LEN + payload_len]`: source and
/// destination swapped, IPv4 id `ip_id`, don't-fragment set, both checksums computed.
/// Returns the frame's length.
pub fn write_reply_headers(
    buf: &mut [u8],
    req: &Udp4Addrs,
    payload_len: usize,
    ip_id: u16,
) -> Result<usize, Udp4Error> {
    let frame_len = HEADERS_LEN + payload_len;
    if payload_len > PAYLOAD_MAX || buf.len() < frame_len {
        return Err(Udp4Error::TooLarge);
    }
    // Both fit 16 bits: payload_len <= PAYLOAD_MAX.
    let udp_len = u16::try_from(UDP_LEN + payload_len).map_err(|_| Udp4Error::TooLarge)?;
    let ip_len =
        u16::try_from(IPV4_LEN + UDP_LEN + payload_len).map_err(|_| Udp4Error::TooLarge)?;
    let (eth, rest) = buf.split_at_mut(ETH_LEN);
    eth[0..6].copy_from_slice(&req.src_mac);
    eth[6..12].copy_from_slice(&req.dst_mac);
    eth[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let (ip, rest) = rest.split_at_mut(IPV4_LEN);
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = DEFAULT_TTL;
    ip[9] = PROTO_UDP;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&req.dst_ip);
    ip[16..20].copy_from_slice(&req.src_ip);
    let ip_sum = fold(sum_words(0, ip));
    ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let udp = &mut rest[..UDP_LEN + payload_len];
    udp[0..2].copy_from_slice(&req.dst_port.to_be_bytes());
    udp[2..4].copy_from_slice(&req.src_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].fill(0);
    let sum = fold(sum_words(pseudo_sum(req.dst_ip, req.src_ip, udp_len), udp));
    // A computed 0 is sent as all ones (0 would mean "no checksum").
    let sum = if sum == 0 { 0xffff } else { sum };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    Ok(frame_len)
}

impl Udp4Addrs {
    /// The same two ends seen from the other side (sources and destinations swapped).
    pub fn reversed(&self) -> Udp4Addrs {
        Udp4Addrs {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }
}

/// A whole frame sent from `addrs`' source to its destination carrying `payload` (as a
/// client would send it; for tests and tools). `None` when `payload` is over one datagram.
pub fn frame_from(addrs: &Udp4Addrs, payload: &[u8], ip_id: u16) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; HEADERS_LEN + payload.len()];
    buf[HEADERS_LEN..].copy_from_slice(payload);
    write_reply_headers(&mut buf, &addrs.reversed(), payload.len(), ip_id).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs() -> Udp4Addrs {
        Udp4Addrs {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: [10, 0, 0, 1],
            dst_ip: [10, 0, 0, 2],
            src_port: 40_000,
            dst_port: 11_211,
        }
    }

    /// A request frame from `addrs()` carrying `payload` (built as a reply to the mirror).
    fn request(payload: &[u8]) -> Vec<u8> {
        let frame = frame_from(&addrs(), payload, 1).unwrap();
        assert_eq!(frame.len(), HEADERS_LEN + payload.len());
        assert_eq!(addrs().reversed().reversed(), addrs());
        frame
    }

    /// RFC 1071 computed the plain way: 16-bit words summed with end-around carry.
    fn naive_checksum(bytes: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for i in (0..bytes.len()).step_by(2) {
            let hi = u32::from(bytes[i]) << 8;
            let lo = bytes.get(i + 1).map_or(0, |&b| u32::from(b));
            sum += hi | lo;
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap()
    }

    #[test]
    fn the_ipv4_checksum_matches_a_known_header() {
        // The classic example header (checksum field zeroed): its checksum is 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum_words(0, &h)), 0xb861);
        assert_eq!(naive_checksum(&h), 0xb861);
    }

    #[test]
    fn a_reply_round_trips_with_addresses_swapped() {
        let frame = request(b"\0\x07\0\0\0\x01\0\0get k\r\n");
        let got = parse(&frame).unwrap();
        assert_eq!(got.addrs, addrs());
        assert_eq!(got.payload, b"\0\x07\0\0\0\x01\0\0get k\r\n");
        assert_eq!(got.payload_at, HEADERS_LEN);
        // The UDP checksum agrees with an independent computation over the pseudo header.
        let udp = &frame[ETH_LEN + IPV4_LEN..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&frame[26..34]);
        pseudo.extend_from_slice(&[0, PROTO_UDP]);
        pseudo.extend_from_slice(&u16::try_from(udp.len()).unwrap().to_be_bytes());
        let mut zeroed = udp.to_vec();
        zeroed[6..8].fill(0);
        pseudo.extend_from_slice(&zeroed);
        assert_eq!(naive_checksum(&pseudo).to_be_bytes(), [udp[6], udp[7]]);
        // Odd payload lengths too.
        assert!(parse(&request(b"x")).is_ok());
        assert!(parse(&request(b"")).is_ok());
    }

    #[test]
    fn damaged_or_foreign_frames_are_refused() {
        let good = request(b"0123456789");
        let mut flip = good.clone();
        *flip.last_mut().unwrap() ^= 1;
        assert_eq!(
            parse(&flip),
            Err(Udp4Error::BadChecksum),
            "payload byte flipped"
        );
        let mut ipsum = good.clone();
        ipsum[ETH_LEN + 8] ^= 1; // TTL
        assert_eq!(parse(&ipsum), Err(Udp4Error::BadChecksum));
        let mut arp = good.clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert_eq!(parse(&arp), Err(Udp4Error::NotIpv4));
        for cut in 0..good.len() {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut frag = good.clone();
        frag[ETH_LEN + 6] |= 0x20; // more fragments
        assert_eq!(parse(&frag), Err(Udp4Error::Fragment));
        let mut nocsum = good.clone();
        nocsum[ETH_LEN + IPV4_LEN + 6..ETH_LEN + IPV4_LEN + 8].fill(0);
        assert!(parse(&nocsum).is_ok(), "UDP checksum 0: none sent");
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 6]);
        assert_eq!(
            parse(&padded).unwrap().payload,
            b"0123456789",
            "Ethernet padding"
        );
        let mut long_udp = good;
        let at = ETH_LEN + IPV4_LEN + 4;
        long_udp[at..at + 2].copy_from_slice(&500u16.to_be_bytes());
        assert!(parse(&long_udp).is_err(), "UDP length past the datagram");
    }

    #[test]
    fn a_reply_that_does_not_fit_is_refused() {
        let mut buf = vec![0u8; HEADERS_LEN + 10];
        assert_eq!(
            write_reply_headers(&mut buf, &addrs(), 11, 0),
            Err(Udp4Error::TooLarge)
        );
        let mut big = vec![0u8; HEADERS_LEN + PAYLOAD_MAX + 1];
        assert_eq!(
            write_reply_headers(&mut big, &addrs(), PAYLOAD_MAX + 1, 0),
            Err(Udp4Error::TooLarge)
        );
    }
}
