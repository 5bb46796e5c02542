//! The memcache cell matrix: value sizes, pipeline depths, keyspace, and a cell's name in both
//! its `--cells` spelling (`get-100-1`) and its table spelling (`GET 100 B, depth 1`).

use super::mcwire::Op;
use anyhow::{bail, Context, Result};

/// Value sizes of every cell.
pub(super) const VALUE_LENS: [usize; 2] = [100, 4096];
/// Pipeline depths of every cell.
pub(super) const DEPTHS: [usize; 2] = [1, 16];
/// Keys per value size, preloaded so every GET hits.
pub(super) const KEYSPACE: usize = 10_000;

/// `get-100-1` -> (Get, 100, 1).
pub(super) fn parse_cell(text: &str) -> Result<(Op, usize, usize)> {
    let parts: Vec<&str> = text.split('-').collect();
    let [op, len, depth] = parts.as_slice() else {
        bail!("cell {text:?}: expected OP-VALUEBYTES-DEPTH")
    };
    let op = match op.to_ascii_lowercase().as_str() {
        "get" => Op::Get,
        "set" => Op::Set,
        _ => bail!("cell {text:?}: OP is get or set"),
    };
    let len: usize = len
        .parse()
        .with_context(|| format!("cell {text:?}: value bytes"))?;
    let depth: usize = depth
        .parse()
        .with_context(|| format!("cell {text:?}: depth"))?;
    if !VALUE_LENS.contains(&len) || !DEPTHS.contains(&depth) {
        bail!(
            "cell {text:?}: value bytes must be one of {VALUE_LENS:?} and depth one of {DEPTHS:?}"
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
    }
}
