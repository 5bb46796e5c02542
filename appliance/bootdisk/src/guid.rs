//! GUIDs as GPT stores them: the text form `c12a7328-f81f-11d2-ba4b-00a0c93ec93b` and the 16
//! on-disk bytes (first three fields little-endian, the rest as written).

use std::fmt;

/// A GUID in GPT's on-disk byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Guid(pub [u8; 16]);

/// A GUID that is not 32 hex digits in the 8-4-4-4-12 form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid GUID {0:?}: expected xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
pub struct GuidError(pub String);

impl Guid {
    /// Parses the text form.
    pub fn parse(text: &str) -> Result<Guid, GuidError> {
        let bad = || GuidError(text.chars().take(64).collect());
        let groups: Vec<&str> = text.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        if groups.len() != 5
            || groups.iter().zip(lens).any(|(g, l)| g.len() != l)
            || !groups
                .iter()
                .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(bad());
        }
        let mut be = [0u8; 16];
        let hex: String = groups.concat();
        for (i, byte) in be.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Guid::from_big_endian(be))
    }

    /// The GUID whose text form is these 16 bytes in order.
    pub fn from_big_endian(be: [u8; 16]) -> Guid {
        let mut b = be;
        b[0..4].reverse();
        b[4..6].reverse();
        b[6..8].reverse();
        Guid(b)
    }

    /// A random-format (version 4, RFC 4122 variant) GUID made from 16 given bytes: how the
    /// image derives every GUID from its seed.
    pub fn v4_from(mut bytes: [u8; 16]) -> Guid {
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Guid::from_big_endian(bytes)
    }
}

impl fmt::Display for Guid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-",
            b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6], b[8], b[9]
        )?;
        b[10..].iter().try_for_each(|x| write!(f, "{x:02x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_esp_type_has_its_known_on_disk_bytes() {
        let esp = Guid::parse("c12a7328-f81f-11d2-ba4b-00a0c93ec93b").unwrap();
        assert_eq!(
            esp.0,
            [
                0x28, 0x73, 0x2a, 0xc1, 0x1f, 0xf8, 0xd2, 0x11, 0xba, 0x4b, 0x00, 0xa0, 0xc9, 0x3e,
                0xc9, 0x3b
            ]
        );
        assert_eq!(esp.to_string(), "c12a7328-f81f-11d2-ba4b-00a0c93ec93b");
        assert_eq!(Guid::parse("C12A7328-F81F-11D2-BA4B-00A0C93EC93B"), Ok(esp));
    }

    #[test]
    fn malformed_guids_are_refused() {
        for bad in [
            "",
            "c12a7328f81f11d2ba4b00a0c93ec93b",
            "c12a7328-f81f-11d2-ba4b-00a0c93ec93",
            "c12a7328-f81f-11d2-ba4b-00a0c93ec93bb",
            "g12a7328-f81f-11d2-ba4b-00a0c93ec93b",
            "c12a7328-f81f-11d2-ba4b-00a0c93ec9+b",
            "c12a7328-f81f-11d2-ba4b-00a0c93ec9é",
        ] {
            assert!(Guid::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn v4_guids_carry_version_and_variant() {
        let g = Guid::v4_from([0xff; 16]).to_string();
        assert_eq!(g, "ffffffff-ffff-4fff-bfff-ffffffffffff");
    }
}
