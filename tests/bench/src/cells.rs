//! The memcache cell matrix: value sizes, pipeline depths, keyspace, and a cell's name in both
//! its `--cells` spelling (`get-100-1`) and its table spelling (`GET 100 B, depth 1`). Besides
//! the matrix's text `get` and `set`, `--cells` may name GETs by the meta protocol
//! (`mg-524288-1`: `mg <key> v`) and the binary one (`bget-…`, `bgetk-…`: GET, GETK).

use super::mcwire::Op;
use anyhow::{bail, Context, Result};

/// Value sizes of every cell.
pub(super) const VALUE_LENS: [usize; 2] = [100, 4096];
/// Pipeline depths of every cell.
pub(super) const DEPTHS: [usize; 2] = [1, 16];
/// Keys per value size, preloaded so every GET hits.
pub(super) const KEYSPACE: usize = 10_000;
/// Big-value sizes (issue 14, ADR 0027: values sent from the item), run only when named in
/// `--cells` (`get-524288-1`); not part of the default matrix.
pub(super) const BIG_VALUE_LENS: [usize; 3] = [16384, 102400, 524288];
/// Bytes preloaded per value size at most (the servers get 1024 MiB): big values get fewer keys.
const PRELOAD_BYTES_MAX: usize = 256 << 20;

/// Keys preloaded (and asked for) for values of `len` bytes.
pub(super) fn keyspace(len: usize) -> usize {
    KEYSPACE.min(PRELOAD_BYTES_MAX / len.max(1))
}

/// `get-100-1` -> (Get, 100, 1).
pub(super) fn parse_cell(text: &str) -> Result<(Op, usize, usize)> {
    let parts: Vec<&str> = text.split('-').collect();
    let [op, len, depth] = parts.as_slice() else {
        bail!("cell {text:?}: expected OP-VALUEBYTES-DEPTH")
    };
    let Some(op) = Op::from_token(op) else {
        bail!("cell {text:?}: OP is one of {}", Op::tokens())
    };
    let len: usize = len
        .parse()
        .with_context(|| format!("cell {text:?}: value bytes"))?;
    let depth: usize = depth
        .parse()
        .with_context(|| format!("cell {text:?}: depth"))?;
    let known = VALUE_LENS.contains(&len) || BIG_VALUE_LENS.contains(&len);
    if !known || !DEPTHS.contains(&depth) {
        bail!(
            "cell {text:?}: value bytes must be one of {VALUE_LENS:?} or {BIG_VALUE_LENS:?} and depth one of {DEPTHS:?}"
        );
    }
    Ok((op, len, depth))
}

pub(super) fn cell_name(op: Op, value_len: usize, depth: usize) -> String {
    let size = if value_len >= 1024 {
        format!("{} KiB", value_len / 1024)
    } else {
        format!("{value_len} B")
    };
    format!("{} {size}, depth {depth}", op.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_names_read_well() {
        assert_eq!(cell_name(Op::Get, 100, 1), "GET 100 B, depth 1");
        assert_eq!(cell_name(Op::Set, 4096, 16), "SET 4 KiB, depth 16");
        assert_eq!(cell_name(Op::Get, 524288, 1), "GET 512 KiB, depth 1");
        assert_eq!(cell_name(Op::MetaGet, 102400, 1), "mg v 100 KiB, depth 1");
        assert_eq!(
            cell_name(Op::BinGet, 524288, 1),
            "binary GET 512 KiB, depth 1"
        );
    }

    #[test]
    fn meta_and_binary_get_cells_parse() {
        assert!(matches!(
            parse_cell("mg-524288-1"),
            Ok((Op::MetaGet, 524288, 1))
        ));
        assert!(matches!(
            parse_cell("BGET-102400-1"),
            Ok((Op::BinGet, 102400, 1))
        ));
        assert!(matches!(
            parse_cell("bgetk-100-16"),
            Ok((Op::BinGetK, 100, 16))
        ));
        assert!(parse_cell("mgv-100-1").is_err());
        for op in [Op::Get, Op::Set, Op::MetaGet, Op::BinGet, Op::BinGetK] {
            let token = op.token().unwrap_or_default();
            assert_eq!(Op::from_token(token), Some(op), "{token}");
        }
        assert_eq!(Op::RespSet.token(), None);
    }

    #[test]
    fn big_cells_parse_and_preload_a_bounded_keyspace() {
        assert!(matches!(
            parse_cell("get-102400-1"),
            Ok((Op::Get, 102400, 1))
        ));
        assert!(parse_cell("get-12345-1").is_err());
        assert_eq!(keyspace(100), KEYSPACE);
        assert_eq!(keyspace(524288), 512);
    }
}
