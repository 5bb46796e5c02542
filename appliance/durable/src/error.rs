//! The typed errors of the data device; the server maps them to protocol replies.
use std::io;

/// Everything that can go wrong on the data device. None of these panic the caller.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The device (or the writer's region) has no free segment left for this write.
    /// memcache: `SERVER_ERROR out of memory storing object`; HTTP: 507.
    #[error("data device is full")]
    NoSpace,
    /// Too many writes are waiting for their flush; the caller should retry after acks drain.
    #[error("too many writes waiting for durability (limit {limit})")]
    Backpressure {
        /// The configured limit that was hit.
        limit: usize,
    },
    /// A read asked for bytes `start..end` outside `0..len` (or with `start > end`).
    #[error("range {start}..{end} outside 0..{len}")]
    BadRange {
        /// First byte asked for.
        start: usize,
        /// One past the last byte asked for.
        end: usize,
        /// Bytes there are.
        len: usize,
    },
    /// A key or value does not fit the record format or a segment.
    #[error("record too large: {len} bytes (limit {limit})")]
    TooLarge {
        /// Size of the rejected record or key.
        len: usize,
        /// The limit it exceeded.
        limit: usize,
    },
    /// The device I/O failed for this request (EIO, short write, failed flush).
    #[error("data device I/O error at offset {offset}: {kind}")]
    Io {
        /// Device offset of the failed operation.
        offset: u64,
        /// What the OS reported.
        kind: io::ErrorKind,
    },
    /// At the stop, a region's log still had writes not yet flushed (its worker stopped
    /// early): no checkpoint is written, and the next start scans what reached the device.
    #[error("a region stopped with writes not yet flushed: no checkpoint, the next start scans")]
    Unsettled,
    /// The device carries another filesystem or partition table; refused unless `force`.
    #[error("refusing to format: device carries a {0} signature (use force to overwrite)")]
    ForeignSignature(&'static str),
    /// The device holds data that is neither blank nor a ringstore superblock.
    #[error("refusing to format: device is not blank and has no ringstore superblock (use force to overwrite)")]
    NotBlank,
    /// The device was formatted by another format version.
    #[error("data device format version {found} is not supported (this build reads {supported}); use force to reformat")]
    Version {
        /// Version found on the device.
        found: u32,
        /// Version this build writes.
        supported: u32,
    },
    /// The superblock is damaged (bad checksum or impossible geometry).
    #[error("data device superblock is corrupt: {0}")]
    CorruptSuperblock(&'static str),
    /// The device is too small for the requested geometry.
    #[error("data device too small: {len} bytes, need at least {need}")]
    TooSmall {
        /// Device length.
        len: u64,
        /// Minimum length for the geometry.
        need: u64,
    },
    /// A completion arrived for an operation the state machine does not have in flight.
    #[error("completion for unknown operation id {0}")]
    UnexpectedCompletion(u64),
    /// A record read back from the device failed its checksum.
    #[error("data device record at offset {offset} is corrupt")]
    Corrupt {
        /// Device offset of the record.
        offset: u64,
    },
    /// Recovery found a record in acknowledged history that does not verify (a flipped bit or
    /// a lost write in a region's log: a later record says the place was durable). Starting
    /// would serve older values of keys whose newest record is there, so the device is refused
    /// (ADR 0016) and left as it is.
    #[error("corrupt: a record in acknowledged history does not verify at offset {offset} (region {region}, segment {segment}; {places} damaged places); refusing to start, which could serve older values; the device is left untouched")]
    CorruptHistory {
        /// Region of the first damaged place.
        region: u32,
        /// Segment of the first damaged place.
        segment: u32,
        /// Device offset where the verified log ends.
        offset: u64,
        /// Damaged places found on the whole device.
        places: usize,
    },
    /// A chunk of a large object is not on the device (never written, swept, or its object
    /// was replaced). HTTP: 500; the object is unreadable.
    #[error("chunk {index} of large object {object} is missing")]
    MissingChunk {
        /// Object id.
        object: u64,
        /// Chunk number.
        index: u32,
    },
    /// A large put whose value is not a valid encoded manifest.
    #[error("invalid large-object manifest")]
    BadManifest,
    /// The caller passed an out-of-range region number.
    #[error("no region {0}")]
    NoRegion(usize),
    /// The device is encrypted (ADR 0050) and no data key was given.
    #[error("the data device is encrypted: start with its data key (--data-key); the device is left untouched")]
    KeyMissing,
    /// A data key was given for a device formatted without one.
    #[error("a data key was given but the data device was formatted without one; the device is left untouched")]
    KeyUnexpected,
    /// The data key does not match the superblock's key check value.
    #[error("wrong data key: it does not match the key check value in the superblock; the device is left untouched")]
    WrongKey,
    /// The data key file cannot be used.
    #[error("data key {path}: {reason}")]
    KeyFile {
        /// The file.
        path: String,
        /// Why it is refused.
        reason: String,
    },
    /// The nonce counter or the open epoch would wrap: sealing stops rather than reuse a nonce.
    #[error("data key nonce space exhausted: refusing to seal under a nonce used before")]
    NonceSpace,
    /// The data key given is the one a rekey replaced (ADR 0055).
    #[error("this data key was replaced by a rekey (data rekey): start with the new key; the device is left untouched")]
    KeyReplaced,
    /// A rekey refused, with why.
    #[error("rekey refused: {0}")]
    Rekey(String),
}

impl DurableError {
    /// Build an [`DurableError::Io`] from a std error at a device offset.
    pub fn io(offset: u64, err: &io::Error) -> Self {
        DurableError::Io {
            offset,
            kind: err.kind(),
        }
    }
}
