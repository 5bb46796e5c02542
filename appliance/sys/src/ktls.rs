//! Kernel TLS (`CONFIG_TLS`): hand a TLS session's traffic keys to the kernel, which then
//! encrypts what is sent on the socket and decrypts what is received (docs/adr/0031). Raw
//! `setsockopt`: rustix has no TCP_ULP / SOL_TLS setters. The crypto-info structs are
//! written as the kernel's bytes (`uapi/linux/tls.h`: two u16, then byte arrays, no padding).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// TLS 1.2 or 1.3, as the kernel names them.
pub const KTLS_TLS12: u16 = 0x0303;
pub const KTLS_TLS13: u16 = 0x0304;

/// The AEADs our kernel config has (AES-GCM, ChaCha20-Poly1305).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KtlsCipher {
    /// 16-byte key.
    AesGcm128,
    /// 32-byte key.
    AesGcm256,
    /// 32-byte key.
    Chacha20Poly1305,
}

/// One direction's traffic keys: the AEAD key, the 12-byte IV (TLS 1.3) or salt and
/// implicit nonce (TLS 1.2, as rustls gives them), and the next record's sequence number.
pub struct KtlsKeys {
    pub version: u16,
    pub cipher: KtlsCipher,
    pub key: Vec<u8>,
    pub iv: [u8; 12],
    pub seq: u64,
}

impl std::fmt::Debug for KtlsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KtlsKeys")
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// Why the kernel did not take a session.
#[derive(Debug, thiserror::Error)]
pub enum KtlsError {
    /// The kernel has no TLS ULP (no `CONFIG_TLS`: ENOENT; not a TCP socket: ENOPROTOOPT):
    /// nothing changed on the socket; user space goes on.
    #[error("kernel TLS unavailable: {0}")]
    Unavailable(io::Error),
    /// The session's keys could not be had (the closure gave none): nothing set beyond the ULP.
    #[error("kernel TLS: no keys for this session")]
    NoKeys,
    /// The ULP is on but a direction's keys were refused: the socket is unusable for TLS.
    #[error("kernel TLS: {direction} keys refused: {source}")]
    Refused {
        direction: &'static str,
        source: io::Error,
    },
}

/// The kernel's `tls12_crypto_info_*` bytes for `keys`.
fn crypto_info(keys: &KtlsKeys) -> Vec<u8> {
    let (cipher_type, key_len): (u16, usize) = match keys.cipher {
        KtlsCipher::AesGcm128 => (51, 16),
        KtlsCipher::AesGcm256 => (52, 32),
        KtlsCipher::Chacha20Poly1305 => (54, 32),
    };
    let mut info = Vec::with_capacity(4 + 12 + key_len + 8);
    info.extend_from_slice(&keys.version.to_ne_bytes());
    info.extend_from_slice(&cipher_type.to_ne_bytes());
    let key = &keys.key[..key_len.min(keys.key.len())];
    match keys.cipher {
        // iv[8] (the nonce's last 8 bytes), key, salt[4] (its first 4), rec_seq[8].
        KtlsCipher::AesGcm128 | KtlsCipher::AesGcm256 => {
            info.extend_from_slice(&keys.iv[4..]);
            info.extend_from_slice(key);
            info.extend_from_slice(&keys.iv[..4]);
        }
        // iv[12], key, no salt, rec_seq[8].
        KtlsCipher::Chacha20Poly1305 => {
            info.extend_from_slice(&keys.iv);
            info.extend_from_slice(key);
        }
    }
    info.extend_from_slice(&keys.seq.to_be_bytes());
    info
}

