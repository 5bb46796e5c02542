//! memcached's binary protocol: the 24-byte request header, request parsing, and (in
//! [`response`]) the response frames.
//!
//! Sans-IO and allocation-free like the text parser: [`parse`] looks at the bytes buffered
//! so far and asks for more, tells the caller to close, or returns one [`Request`] borrowing
//! its key and value from the input. Every length in the header is checked before anything
//! is buffered: a key over 250 bytes or lengths that do not add up are answered from the
//! header alone, a value over `item_size_max` is refused before its bytes arrive (and
//! swallowed, never buffered), and what any request needs buffered is bounded by
//! [`max_buffered`]. Behaviour (which lengths each command accepts, which errors close the
//! connection, which bytes are swallowed) follows memcached 1.6.18's `proto_bin.c`, checked
//! against the real server.

pub mod response;

use super::{Limits, StoreKind, KEY_LEN_MAX};

/// First byte of every request (`PROTOCOL_BINARY_REQ`); on a fresh connection it selects
/// the binary protocol for the rest of it.
pub const REQUEST_MAGIC: u8 = 0x80;
/// First byte of every response.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Bytes of a request or response header.
pub const HEADER_LEN: usize = 24;

/// Opcodes served (memcached's `PROTOCOL_BINARY_CMD_*`).
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    /// Not served by memcached 1.6.18 either: answered "Unknown command".
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// Longest SASL mechanism name (memcached `MAX_SASL_MECH_LEN`).
pub const SASL_MECH_MAX: usize = 32;
/// Largest SASL auth or step data read (PLAIN: authorization id, user and password).
pub const SASL_DATA_MAX: usize = 1024;

/// Response statuses, with the message memcached sends in an error's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Success,
    KeyNotFound,
    KeyExists,
    TooLarge,
    InvalidArguments,
    NotStored,
    NonNumeric,
    UnknownCommand,
    OutOfMemory,
    /// Not logged in (`PROTOCOL_BINARY_RESPONSE_AUTH_ERROR`; ringstore `--auth-file`).
    AuthError,
    /// The data device could not make a write durable (no memcached equivalent; 0x84 is
    /// `PROTOCOL_BINARY_RESPONSE_EINTERNAL` in memcached's `protocol_binary.h`).
    Internal,
}

impl Status {
    /// The status code on the wire.
    pub fn code(self) -> u16 {
        match self {
            Status::Success => 0x0000,
            Status::KeyNotFound => 0x0001,
            Status::KeyExists => 0x0002,
            Status::TooLarge => 0x0003,
            Status::InvalidArguments => 0x0004,
            Status::NotStored => 0x0005,
            Status::NonNumeric => 0x0006,
            Status::UnknownCommand => 0x0081,
            Status::OutOfMemory => 0x0082,
            Status::AuthError => 0x0020,
            Status::Internal => 0x0084,
        }
    }

    /// The body of an error response, as memcached words it.
    pub fn message(self) -> &'static str {
        match self {
            Status::Success => "",
            Status::KeyNotFound => "Not found",
            Status::KeyExists => "Data exists for key.",
            Status::TooLarge => "Too large.",
            Status::InvalidArguments => "Invalid arguments",
            Status::NotStored => "Not stored.",
            Status::NonNumeric => "Non-numeric server-side value for incr or decr",
            Status::UnknownCommand => "Unknown command",
            Status::OutOfMemory => "Out of memory",
            Status::AuthError => "Auth failure.",
            Status::Internal => "Data device write failed",
        }
    }
}

/// The request header fields a reply needs: it echoes the opcode and the opaque.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub opcode: u8,
    pub opaque: u32,
}

