//! Update signatures: an ed25519 signature over the whole `ringstore.efi`, shipped beside it as
//! `ringstore.efi.sig` (128 hex digits), checked against the public key the running image
//! carries (`/etc/ringstore/update-key.pub`, 64 hex digits) before a byte reaches a slot.

use ed25519_dalek::{Signature, VerifyingKey};

/// Where the running image keeps the key updates must be signed with.
pub const PUBLIC_KEY_PATH: &str = "/etc/ringstore/update-key.pub";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("{what}: expected {digits} hex digits")]
    Hex { what: &'static str, digits: usize },
    #[error("public key is not a valid ed25519 point")]
    Key,
    #[error("signature does not match the image (not signed with this image's update key)")]
    Mismatch,
}

/// Lower-case hex.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex<const N: usize>(text: &str, what: &'static str) -> Result<[u8; N], SignatureError> {
    let text = text.trim();
    let bad = SignatureError::Hex {
        what,
        digits: 2 * N,
    };
    if text.len() != 2 * N || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad);
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad.clone())?;
    }
    Ok(out)
}

/// Parses a public key file.
pub fn public_key(text: &str) -> Result<VerifyingKey, SignatureError> {
    VerifyingKey::from_bytes(&from_hex::<32>(text, "public key")?).map_err(|_| SignatureError::Key)
}

/// Checks a `.sig` file's text against `image` (strict verification: no malleable signatures).
pub fn verify(key: &VerifyingKey, image: &[u8], sig_text: &str) -> Result<(), SignatureError> {
    let sig = Signature::from_bytes(&from_hex::<64>(sig_text, "signature")?);
    key.verify_strict(image, &sig)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    #[test]
    fn only_the_signed_bytes_with_the_right_key_verify() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[8u8; 32]);
        let image = b"MZ... a ringstore.efi".to_vec();
        let sig = to_hex(&key.sign(&image).to_bytes());
        let public = public_key(&to_hex(key.verifying_key().as_bytes())).unwrap();
        assert_eq!(verify(&public, &image, &sig), Ok(()));
        let mut changed = image.clone();
        changed[0] ^= 1;
        assert_eq!(
            verify(&public, &changed, &sig),
            Err(SignatureError::Mismatch)
        );
        let wrong = to_hex(&other.sign(&image).to_bytes());
        assert_eq!(
            verify(&public, &image, &wrong),
            Err(SignatureError::Mismatch)
        );
        assert!(matches!(
            verify(&public, &image, &sig[..100]),
            Err(SignatureError::Hex { digits: 128, .. })
        ));
        assert!(matches!(
            verify(&public, &image, &format!("{}zz", &sig[..126])),
            Err(SignatureError::Hex { .. })
        ));
        assert!(public_key("00").is_err());
    }
}