fn set(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: &[u8]) -> io::Result<()> {
    // SAFETY: `value` is readable for `value.len()` bytes for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            value.as_ptr().cast(),
            crate::num::u32_of(value.len()),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Puts TCP socket `fd` under kernel TLS: the `tls` ULP first (where the kernel lacks it,
/// [`KtlsError::Unavailable`] and nothing changed), then `keys()` (transmit, receive) for
/// `TLS_TX` and `TLS_RX`. `keys` runs only once the ULP is on, so a session keeps its keys
/// in user space on a kernel without TLS. The key bytes are overwritten after use.
pub fn install_kernel_tls(
    fd: BorrowedFd<'_>,
    keys: impl FnOnce() -> Option<(KtlsKeys, KtlsKeys)>,
) -> Result<(), KtlsError> {
    set(fd, libc::IPPROTO_TCP, libc::TCP_ULP, b"tls").map_err(KtlsError::Unavailable)?;
    let (tx, rx) = keys().ok_or(KtlsError::NoKeys)?;
    for (direction, name, keys) in [("TX", 1, &tx), ("RX", 2, &rx)] {
        let mut info = crypto_info(keys);
        let result = set(fd, libc::SOL_TLS, name, &info);
        info.fill(0);
        result.map_err(|source| KtlsError::Refused { direction, source })?;
    }
    for mut keys in [tx, rx] {
        keys.key.fill(0);
        keys.iv.fill(0);
    }
    Ok(())
}

/// Whether this kernel has the TLS ULP: tried on a loopback TCP connection made for the
/// purpose (ENOENT: no `CONFIG_TLS`).
pub fn kernel_has_tls() -> bool {
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
        return false;
    };
    let Ok(addr) = listener.local_addr() else {
        return false;
    };
    let Ok(_client) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let Ok((server, _)) = listener.accept() else {
        return false;
    };
    use std::os::fd::AsFd;
    set(server.as_fd(), libc::IPPROTO_TCP, libc::TCP_ULP, b"tls").is_ok()
}

/// Asks for the ACK of what `fd` received to go out now (TCP_QUICKACK): a TLS 1.3
/// handshake that ends with nothing to send would otherwise leave the client's Finished
/// unacknowledged for the delayed-ACK time, which a Nagle client waits for.
pub fn quick_ack(fd: BorrowedFd<'_>) {
    let _ = rustix::net::sockopt::set_tcp_quickack(fd, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_info_is_the_kernels_layout() {
        let keys = KtlsKeys {
            version: KTLS_TLS13,
            cipher: KtlsCipher::AesGcm128,
            key: (0..16).collect(),
            iv: [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111],
            seq: 0x0102,
        };
        let info = crypto_info(&keys);
        // struct tls12_crypto_info_aes_gcm_128: 4 + 8 + 16 + 4 + 8 bytes.
        assert_eq!(info.len(), 40);
        assert_eq!(&info[..4], &[0x04, 0x03, 51, 0]);
        assert_eq!(&info[4..12], &[104, 105, 106, 107, 108, 109, 110, 111]);
        assert_eq!(&info[12..28], &(0..16).collect::<Vec<u8>>()[..]);
        assert_eq!(&info[28..32], &[100, 101, 102, 103]);
        assert_eq!(&info[32..], &[0, 0, 0, 0, 0, 0, 1, 2]);
        let chacha = KtlsKeys {
            cipher: KtlsCipher::Chacha20Poly1305,
            key: vec![7; 32],
            ..keys
        };
        // tls12_crypto_info_chacha20_poly1305: 4 + 12 + 32 + 0 + 8.
        assert_eq!(crypto_info(&chacha).len(), 56);
    }

    #[test]
    fn a_kernel_without_tls_leaves_the_socket_alone() {
        // This host's kernel has no CONFIG_TLS (the appliance's has): the ULP is refused
        // and the keys are never asked for. A kernel with the ULP refuses an unconnected
        // socket (ENOTCONN): still Unavailable, still no keys asked for.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let mut asked = false;
        let result = install_kernel_tls(std::os::fd::AsFd::as_fd(&server), || {
            asked = true;
            None
        });
        let has_tls = std::path::Path::new("/sys/module/tls").exists();
        if has_tls {
            assert!(matches!(result, Err(KtlsError::NoKeys)), "{result:?}");
        } else {
            match result {
                Err(KtlsError::Unavailable(e)) => assert!(
                    matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOPROTOOPT)),
                    "{e}"
                ),
                other => panic!("{other:?}"),
            }
            assert!(!asked);
        }
        drop(client);
        assert_eq!(kernel_has_tls(), has_tls);
    }
}