/// The outcome of looking at buffered input.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<'a> {
    /// No complete request yet; keep the bytes and read more.
    Incomplete,
    /// A storage request whose header, extras and key are whole but whose value has not all
    /// arrived; it needs `request_len` bytes in all. The caller may refuse before buffering:
    /// answer [`Status::OutOfMemory`], consume `head_len` bytes, swallow the
    /// `request_len - head_len` that follow, and for a set remove the old item (memcached's
    /// answer when it cannot allocate the item). Otherwise it is [`Parse::Incomplete`].
    AwaitingValue {
        head: Head,
        request_len: usize,
        head_len: usize,
        key: &'a [u8],
        remove_old: bool,
    },
    /// A header that does not start with [`REQUEST_MAGIC`]: memcached closes without a reply.
    Close,
    /// One request, and how many input bytes it used.
    Done {
        head: Head,
        request: Request<'a>,
        consumed: usize,
    },
}

/// A get family request: get, getq, getk, getkq, gat, gatq, gatk, gatkq and touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetRequest<'a> {
    pub key: &'a [u8],
    /// getk / gatk: the key comes back in the response (also on a miss).
    pub with_key: bool,
    /// touch answers the flags only.
    pub with_value: bool,
    /// A miss gets no response (getq, getkq, gatq, gatkq).
    pub quiet: bool,
    /// gat / touch: the new exptime.
    pub touch: Option<u32>,
}

/// A storage request with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreRequest<'a> {
    /// Set, Add, Replace, Append or Prepend (never Cas: `cas` says it).
    pub kind: StoreKind,
    pub key: &'a [u8],
    pub flags: u32,
    pub exptime: u32,
    pub data: &'a [u8],
    /// Non-zero: store only over an item with this CAS unique.
    pub cas: u64,
    /// Success gets no response (errors still do).
    pub quiet: bool,
}

/// increment / decrement with the binary protocol's initial value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArithRequest<'a> {
    pub incr: bool,
    pub key: &'a [u8],
    pub delta: u64,
    /// Stored when the key is missing, unless `exptime` is `0xffffffff`.
    pub initial: u64,
    pub exptime: u32,
    pub cas: u64,
    pub quiet: bool,
}

/// The `exptime` of an increment that must not create a missing counter.
pub const NO_CREATE: u32 = 0xffff_ffff;

