//! The archive's reproducibility and its fields, read back the way a runtime reads them.

use super::tar::{self, Kind, ReadEntry};
use super::*;

fn fake_binary() -> Vec<u8> {
    let mut b = b"\x7fELF not really, but bytes".to_vec();
    b.resize(70_000, 0xAB);
    b
}

fn blob<'a>(entries: &'a [ReadEntry], digest: &str) -> &'a [u8] {
    let hex = digest.strip_prefix("sha256:").unwrap();
    let e = entries
        .iter()
        .find(|e| e.path == format!("blobs/sha256/{hex}"))
        .unwrap_or_else(|| panic!("no blob {digest}"));
    // Every blob's name is its content's digest.
    assert_eq!(super::digest(&e.data), digest);
    &e.data
}

#[test]
fn same_inputs_give_the_same_bytes_and_other_inputs_do_not() {
    let a = image_archive(&fake_binary(), 0).unwrap();
    let b = image_archive(&fake_binary(), 0).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, image_archive(&fake_binary(), 1_700_000_000).unwrap());
    let mut other = fake_binary();
    other[100] ^= 1;
    assert_ne!(
        manifest_digest(&a).unwrap(),
        manifest_digest(&image_archive(&other, 0).unwrap()).unwrap()
    );
}

#[test]
fn layout_manifest_and_config_say_what_the_readme_says() {
    let binary = fake_binary();
    let archive = image_archive(&binary, 1_700_000_000).unwrap();
    let entries = tar::read(&archive).unwrap();
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    let mut sorted = paths.clone();
    sorted.sort_unstable();
    assert_eq!(paths, sorted);
    assert!(entries
        .iter()
        .all(|e| e.mtime == 1_700_000_000 && e.uid == 0 && e.gid == 0));
    let layout = entries.iter().find(|e| e.path == "oci-layout").unwrap();
    assert_eq!(layout.data, br#"{"imageLayoutVersion":"1.0.0"}"#);
    let index: Value = serde_json::from_slice(
        &entries
            .iter()
            .find(|e| e.path == "index.json")
            .unwrap()
            .data,
    )
    .unwrap();
    assert_eq!(index["schemaVersion"], 2);
    let m = &index["manifests"][0];
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        REF_NAME
    );
    let manifest_bytes = blob(&entries, m["digest"].as_str().unwrap());
    assert_eq!(m["size"], manifest_bytes.len());
    let manifest: Value = serde_json::from_slice(manifest_bytes).unwrap();
    assert_eq!(manifest["mediaType"], MANIFEST_MEDIA);
    let config_bytes = blob(&entries, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(manifest["config"]["size"], config_bytes.len());
    let config: Value = serde_json::from_slice(config_bytes).unwrap();
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
    let layer = blob(&entries, layer_digest);
    assert_eq!(manifest["layers"][0]["mediaType"], LAYER_MEDIA);
    // Uncompressed: the layer's digest is its diff_id.
    assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
    assert_eq!(
        (config["os"].as_str(), config["architecture"].as_str()),
        (Some("linux"), Some("amd64"))
    );
    assert_eq!(config["created"], "2023-11-14T22:13:20Z");
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532");
    assert_eq!(c["Entrypoint"], json!(["/ringstore", "serve"]));
    assert_eq!(c["Cmd"], json!(CMD));
    let ports: Vec<&String> = c["ExposedPorts"].as_object().unwrap().keys().collect();
    assert_eq!(ports, ["11211/tcp", "8080/tcp"]);

    let files = tar::read(layer).unwrap();
    let names: Vec<&str> = files.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        names,
        [
            "data/",
            "etc/",
            "etc/group",
            "etc/passwd",
            "ringstore",
            "tmp/"
        ]
    );
    let ringstore = &files[4];
    assert_eq!(
        (ringstore.mode, ringstore.uid, ringstore.kind),
        (0o755, 0, Kind::File)
    );
    assert_eq!(ringstore.data, binary);
    // Only the user's own data directory is not root's; nothing is setuid; no shell.
    for f in &files {
        let owner = if f.path == "data/" { UID } else { 0 };
        assert_eq!((f.uid, f.gid), (owner, owner), "{}", f.path);
        assert_eq!(f.mode & 0o6000, 0, "{}", f.path);
        assert!(!f.path.contains("sh"), "{}", f.path);
    }
    let passwd = String::from_utf8(files[3].data.clone()).unwrap();
    assert!(passwd.contains(":65532:65532:"));
}

#[test]
fn epoch_and_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(4_102_444_799), "2099-12-31T23:59:59Z");
}
