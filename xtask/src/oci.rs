//! `cargo xtask oci`: a reproducible OCI image archive of the static ringstore binary,
//! `target/oci/ringstore.tar` (an OCI image layout in a tar: `oci-layout`, `index.json`,
//! `blobs/sha256/…`), which `podman load -i`, `skopeo copy oci-archive:` and `docker load`
//! accept. Same bytes for the same binary and `SOURCE_DATE_EPOCH` (ADR 0034).

pub mod podman;
mod recipe;
pub mod tar;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use tar::Entry;

/// The image's user and group: numeric (there is no shell or NSS to resolve names), the
/// conventional "nonroot" id of distroless images.
pub const UID: u32 = 65532;
/// The ports the default configuration serves: memcache TCP and HTTP (UDP is off by default).
pub const EXPOSED: [&str; 2] = ["11211/tcp", "8080/tcp"];
pub const ENTRYPOINT: [&str; 2] = ["/ringstore", "serve"];
/// Every address, so published ports reach it (the defaults, said where a user sees them).
pub const CMD: [&str; 4] = ["--memcache", "0.0.0.0:11211", "--http", "0.0.0.0:8080"];
/// The name `podman load` and `docker load` give the image.
pub const REF_NAME: &str = "localhost/ringstore:latest";
const LAYER_MEDIA: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_MEDIA: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_MEDIA: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_MEDIA: &str = "application/vnd.oci.image.index.v1+json";

/// Where `cargo xtask oci` writes the archive.
pub fn archive_path() -> PathBuf {
    crate::util::root().join("target/oci/ringstore.tar")
}

/// The seccomp profile that lets the io_uring runtime start in a container: podman's default
/// (containers-common 0.50.1, Debian 12) plus one rule allowing the three io_uring calls.
/// Committed, so a user has it without podman or a build; `cargo xtask oci` ships a copy beside
/// the archive and `--check` holds it to the host podman's default profile.
pub const SECCOMP_PROFILE: &str = "image/seccomp-allow-io_uring.json";

/// The file name of the profile beside the archive (and in the repository).
pub const SECCOMP_PROFILE_NAME: &str = "seccomp-allow-io_uring.json";

/// The modification time of every entry and the image's `created`: `SOURCE_DATE_EPOCH`
/// when set (reproducible-builds.org), else 0.
pub fn source_date_epoch() -> Result<u64> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => v
            .trim()
            .parse()
            .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not whole seconds")),
        Err(_) => Ok(0),
    }
}

/// `--check`: whether to run the podman check after building.
pub fn parse_options(args: &[String]) -> Result<bool> {
    let mut check = false;
    for (flag, _) in crate::cli::parse("oci", args)?.flags {
        match flag {
            "--check" => check = true,
            other => return Err(crate::cli::unhandled("oci", other)),
        }
    }
    Ok(check)
}

/// The test step (`cargo xtask oci --check`): the image's runs under podman, then the pages'
/// `podman run` commands as printed.
pub fn check() -> Result<()> {
    let machine = podman::check()?;
    recipe::run_all(&machine)
}

pub fn run(args: &[String]) -> Result<()> {
    if parse_options(args)? {
        return check();
    }
    let path = build()?;
    println!("{}", path.display());
    Ok(())
}

/// Builds the static binary and writes the archive, with the seccomp profile beside it;
/// returns the archive's path.
pub fn build() -> Result<PathBuf> {
    let binary = crate::image::build_static_binary()?;
    let bytes = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let archive = image_archive(&bytes, source_date_epoch()?)?;
    let path = archive_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, &archive).with_context(|| format!("writing {}", path.display()))?;
    let profile = path.with_file_name(SECCOMP_PROFILE_NAME);
    std::fs::copy(crate::util::root().join(SECCOMP_PROFILE), &profile)
        .with_context(|| format!("copying {SECCOMP_PROFILE} to {}", profile.display()))?;
    eprintln!(
        "oci: wrote {} ({} bytes, manifest {})",
        path.display(),
        archive.len(),
        manifest_digest(&archive)?
    );
    Ok(path)
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The root filesystem: the binary, passwd/group naming the user (for tools that look), an
/// empty `/tmp` and `/data` (the user's, for `--data /data/ringstore.data` on a volume).
fn layer(binary: &[u8], mtime: u64) -> Result<Vec<u8>> {
    let passwd = format!(
        "root:x:0:0:root:/:/sbin/nologin\nnonroot:x:{UID}:{UID}:nonroot:/data:/sbin/nologin\n"
    );
    let group = format!("root:x:0:\nnonroot:x:{UID}:\n");
    tar::write(
        &mut [
            Entry::dir("data/", 0o700).owned_by(UID),
            Entry::dir("etc/", 0o755),
            Entry::file("etc/group", 0o644, group.as_bytes()),
            Entry::file("etc/passwd", 0o644, passwd.as_bytes()),
            Entry::file("ringstore", 0o755, binary),
            Entry::dir("tmp/", 0o1777),
        ],
        mtime,
    )
}