/// One parsed request. Keys and values borrow from the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Get(GetRequest<'a>),
    Store(StoreRequest<'a>),
    /// A value over `item_size_max`: answer [`Status::TooLarge`], swallow `swallow` bytes,
    /// and for a set remove the old item.
    TooLarge {
        key: &'a [u8],
        remove_old: bool,
        swallow: usize,
    },
    Delete {
        key: &'a [u8],
        cas: u64,
        quiet: bool,
    },
    Arith(ArithRequest<'a>),
    Quit {
        quiet: bool,
    },
    Flush {
        exptime: u32,
        quiet: bool,
    },
    Noop,
    Version,
    /// `stat` with its key (empty: the general stats).
    Stat {
        key: &'a [u8],
    },
    /// `SASL list mechs`.
    SaslListMechs,
    /// `SASL auth` (`step` false) or `SASL step`, with the whole of its data.
    Sasl {
        mech: &'a [u8],
        data: &'a [u8],
        step: bool,
    },
    /// A SASL auth or step whose mechanism name is over [`SASL_MECH_MAX`] (`status`
    /// "Invalid arguments", as memcached) or whose data is over [`SASL_DATA_MAX`] ("Out of
    /// memory", memcached's answer when it cannot hold the data); `swallow` bytes follow.
    /// A server without SASL answers "Unknown command" and swallows the same bytes.
    SaslRefused {
        status: Status,
        swallow: usize,
    },
    /// An error response decided by the parser: then `swallow` bytes are discarded, or
    /// the connection is closed after the response.
    Error {
        status: Status,
        swallow: usize,
        close: bool,
    },
}

/// The most bytes a request ever needs buffered under `limits`: a storage request's header,
/// extras, key and value (every other request needs at most its header, extras and key).
pub fn max_buffered(limits: &Limits) -> usize {
    HEADER_LEN + 8 + KEY_LEN_MAX + limits.item_size_max
}

/// The header fields, as on the wire (big-endian).
struct Header {
    opcode: u8,
    key_len: usize,
    extras_len: usize,
    body_len: usize,
    opaque: u32,
    cas: u64,
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    (u64::from(be32(b)) << 32) | u64::from(be32(&b[4..]))
}

fn header(b: &[u8]) -> Header {
    Header {
        opcode: b[1],
        key_len: usize::from(be16(&b[2..])),
        extras_len: usize::from(b[4]),
        body_len: be32(&b[8..]) as usize,
        opaque: be32(&b[12..]),
        cas: be64(&b[16..]),
    }
}

/// Looks at `input` (the start of a request) and returns what to do next.
///
/// Never panics, never looks past `input`, and never asks for more than
/// [`max_buffered`] bytes.
pub fn parse<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    // Like memcached, the magic is looked at once the whole header is there.
    if input.len() < HEADER_LEN {
        return Parse::Incomplete;
    }
    if input[0] != REQUEST_MAGIC {
        return Parse::Close;
    }
    let h = header(input);
    let head = Head {
        opcode: h.opcode,
        opaque: h.opaque,
    };
    let error = |status, consumed| Parse::Done {
        head,
        request: Request::Error {
            status,
            swallow: 0,
            close: true,
        },
        consumed,
    };
    // memcached waits for the extras and key before these checks; a key it would refuse is
    // refused from the header alone, so it is never buffered.
    let lengths_wrong = h.key_len + h.extras_len > h.body_len;
    if h.key_len > KEY_LEN_MAX {
        let status = if lengths_wrong {
            Status::UnknownCommand
        } else {
            Status::InvalidArguments
        };
        return error(status, HEADER_LEN);
    }
    let head_len = HEADER_LEN + h.extras_len + h.key_len;
    if input.len() < head_len {
        return Parse::Incomplete;
    }
    if lengths_wrong {
        return error(Status::UnknownCommand, head_len);
    }
    let extras = &input[HEADER_LEN..HEADER_LEN + h.extras_len];
    let key = &input[HEADER_LEN + h.extras_len..head_len];
    let done = |request| Parse::Done {
        head,
        request,
        consumed: head_len,
    };
    match command(&h, extras, key) {
        Command::Ready(request) => done(request),
        Command::Invalid => error(Status::InvalidArguments, head_len),
        Command::SaslData { step } => {
            sasl_data(input, head, head_len + (h.body_len - h.key_len), key, step)
        }
        Command::Value {
            kind,
            flags,
            exptime,
            quiet,
        } => {
            let vlen = h.body_len - h.extras_len - h.key_len;
            let remove_old = kind == StoreKind::Set;
            if vlen > limits.item_size_max {
                return done(Request::TooLarge {
                    key,
                    remove_old,
                    swallow: vlen,
                });
            }
            let request_len = head_len + vlen;
            if input.len() < request_len {
                return Parse::AwaitingValue {
                    head,
                    request_len,
                    head_len,
                    key,
                    remove_old,
                };
            }
            Parse::Done {
                head,
                request: Request::Store(StoreRequest {
                    kind,
                    key,
                    flags,
                    exptime,
                    data: &input[head_len..request_len],
                    cas: h.cas,
                    quiet,
                }),
                consumed: request_len,
            }
        }
    }
}

