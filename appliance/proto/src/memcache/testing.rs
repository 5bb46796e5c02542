//! Test helpers shared by the per-command parser tests.

use super::{parse, Limits, Parse, Request};

/// The request parsed from a complete `input` with default limits.
pub(crate) fn req(input: &[u8]) -> Request<'_> {
    match parse(input, &Limits::default()) {
        Parse::Done { request, .. } => request,
        other => panic!("{other:?}"),
    }
}

/// Parses with a 100-byte `item_size_max`, so too-large values are cheap to write.
pub(crate) fn parse_small(input: &[u8]) -> Parse<'_> {
    parse(
        input,
        &Limits {
            item_size_max: 100,
            max_line: 2048,
        },
    )
}

/// `(line, noreply, swallow, consumed)` of a fixed reply under [`parse_small`].
pub(crate) fn reply_small(input: &[u8]) -> (&'static str, bool, usize, usize) {
    match parse_small(input) {
        Parse::Done {
            request:
                Request::Reply {
                    line,
                    noreply,
                    swallow,
                },
            consumed,
        } => (line, noreply, swallow, consumed),
        other => panic!("{other:?}"),
    }
}
