//! Command marshalling and response reading for the handful of TPM 2.0 commands sealing needs
//! (TPM 2.0 Part 3 layouts, big-endian). Responses are first checked by `tpm2-protocol`
//! (frame shape, response code), then read here with every length bounded by the buffer.
use crate::TpmError;
use tpm2_protocol::data::{TpmCc, TpmRc};
use tpm2_protocol::frame::TpmResponse;

pub(crate) const ST_NO_SESSIONS: u16 = 0x8001;
pub(crate) const ST_SESSIONS: u16 = 0x8002;
/// The password session handle (empty password) for the owner hierarchy and the storage key.
pub(crate) const RS_PW: u32 = 0x4000_0009;
pub(crate) const RH_OWNER: u32 = 0x4000_0001;
pub(crate) const RH_NULL: u32 = 0x4000_0007;
pub(crate) const ALG_SHA256: u16 = 0x000B;
pub(crate) const ALG_NULL: u16 = 0x0010;

/// A command under construction: header filled in by [`Command::finish`].
pub(crate) struct Command {
    buf: Vec<u8>,
}

impl Command {
    pub(crate) fn new(tag: u16, cc: u32) -> Command {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&tag.to_be_bytes());
        buf.extend_from_slice(&[0; 4]);
        buf.extend_from_slice(&cc.to_be_bytes());
        Command { buf }
    }
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub(crate) fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }
    /// A TPM2B: u16 size, then the bytes.
    pub(crate) fn sized(&mut self, v: &[u8]) -> Result<&mut Self, TpmError> {
        let len = u16::try_from(v.len()).map_err(|_| TpmError::Malformed("TPM2B over 64 KiB"))?;
        Ok(self.u16(len).bytes(v))
    }
    /// One authorization: `session` with empty nonce and hmac (a password session with the
    /// empty password, or a policy session whose policy needs no HMAC).
    pub(crate) fn auth(&mut self, session: u32, attributes: u8) -> &mut Self {
        self.u32(9).u32(session).u16(0).u8(attributes).u16(0)
    }
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[2..6].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

/// TPML_PCR_SELECTION of PCR 7 in the SHA-256 bank.
pub(crate) fn pcr7_selection() -> [u8; 10] {
    let mut s = [0u8; 10];
    s[0..4].copy_from_slice(&1u32.to_be_bytes());
    s[4..6].copy_from_slice(&ALG_SHA256.to_be_bytes());
    s[6] = 3; // sizeofSelect: PCRs 0..23
    s[7] = 1 << 7; // PCR 7
    s
}

/// A successful response's body after the header, or the TPM's refusal as a typed error.
pub(crate) fn check<'a>(
    command: &'static str,
    cc: TpmCc,
    rsp: &'a [u8],
) -> Result<Reader<'a>, TpmError> {
    let frame =
        TpmResponse::cast(rsp).map_err(|e| TpmError::Protocol(command, format!("{e:?}")))?;
    let rc = frame
        .rc()
        .map_err(|e| TpmError::Protocol(command, format!("{e:?}")))?;
    if rc != TpmRc::Fmt0(tpm2_protocol::data::TpmRcBase::Success) {
        return Err(TpmError::Refused {
            command,
            code: rc.value(),
            name: rc.to_string(),
        });
    }
    frame
        .validate(cc)
        .map_err(|e| TpmError::Protocol(command, format!("{e:?}")))?;
    Ok(Reader { rest: &rsp[10..] })
}

/// Reads a response body front to back; a read past the end is [`TpmError::Malformed`].
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { rest: b }
    }
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], TpmError> {
        if self.rest.len() < n {
            return Err(TpmError::Malformed("response shorter than its fields"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, TpmError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, TpmError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, TpmError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Whether every byte was read.
    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
    /// A TPM2B's contents.
    pub(crate) fn sized(&mut self) -> Result<&'a [u8], TpmError> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
    /// A TPM2B with its size prefix, as the TPM wants it back (TPM2B_PUBLIC, TPM2B_PRIVATE).
    pub(crate) fn sized_whole(&mut self) -> Result<&'a [u8], TpmError> {
        let all = self.rest;
        let n = usize::from(self.u16()?);
        self.take(n)?;
        Ok(&all[..2 + n])
    }
}