/// The storage request (SET, ADD, REPLACE, APPEND, PREPEND and their quiet forms) whose
/// header, extras and key are `head` (the `head_len` bytes [`Parse::AwaitingValue`] frames),
/// with no data, and its value's length: what a caller that receives the value elsewhere
/// (into the item) needs, as [`super::store_head`] for the text protocol. `None` for any
/// other request or one [`parse`] refuses.
pub fn store_head(head: &[u8]) -> Option<(Head, StoreRequest<'_>, usize)> {
    if head.len() < HEADER_LEN || head[0] != REQUEST_MAGIC {
        return None;
    }
    let h = header(head);
    let head_len = HEADER_LEN + h.extras_len + h.key_len;
    if h.key_len > KEY_LEN_MAX || h.key_len + h.extras_len > h.body_len || head.len() != head_len {
        return None;
    }
    let extras = &head[HEADER_LEN..HEADER_LEN + h.extras_len];
    let key = &head[HEADER_LEN + h.extras_len..head_len];
    let Command::Value {
        kind,
        flags,
        exptime,
        quiet,
    } = command(&h, extras, key)
    else {
        return None;
    };
    let request = StoreRequest {
        kind,
        key,
        flags,
        exptime,
        data: &[],
        cas: h.cas,
        quiet,
    };
    let at = Head {
        opcode: h.opcode,
        opaque: h.opaque,
    };
    Some((at, request, h.body_len - h.extras_len - h.key_len))
}

/// A SASL auth or step once its `request_len` bytes are all there.
fn sasl_data<'a>(
    input: &'a [u8],
    head: Head,
    request_len: usize,
    mech: &'a [u8],
    step: bool,
) -> Parse<'a> {
    let Some(whole) = input.get(..request_len) else {
        return Parse::Incomplete;
    };
    Parse::Done {
        head,
        request: Request::Sasl {
            mech,
            data: &whole[HEADER_LEN + mech.len()..],
            step,
        },
        consumed: request_len,
    }
}

/// What the opcode and lengths make of a request whose extras and key are whole.
enum Command<'a> {
    Ready(Request<'a>),
    /// A storage command: its value follows the key.
    Value {
        kind: StoreKind,
        flags: u32,
        exptime: u32,
        quiet: bool,
    },
    /// Lengths this command does not take: "Invalid arguments", then close.
    Invalid,
    /// SASL auth or step: its data follows the key.
    SaslData {
        step: bool,
    },
}

fn command<'a>(h: &Header, extras: &[u8], key: &'a [u8]) -> Command<'a> {
    use opcode::*;
    match h.opcode {
        GET | GETQ | GETK | GETKQ | TOUCH | GAT | GATQ | GATK | GATKQ => {
            read_command(h, extras, key)
        }
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ | APPEND | APPENDQ | PREPEND | PREPENDQ => {
            storage_command(h, extras)
        }
        _ => other_command(h, extras, key),
    }
}

/// `request` when the lengths are what its command takes (`ok`), else [`Command::Invalid`].
fn ready(ok: bool, request: Request<'_>) -> Command<'_> {
    if ok {
        Command::Ready(request)
    } else {
        Command::Invalid
    }
}

/// get, getk, touch, gat, gatk and their quiet forms.
fn read_command<'a>(h: &Header, extras: &[u8], key: &'a [u8]) -> Command<'a> {
    use opcode::*;
    let (ext, klen, body) = (h.extras_len, h.key_len, h.body_len);
    let op = h.opcode;
    match op {
        GET | GETQ | GETK | GETKQ => ready(
            ext == 0 && body == klen && klen > 0,
            Request::Get(GetRequest {
                key,
                with_key: matches!(op, GETK | GETKQ),
                with_value: true,
                quiet: matches!(op, GETQ | GETKQ),
                touch: None,
            }),
        ),
        _ => {
            if ext != 4 || klen == 0 {
                return Command::Invalid;
            }
            Command::Ready(Request::Get(GetRequest {
                key,
                with_key: matches!(op, GATK | GATKQ),
                with_value: op != TOUCH,
                quiet: matches!(op, GATQ | GATKQ),
                touch: Some(be32(extras)),
            }))
        }
    }
}

