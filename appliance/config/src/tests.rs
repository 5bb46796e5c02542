//! Tests of the three configuration front ends and their error messages.

use super::*;

#[test]
fn defaults_match_the_product() {
    let c = Config::default();
    assert_eq!(c.memcache, Some("0.0.0.0:11211".parse().unwrap()));
    assert_eq!(c.http, Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(c.udp, None);
    assert_eq!(c.cores, 0);
    assert_eq!(c.numa, NumaChoice::Auto);
    assert_eq!(c.memory, 64 << 20);
    assert_eq!(c.max_conns, 4096);
    assert_eq!(c.item_size_max, 1 << 20);
    assert_eq!(c.idle_timeout_secs, 0);
    assert_eq!(c.request_timeout_secs, 10);
    assert_eq!(c.tls_handshake_timeout_secs, 5);
    assert_eq!(c.placement, Placement::Acceptor);
}

#[test]
fn flags_both_spellings() {
    let c = Config::from_args([
        "--memcache",
        "127.0.0.1:0",
        "--http=off",
        "--udp",
        "127.0.0.1:0",
        "--memory=4GiB",
        "--cores",
        "2",
        "--numa",
        "1",
        "--max_conns",
        "10",
        "--idle-timeout",
        "0",
        "--placement",
        "reuseport",
    ])
    .unwrap();
    assert_eq!(c.memcache, Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(c.http, None);
    assert_eq!(c.udp, Some("127.0.0.1:0".parse().unwrap()));
    assert_eq!(c.memory, 4 << 30);
    assert_eq!(c.cores, 2);
    assert_eq!(c.numa, NumaChoice::Node(1));
    assert_eq!(c.max_conns, 10);
    assert_eq!(c.idle_timeout_secs, 0);
    assert_eq!(c.placement, Placement::ReusePort);
}

#[test]
fn bad_value_names_key_value_and_allowed() {
    let err = Config::from_args(["--memory", "abc"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"invalid value "abc" for memory: expected a size like 64MiB or 4GiB (at least 1MiB)"#
    );
    let err = Config::from_args(["--memcache", "localhost"]).unwrap_err();
    assert!(
        err.to_string().contains("memcache") && err.to_string().contains("IP:PORT"),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'));
}

#[test]
fn unknown_missing_and_stray_arguments() {
    assert!(matches!(
        Config::from_args(["--colour", "red"]),
        Err(ConfigError::UnknownKey { .. })
    ));
    assert!(matches!(
        Config::from_args(["--memory"]),
        Err(ConfigError::MissingValue { .. })
    ));
    assert!(matches!(
        Config::from_args(["memory"]),
        Err(ConfigError::UnexpectedArgument { .. })
    ));
    let err = Config::from_args(["--colour=red"]).unwrap_err().to_string();
    assert!(err.contains("colour") && err.contains("memcache"), "{err}");
}

#[test]
fn cross_key_rules() {
    assert!(matches!(
        Config::from_args(["--memcache", "off", "--http", "off"]),
        Err(ConfigError::Inconsistent(_))
    ));
    assert!(matches!(
        Config::from_args(["--memory", "1MiB", "--item-size-max", "2MiB"]),
        Err(ConfigError::Inconsistent(_))
    ));
    assert!(Config::from_args(["--max-conns", "0"]).is_err());
    assert!(Config::from_args(["--request-timeout", "0"]).is_err());
    assert!(Config::from_args(["--tls-handshake-timeout", "0"]).is_err());
    assert_eq!(
        Config::from_args(["--tls-handshake-timeout", "7"]).map(|c| c.tls_handshake_timeout_secs),
        Ok(7)
    );
    // AF_XDP steers the UDP port, so it needs one; and it does not hold writes for the device.
    assert!(matches!(
        Config::from_args(["--xdp", "eth0"]),
        Err(ConfigError::Inconsistent(_))
    ));
    assert!(matches!(
        Config::from_args([
            "--xdp",
            "eth0",
            "--udp",
            "0.0.0.0:11211",
            "--data",
            "/dev/vda"
        ]),
        Err(ConfigError::Inconsistent(_))
    ));
    let ok = Config::from_args(["--xdp", "eth0,eth1", "--udp", "0.0.0.0:11211"]).unwrap();
    assert_eq!(ok.xdp, ["eth0", "eth1"]);
}

#[test]
fn toml_with_dashes_underscores_and_integers() {
    let c = Config::from_toml_str(
        "memory = \"128MiB\"\nmax_conns = 7\nitem-size-max = 2097152\nhttp = false\nnuma = \"auto\"\n",
    )
    .unwrap();
    assert_eq!(c.memory, 128 << 20);
    assert_eq!(c.max_conns, 7);
    assert_eq!(c.item_size_max, 2 << 20);
    assert_eq!(c.http, None);
    let err = Config::from_toml_str("cores = 1.5\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("cores"), "{err}");
    assert!(matches!(
        Config::from_toml_str("memory = "),
        Err(ConfigError::Toml { .. })
    ));
    assert!(matches!(
        Config::from_toml_str("bogus = 1"),
        Err(ConfigError::UnknownKey { .. })
    ));
}

#[test]
fn kernel_cmdline_reads_only_ringstore_tokens() {
    let c = Config::from_kernel_cmdline(
        "console=ttyS0 ip=dhcp ringstore.memory=4GiB ringstore.cores=8 ringstore.data=/dev/vda quiet ringstore.max_conns=9",
    )
    .unwrap();
    assert_eq!(c.memory, 4 << 30);
    assert_eq!(c.cores, 8);
    assert_eq!(c.data, Some("/dev/vda".into()));
    assert_eq!(c.max_conns, 9);
    assert_eq!(c.memcache, Config::default().memcache);
    assert!(Config::from_kernel_cmdline("ringstore.memory=lots").is_err());
    assert!(Config::from_kernel_cmdline("ringstore.memory").is_err());
}

#[test]
fn config_file_first_flags_override() {
    let dir = std::env::temp_dir().join(format!("ringstore-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ringstore.toml");
    std::fs::write(&path, "memory = \"256MiB\"\ncores = 3\n").unwrap();
    let c = Config::from_args(["--cores", "1", "--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(c.memory, 256 << 20, "file value applies");
    assert_eq!(c.cores, 1, "flag overrides the file regardless of order");
    let missing = dir.join("missing.toml");
    assert!(matches!(
        Config::from_args(["--config", missing.to_str().unwrap()]),
        Err(ConfigError::File { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn data_key_is_a_path_and_needs_data() {
    assert_eq!(Config::default().data_key, None);
    let c = Config::from_args(["--data", "/tmp/d", "--data-key", "/etc/k"]).unwrap();
    assert_eq!(c.data_key.as_deref(), Some(std::path::Path::new("/etc/k")));
    let c = Config::from_toml_str("data = \"/tmp/d\"\ndata_key = \"/etc/k\"\n").unwrap();
    assert_eq!(c.data_key.as_deref(), Some(std::path::Path::new("/etc/k")));
    assert!(matches!(
        Config::from_args(["--data-key", "/etc/k"]),
        Err(ConfigError::Inconsistent(_))
    ));
    assert!(Config::from_args(["--data", "/tmp/d", "--data-key", "off"])
        .unwrap()
        .data_key
        .is_none());
}

#[test]
fn data_format_is_auto_or_force() {
    assert_eq!(Config::default().data_format, crate::DataFormat::Auto);
    let c = Config::from_args(["--data", "/tmp/d", "--data-format=force"]).unwrap();
    assert_eq!(c.data_format, crate::DataFormat::Force);
    assert!(Config::from_args(["--data-format=maybe"]).is_err());
    let c =
        Config::from_kernel_cmdline("ringstore.data=/dev/vda ringstore.data_format=force").unwrap();
    assert_eq!(c.data_format, crate::DataFormat::Force);
}

#[test]
fn external_value_min_is_zero_or_1kib_to_1gib() {
    assert_eq!(Config::default().external_value_min, 64 << 10);
    let c = Config::from_args(["--data", "/tmp/d", "--external-value-min", "256KiB"]).unwrap();
    assert_eq!(c.external_value_min, 256 << 10);
    let c = Config::from_args(["--external_value_min=0"]).unwrap();
    assert_eq!(c.external_value_min, 0, "0 turns it off");
    let c = Config::from_toml_str("external-value-min = 4096\n").unwrap();
    assert_eq!(c.external_value_min, 4096);
    let c = Config::from_kernel_cmdline("ringstore.external_value_min=1GiB").unwrap();
    assert_eq!(c.external_value_min, 1 << 30);
    for bad in ["512", "2GiB", "lots"] {
        let err = Config::from_args(["--external-value-min", bad]).unwrap_err();
        assert!(err.to_string().contains("external-value-min"), "{err}");
    }
}

#[test]
fn config_file_size_is_capped() {
    let dir = std::env::temp_dir().join(format!("ringstore-config-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Exactly the limit: a comment filling the file, then one key.
    let key = "cores = 2\n";
    let fits = dir.join("fits.toml");
    let comment = format!(
        "#{}\n",
        "x".repeat(usize::try_from(CONFIG_FILE_MAX).unwrap() - key.len() - 2)
    );
    std::fs::write(&fits, format!("{comment}{key}")).unwrap();
    assert_eq!(std::fs::metadata(&fits).unwrap().len(), CONFIG_FILE_MAX);
    let c = Config::from_args(["--config", fits.to_str().unwrap()]).unwrap();
    assert_eq!(c.cores, 2);
    // One byte more is refused, naming the file and the limit.
    let over = dir.join("over.toml");
    std::fs::write(&over, format!("{comment}{key}\n")).unwrap();
    let err = Config::from_args(["--config", over.to_str().unwrap()]).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::FileTooLarge {
                limit: CONFIG_FILE_MAX,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "config file {} is larger than 1048576 bytes, the most ringstore reads",
            over.display()
        )
    );
    // A device that never ends is refused after the limit, not read forever.
    let started = std::time::Instant::now();
    let err = Config::from_args(["--config", "/dev/zero"]).unwrap_err();
    assert!(matches!(err, ConfigError::FileTooLarge { .. }), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // Not UTF-8, and a directory: one-line errors too.
    let binary = dir.join("binary.toml");
    std::fs::write(&binary, b"cores = 1\n\xff\n").unwrap();
    let err = Config::from_args(["--config", binary.to_str().unwrap()]).unwrap_err();
    assert!(matches!(err, ConfigError::File { .. }), "{err}");
    let err = Config::from_args(["--config", dir.to_str().unwrap()]).unwrap_err();
    assert!(matches!(err, ConfigError::File { .. }), "{err}");
    assert_eq!(err.to_string().lines().count(), 1, "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn hostname_is_rfc1123_and_at_most_64_bytes() {
    let c = Config::from_kernel_cmdline("ringstore.hostname=cache-01.rack2").unwrap();
    assert_eq!(c.hostname.as_deref(), Some("cache-01.rack2"));
    assert_eq!(Config::default().hostname, None);
    let longest = format!("{}.b", "a".repeat(62));
    assert_eq!(longest.len(), HOSTNAME_MAX);
    assert!(Config::from_kernel_cmdline(&format!("ringstore.hostname={longest}")).is_ok());
    for bad in [
        format!("{longest}x"),
        "a".repeat(64),
        "-lead".into(),
        "trail-".into(),
        "two..dots".into(),
        "under_score".into(),
        "sp ace".into(),
        "semi;colon".into(),
        "".into(),
        ".".into(),
    ] {
        let err = Config::from_toml_str(&format!("hostname = {bad:?}")).unwrap_err();
        assert!(
            matches!(&err, ConfigError::InvalidValue { key, .. } if key == "hostname"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn eventfd_wait_is_hidden_off_by_default_and_parses() {
    assert!(!Config::default().tuning.eventfd_wait);
    let c = Config::from_args(["--eventfd-wait", "on"]).unwrap();
    assert!(c.tuning.eventfd_wait);
    assert!(Config::from_args(["--eventfd-wait", "maybe"]).is_err());
    assert!(!keys::known_list().contains("eventfd-wait"));
}

#[test]
fn tls_keys_and_their_rules() {
    let base = ["--tls-cert", "/c.pem", "--tls-key", "/k.pem"];
    let with = |extra: &[&str]| Config::from_args(base.iter().chain(extra.iter()));
    let c = with(&["--memcache-tls", "127.0.0.1:0", "--tls-min-version", "1.3"]).unwrap();
    assert!(c.tls.enabled() && c.tls.min_tls13);
    assert_eq!(c.tls.cert.as_deref(), Some(std::path::Path::new("/c.pem")));
    // A TLS listener needs a certificate and key.
    let err = Config::from_args(["--https", "127.0.0.1:0"]).unwrap_err();
    assert!(
        err.to_string().contains("need tls-cert and tls-key"),
        "{err}"
    );
    // require without a CA.
    let err = with(&["--https", "127.0.0.1:0", "--tls-verify", "require"]).unwrap_err();
    assert!(err.to_string().contains("needs tls-ca"), "{err}");
    assert!(with(&["--tls-verify", "sometimes"]).is_err());
    assert!(with(&["--tls-min-version", "1.1"]).is_err());
    // tls-only refuses every plain listener, the default ones included.
    let err = with(&["--https", "127.0.0.1:0", "--tls-only", "on"]).unwrap_err();
    assert!(err.to_string().contains("memcache is on"), "{err}");
    let err = with(&[
        "--https",
        "127.0.0.1:0",
        "--tls-only",
        "on",
        "--memcache",
        "off",
        "--http",
        "off",
        "--udp",
        "127.0.0.1:0",
    ])
    .unwrap_err();
    assert!(err.to_string().contains("udp is on"), "{err}");
    let c = with(&[
        "--https",
        "127.0.0.1:0",
        "--tls-only",
        "on",
        "--memcache",
        "off",
        "--http",
        "off",
    ])
    .unwrap();
    assert!(c.tls.only && c.memcache.is_none());
    // The same keys in TOML.
    let c = Config::from_toml_str(
        "memcache-tls = \"127.0.0.1:0\"\ntls-cert = \"/c\"\ntls-key = \"/k\"\ntls-ca = \"/ca\"\ntls-verify = \"request\"\n",
    )
    .unwrap();
    assert_eq!(c.tls.verify, crate::TlsVerify::Request);
}

#[test]
fn sub_memory_needs_an_explicit_node_and_a_size_of_at_least_1mib() {
    assert_eq!(Config::default().sub_memory, SubMemory::Off);
    let c = Config::from_args(["--numa", "1", "--sub-memory", "32MiB"]).unwrap();
    assert_eq!(c.sub_memory, SubMemory::Bytes(32 << 20));
    assert!(!c.sub_memory_simulated);
    let err = Config::from_args(["--sub-memory", "32MiB"]).unwrap_err();
    assert!(matches!(err, ConfigError::Inconsistent(_)), "{err}");
    assert!(err.to_string().contains("--numa NODE"), "{err}");
    let err = Config::from_args(["--numa", "auto", "--sub_memory=1GiB"]).unwrap_err();
    assert!(matches!(err, ConfigError::Inconsistent(_)), "{err}");
    assert!(Config::from_args(["--numa", "0", "--sub-memory", "4KiB"]).is_err());
    let off = Config::from_args(["--sub-memory", "0"]).unwrap();
    assert_eq!(off.sub_memory, SubMemory::Off);
    let toml = Config::from_kernel_cmdline("ringstore.numa=1 ringstore.sub_memory=32MiB").unwrap();
    assert_eq!(toml.sub_memory, SubMemory::Bytes(32 << 20));
    let sim = Config::from_args([
        "--numa",
        "0",
        "--sub-memory",
        "8MiB",
        "--sub-memory-simulated",
        "on",
    ])
    .unwrap();
    assert!(sim.sub_memory_simulated);
    assert!(crate::keys::find("sub-memory-simulated").unwrap().hidden);
}

#[test]
fn sub_memory_auto_needs_an_explicit_node_and_a_later_size_replaces_it() {
    let c = Config::from_kernel_cmdline("ringstore.numa=1 ringstore.sub_memory=auto").unwrap();
    assert_eq!(
        c.sub_memory,
        SubMemory::Auto,
        "the appliance fills the size in"
    );
    assert_eq!(c.sub_memory.bytes(), 0);
    let err = Config::from_args(["--sub-memory", "AUTO"]).unwrap_err();
    assert!(err.to_string().contains("--numa NODE"), "{err}");
    let sized = Config::from_args([
        "--numa",
        "0",
        "--sub-memory",
        "auto",
        "--sub-memory",
        "8MiB",
    ])
    .unwrap();
    assert_eq!(sized.sub_memory, SubMemory::Bytes(8 << 20));
    assert_eq!(sized.sub_memory.bytes(), 8 << 20);
    assert!(Config::from_args(["--numa", "0", "--sub-memory", "automatic"]).is_err());
}

#[test]
fn io_runtime_is_auto_by_default_and_takes_the_three_names() {
    assert_eq!(Config::default().io, crate::IoRuntime::Auto);
    let c = Config::from_kernel_cmdline("ringstore.io=epoll").unwrap();
    assert_eq!(c.io, crate::IoRuntime::Epoll);
    let c = Config::from_toml_str("io = \"io_uring\"").unwrap();
    assert_eq!(c.io, crate::IoRuntime::IoUring);
    assert!(Config::from_toml_str("io = \"poll\"").is_err());
    assert!(Config::from_kernel_cmdline("ringstore.io=").is_err());
}

#[test]
fn latency_histograms_and_hotkeys_are_on_by_default_and_switch_off() {
    let d = Config::default();
    assert!(d.latency_histograms && d.hotkeys);
    let c = Config::from_args(["--latency-histograms", "off", "--hotkeys", "off"]).unwrap();
    assert!(!c.latency_histograms && !c.hotkeys);
    let c = Config::from_toml_str("latency-histograms = \"off\"\nhotkeys = \"on\"").unwrap();
    assert!(!c.latency_histograms && c.hotkeys);
    let c = Config::from_kernel_cmdline("ringstore.hotkeys=off").unwrap();
    assert!(c.latency_histograms && !c.hotkeys);
    assert!(Config::from_args(["--hotkeys", "sometimes"]).is_err());
    assert_eq!(d.hotkeys_sample, crate::HOTKEYS_SAMPLE_DEFAULT);
    let c = Config::from_args(["--hotkeys-sample", "1"]).unwrap();
    assert_eq!(c.hotkeys_sample, 1);
    let c = Config::from_kernel_cmdline("ringstore.hotkeys_sample=65536").unwrap();
    assert_eq!(c.hotkeys_sample, crate::HOTKEYS_SAMPLE_MAX);
    for bad in ["0", "65537", "-1", "4294967297", "1k", ""] {
        assert!(
            Config::from_args(["--hotkeys-sample", bad]).is_err(),
            "{bad}"
        );
    }
    for key in ["latency-histograms", "hotkeys", "hotkeys-sample"] {
        assert!(
            !crate::keys::find(key).unwrap().hidden,
            "{key} is documented"
        );
        let shown = crate::origin::resolve(&[]).unwrap().settings;
        let default = shown.iter().find(|s| s.key == key).unwrap();
        let expect = if key == "hotkeys-sample" { "128" } else { "on" };
        assert_eq!(default.value, expect, "the console shows {key}'s default");
    }
}
