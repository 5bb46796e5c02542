//! The server measured against the baselines: a ringstore binary (given or freshly built), or
//! the baseline itself under `--self-check`.

use super::options::Options;
use super::procs::{self, Pinned};
use crate::util;
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The server measured against the baselines.
pub(super) enum Subject {
    Ringstore(PathBuf),
    /// `--self-check`: the baseline again.
    Baseline,
}

impl Subject {
    pub(super) fn memcache_name(&self) -> &'static str {
        match self {
            Subject::Ringstore(_) => "ringstore",
            Subject::Baseline => "memcached (again)",
        }
    }

    pub(super) fn http_name(&self) -> &'static str {
        match self {
            Subject::Ringstore(_) => "ringstore",
            Subject::Baseline => "nginx (again)",
        }
    }

    /// The subject's memcache server; a ringstore runs `--io` of `io` when given.
    pub(super) fn start_memcache(&self, memory_mib: u64, io: Option<&str>) -> Result<Pinned> {
        match self {
            Subject::Ringstore(binary) => match io {
                Some(io) => procs::start_ringstore_with(binary, memory_mib, &["--io", io]),
                None => procs::start_ringstore(binary, memory_mib),
            },
            Subject::Baseline => procs::start_memcached(memory_mib),
        }
    }
}

/// `--binary`, or a fresh release build in the target dir cargo uses.
pub(super) fn ringstore_binary(o: &Options) -> Result<PathBuf> {
    if let Some(binary) = &o.binary {
        if !binary.exists() {
            bail!("--binary {} does not exist", binary.display());
        }
        return Ok(binary.clone());
    }
    util::exec(util::cargo().args(["build", "--release", "-p", "ringstore"]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_relative() {
                util::root().join(p)
            } else {
                p
            }
        })
        .unwrap_or_else(|| util::root().join("target"));
    Ok(target.join("release/ringstore"))
}

/// `ringstore (x86_64-unknown-linux-musl)` for `.../x86_64-unknown-linux-musl/release/ringstore`,
/// `ringstore (host)` for a build for the host target.
pub(super) fn binary_label(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let triple = parts
        .windows(2)
        .rev()
        .find(|w| w[1] == "release" || w[1] == "debug")
        .map(|w| w[0].clone())
        .filter(|t| t.contains("-linux-"));
    // A copy under another file name (`/tmp/ringstore-before`) keeps that name, so two
    // host builds compared with each other are told apart.
    let file = parts.last().map_or("ringstore", String::as_str);
    format!("{file} ({})", triple.as_deref().unwrap_or("host"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_labels_name_the_target() {
        assert_eq!(
            binary_label(Path::new("/t/x86_64-unknown-linux-musl/release/ringstore")),
            "ringstore (x86_64-unknown-linux-musl)"
        );
        assert_eq!(
            binary_label(Path::new("/work/target-bench2/release/ringstore")),
            "ringstore (host)"
        );
        assert_eq!(
            binary_label(Path::new("/tmp/ringstore-copy-mg")),
            "ringstore-copy-mg (host)"
        );
    }
}