/// set, add, replace, append, prepend and their quiet forms: a value follows the key.
fn storage_command<'a>(h: &Header, extras: &[u8]) -> Command<'a> {
    use opcode::*;
    let (ext, klen) = (h.extras_len, h.key_len);
    let op = h.opcode;
    match op {
        SET | SETQ | ADD | ADDQ | REPLACE | REPLACEQ => {
            if ext != 8 || klen == 0 {
                return Command::Invalid;
            }
            let kind = match op {
                SET | SETQ => StoreKind::Set,
                ADD | ADDQ => StoreKind::Add,
                _ => StoreKind::Replace,
            };
            Command::Value {
                kind,
                flags: be32(extras),
                exptime: be32(&extras[4..]),
                quiet: matches!(op, SETQ | ADDQ | REPLACEQ),
            }
        }
        _ => {
            if ext != 0 || klen == 0 {
                return Command::Invalid;
            }
            Command::Value {
                kind: if matches!(op, APPEND | APPENDQ) {
                    StoreKind::Append
                } else {
                    StoreKind::Prepend
                },
                flags: 0,
                exptime: 0,
                quiet: matches!(op, APPENDQ | PREPENDQ),
            }
        }
    }
}

/// delete, incr/decr, quit, flush, noop, version, stat, SASL, and unknown opcodes.
fn other_command<'a>(h: &Header, extras: &[u8], key: &'a [u8]) -> Command<'a> {
    use opcode::*;
    let (ext, klen, body) = (h.extras_len, h.key_len, h.body_len);
    let empty = ext == 0 && klen == 0 && body == 0;
    let op = h.opcode;
    match op {
        DELETE | DELETEQ => ready(
            klen > 0 && ext == 0 && body == klen,
            Request::Delete {
                key,
                cas: h.cas,
                quiet: op == DELETEQ,
            },
        ),
        INCREMENT | INCREMENTQ | DECREMENT | DECREMENTQ => {
            if klen == 0 || ext != 20 || body != klen + ext {
                return Command::Invalid;
            }
            Command::Ready(Request::Arith(ArithRequest {
                incr: matches!(op, INCREMENT | INCREMENTQ),
                key,
                delta: be64(extras),
                initial: be64(&extras[8..]),
                exptime: be32(&extras[16..]),
                cas: h.cas,
                quiet: matches!(op, INCREMENTQ | DECREMENTQ),
            }))
        }
        QUIT | QUITQ => ready(empty, Request::Quit { quiet: op == QUITQ }),
        FLUSH | FLUSHQ => ready(
            klen == 0 && body == ext && (ext == 0 || ext == 4),
            Request::Flush {
                exptime: if ext == 4 { be32(extras) } else { 0 },
                quiet: op == FLUSHQ,
            },
        ),
        NOOP => ready(empty, Request::Noop),
        VERSION => ready(empty, Request::Version),
        STAT => ready(ext == 0, Request::Stat { key }),
        // The session answers these (memcached without SASL configured: "Unknown command",
        // the rest of the body swallowed).
        SASL_LIST_MECHS => ready(empty, Request::SaslListMechs),
        SASL_AUTH | SASL_STEP => {
            let swallow = body - klen;
            if ext != 0 || klen == 0 {
                Command::Invalid
            } else if klen > SASL_MECH_MAX || swallow > SASL_DATA_MAX {
                let status = if klen > SASL_MECH_MAX {
                    Status::InvalidArguments
                } else {
                    Status::OutOfMemory
                };
                Command::Ready(Request::SaslRefused { status, swallow })
            } else {
                Command::SaslData {
                    step: op == SASL_STEP,
                }
            }
        }
        // memcached swallows the whole body length after the extras and key it already
        // read, so a body eats as many bytes of what follows (checked against 1.6.18).
        _ => Command::Ready(unknown(body)),
    }
}

fn unknown<'a>(swallow: usize) -> Request<'a> {
    Request::Error {
        status: Status::UnknownCommand,
        swallow,
        close: false,
    }
}

#[cfg(test)]
mod tests;