/// The image configuration (OCI image-spec config.md) for a layer whose digest is `diff_id`.
fn config(diff_id: &str, created: &str) -> Value {
    let exposed: serde_json::Map<String, Value> = EXPOSED
        .iter()
        .map(|p| ((*p).to_string(), json!({})))
        .collect();
    json!({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": format!("{UID}:{UID}"),
            "ExposedPorts": exposed,
            "Entrypoint": ENTRYPOINT,
            "Cmd": CMD,
            "WorkingDir": "/data",
            "StopSignal": "SIGTERM",
            "Labels": {
                "org.opencontainers.image.title": "ringstore",
                "org.opencontainers.image.description": "memcache and HTTP object cache; io_uring runtime needs a seccomp profile allowing io_uring_setup/enter/register (seccomp-allow-io_uring.json, docs/CONTAINER.md)",
            },
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "cargo xtask oci"}],
    })
}

fn descriptor(media: &str, bytes: &[u8]) -> Value {
    json!({"mediaType": media, "digest": digest(bytes), "size": bytes.len()})
}

/// The whole archive for `binary`, every time in it `mtime`.
pub fn image_archive(binary: &[u8], mtime: u64) -> Result<Vec<u8>> {
    let layer = layer(binary, mtime)?;
    let created = rfc3339(mtime);
    let config = serde_json::to_vec(&config(&digest(&layer), &created))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA,
        "config": descriptor(CONFIG_MEDIA, &config),
        "layers": [descriptor(LAYER_MEDIA, &layer)],
    }))?;
    let mut manifest_descriptor = descriptor(MANIFEST_MEDIA, &manifest);
    manifest_descriptor["annotations"] = json!({
        "org.opencontainers.image.ref.name": REF_NAME,
        // What containerd and `docker load` name an OCI archive by.
        "io.containerd.image.name": REF_NAME,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA,
        "manifests": [manifest_descriptor],
    }))?;
    let blob_path = |bytes: &[u8]| format!("blobs/sha256/{}", &digest(bytes)["sha256:".len()..]);
    let (layer_path, config_path, manifest_path) =
        (blob_path(&layer), blob_path(&config), blob_path(&manifest));
    tar::write(
        &mut [
            Entry::dir("blobs/", 0o755),
            Entry::dir("blobs/sha256/", 0o755),
            Entry::file(&layer_path, 0o644, &layer),
            Entry::file(&config_path, 0o644, &config),
            Entry::file(&manifest_path, 0o644, &manifest),
            Entry::file("index.json", 0o644, &index),
            Entry::file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#),
        ],
        mtime,
    )
}

/// The digest of the one manifest `index.json` names in an archive.
pub fn manifest_digest(archive: &[u8]) -> Result<String> {
    let entries = tar::read(archive)?;
    let index = entries
        .iter()
        .find(|e| e.path == "index.json")
        .context("no index.json")?;
    let index: Value = serde_json::from_slice(&index.data)?;
    index["manifests"][0]["digest"]
        .as_str()
        .map(str::to_string)
        .context("index.json names no manifest")
}

/// `secs` after the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(secs: u64) -> String {
    let (year, month, day) =
        ringstore_sys::civil_from_days(i64::try_from(secs / 86_400).unwrap_or(i64::MAX));
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests;
