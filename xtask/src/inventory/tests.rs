//! Tests of the inventory parser: good files and every kind of bad input it refuses.

use super::*;

const TWO: &str = r#"
[boot]
cmdline = "console=ttyS0 panic=-1"

[defaults]
memory = "64MiB"
ringstore = { idle-timeout = 60 }

[[host]]
mac = "52:54:00:AA:bb:01"
hostname = "cache-a"
ip = "10.0.2.15::10.0.2.2:255.255.255.0:cache-a:eth0:off"
memory = "48MiB"
cores = 1

[[host]]
mac = "52-54-00-aa-bb-02"
hostname = "cache-b"
data = "/dev/vda"
ringstore = { udp = "0.0.0.0:11211", memcache = "0.0.0.0:11311" }
"#;

fn err(text: &str) -> InventoryError {
    Inventory::parse(text).expect_err("refused")
}

fn one(host: &str) -> String {
    format!("[[host]]\nmac = \"52:54:00:00:00:01\"\nhostname = \"h1\"\n{host}\n")
}

#[test]
fn a_good_inventory_gives_each_host_its_line() {
    let inv = Inventory::parse(TWO).unwrap();
    assert_eq!(inv.boot_args, ["console=ttyS0", "panic=-1"]);
    let [a, b] = &inv.hosts[..] else {
        panic!("two hosts")
    };
    assert_eq!(a.mac.to_string(), "52:54:00:aa:bb:01");
    assert_eq!(b.mac.hexhyp(), "52-54-00-aa-bb-02");
    assert_eq!(
        a.kernel_args(),
        "ip=10.0.2.15::10.0.2.2:255.255.255.0:cache-a:eth0:off ringstore.cores=1 ringstore.hostname=cache-a ringstore.idle-timeout=60 ringstore.memory=48MiB"
    );
    assert_eq!(a.config.memory, 48 << 20);
    assert_eq!(a.config.cores, 1);
    assert_eq!(
        b.kernel_args(),
        "ip=dhcp ringstore.data=/dev/vda ringstore.hostname=cache-b ringstore.idle-timeout=60 ringstore.memcache=0.0.0.0:11311 ringstore.memory=64MiB ringstore.udp=0.0.0.0:11211"
    );
    assert_eq!(b.config.memory, 64 << 20, "the default applies");
    assert_eq!(a.memcache_addr(), Some("10.0.2.15:11211".parse().unwrap()));
    assert_eq!(
        b.memcache_addr(),
        None,
        "DHCP and a wildcard: no fixed address"
    );
    assert!(matches!(
        inv.memcache_servers().unwrap_err(),
        InventoryError::NoAddress { host } if host == "host 2 (cache-b)"
    ));
}

#[test]
fn macs_are_six_unicast_hex_pairs() {
    for good in [
        "52:54:00:12:34:56",
        "02-00-00-00-00-01",
        "AA:BB:CC:DD:EE:FE",
    ] {
        assert!(Mac::parse(good).is_some(), "{good}");
    }
    for bad in [
        "52:54:00:12:34",
        "52:54:00:12:34:56:78",
        "52:54:00:12:34:5g",
        "52:54:00:12:34:567",
        "52:54-00:12:34:56",
        "01:00:5e:00:00:01",
        "00:00:00:00:00:00",
        "",
        "5254.0012.3456",
    ] {
        assert!(Mac::parse(bad).is_none(), "{bad}");
    }
    assert!(matches!(
        err(&one("").replace("52:54:00:00:00:01", "ff:ff:ff:ff:ff:ff")),
        InventoryError::BadMac { .. }
    ));
}

#[test]
fn duplicates_are_refused() {
    let twice = format!("{}{}", one(""), one("").replace("h1", "h2"));
    match err(&twice) {
        InventoryError::DuplicateMac { mac, first, second } => {
            assert_eq!(mac.to_string(), "52:54:00:00:00:01");
            assert_eq!(
                (first.as_str(), second.as_str()),
                ("host 1 (h1)", "host 2 (h2)")
            );
        }
        other => panic!("{other}"),
    }
    // The same MAC spelled differently is still the same MAC.
    let spelled = format!(
        "{}{}",
        one(""),
        one("")
            .replace("h1", "h2")
            .replace("52:54:00:00:00:01", "52-54-00-00-00-01")
    );
    assert!(matches!(err(&spelled), InventoryError::DuplicateMac { .. }));
    let names = format!("{}{}", one(""), one("").replace(":01", ":02"));
    assert!(matches!(
        err(&names),
        InventoryError::DuplicateHostname { .. }
    ));
    let static_addr = "ip = \"10.0.0.5::10.0.0.1:255.255.255.0::eth0:off\"";
    let same_addr = format!(
        "{}{}",
        one(static_addr),
        one(static_addr).replace(":01", ":02").replace("h1", "h2")
    );
    let inv = Inventory::parse(&same_addr).unwrap();
    assert!(matches!(
        inv.memcache_servers().unwrap_err(),
        InventoryError::DuplicateAddress { .. }
    ));
}

#[test]
fn unknown_keys_are_refused_at_every_level() {
    assert!(
        matches!(err(&one("colour = \"red\"")), InventoryError::Toml(m) if m.contains("colour"))
    );
    assert!(matches!(
        err(&format!("[defaults]\nnope = 1\n{}", one(""))),
        InventoryError::Toml(_)
    ));
    assert!(matches!(
        err(&format!("[boot]\nkernel = \"x\"\n{}", one(""))),
        InventoryError::Toml(_)
    ));
    assert!(matches!(err("[other]\n"), InventoryError::Toml(_)));
    match err(&one("ringstore = { memroy = \"1GiB\" }")) {
        InventoryError::UnknownKey { host, key, known } => {
            assert_eq!((host.as_str(), key.as_str()), ("host 1 (h1)", "memroy"));
            assert!(known.contains("memory"));
        }
        other => panic!("{other}"),
    }
    assert!(matches!(err(""), InventoryError::NoHosts));
    for (text, field) in [
        ("[[host]]\nhostname = \"h1\"\n", "missing field `mac`"),
        (
            "[[host]]\nmac = \"52:54:00:00:00:01\"\n",
            "missing field `hostname`",
        ),
        (
            "[[host]]\nmac = 5\nhostname = \"h1\"\n",
            "mac = 5: expected a string",
        ),
    ] {
        assert!(
            matches!(err(text), InventoryError::Toml(m) if m.contains(field)),
            "{text}"
        );
    }
}

#[test]
fn bad_values_name_the_host_and_key() {
    match err(&one("memory = \"lots\"")) {
        InventoryError::Config { host, source } => {
            assert_eq!(host, "host 1 (h1)");
            assert!(source.to_string().contains("memory"), "{source}");
        }
        other => panic!("{other}"),
    }
    assert!(matches!(
        err(&one("cores = 5000")),
        InventoryError::Config { .. }
    ));
    assert!(matches!(
        err(&one("ip = \"10.0.0.300::::::off\"")),
        InventoryError::Ip { .. }
    ));
    assert!(matches!(
        err(&one("ip = \"10.0.0.3::::other::off\"")),
        InventoryError::IpHostname { .. }
    ));
    assert!(matches!(
        err(&one("cores = 1.5")),
        InventoryError::BadType { .. }
    ));
    assert!(matches!(
        err(&one("").replace("\"h1\"", "\"bad_name\"")),
        InventoryError::BadHostname { .. }
    ));
    assert!(matches!(
        err(&one("ringstore = { hostname = \"other\" }")),
        InventoryError::DuplicateKey { .. }
    ));
    assert!(matches!(
        err(&one("memory = \"1GiB\"\nringstore = { memory = \"2GiB\" }")),
        InventoryError::DuplicateKey { .. }
    ));
    assert!(matches!(
        err(&one("ringstore = { data-format = \"force\" }")),
        InventoryError::ForceFormat { .. }
    ));
}

#[test]
fn values_cannot_split_a_kernel_argument_or_expand_in_ipxe() {
    for bad in [
        "/dev/vda ringstore.data-format=force",
        "/dev/${net0/ip}",
        "/dev/vda\nboot",
        "\"/dev/vda\"",
        "/dev/vda;",
        "",
    ] {
        let text = one(&format!("data = {bad:?}"));
        assert!(
            matches!(err(&text), InventoryError::Unsafe { ref key, .. } if key == "data"),
            "{bad:?}"
        );
    }
    for bad in [
        "ip=dhcp",
        "ringstore.memory=1GiB",
        "initrd=x",
        "a${x}",
        "q\"uote",
    ] {
        let text = format!("[boot]\ncmdline = {bad:?}\n{}", one(""));
        assert!(
            matches!(err(&text), InventoryError::BootToken { .. }),
            "{bad:?}"
        );
    }
}

#[test]
fn size_and_host_count_limits_hold() {
    let big = format!(
        "{}# {}\n",
        one(""),
        "x".repeat(usize::try_from(INVENTORY_MAX).unwrap())
    );
    assert!(matches!(err(&big), InventoryError::TooLarge));
    let mut many = String::new();
    for i in 0..=HOSTS_MAX {
        many.push_str(&format!(
            "[[host]]\nmac = \"02:00:00:00:{:02x}:{:02x}\"\nhostname = \"h{i}\"\n",
            i >> 8,
            i & 0xff
        ));
    }
    assert!(matches!(err(&many), InventoryError::TooManyHosts(n) if n == HOSTS_MAX + 1));
    let dir = std::env::temp_dir().join(format!("inventory-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("big.toml");
    std::fs::write(&path, &big).unwrap();
    assert!(matches!(
        Inventory::load(&path),
        Err(InventoryError::TooLarge)
    ));
    std::fs::write(&path, TWO).unwrap();
    assert_eq!(Inventory::load(&path).unwrap().hosts.len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn options_need_an_inventory() {
    let mut secrets = crate::image::BootOptions::new();
    assert!(inventory_args(&[], "pxe", "x", &mut secrets).is_err());
    assert!(inventory_args(&["--bogus".into()], "pxe", "x", &mut secrets).is_err());
    let (inv, out) = inventory_args(
        &[
            "--inventory".into(),
            "i.toml".into(),
            "--out".into(),
            "/tmp/o".into(),
        ],
        "pxe",
        "x",
        &mut secrets,
    )
    .unwrap();
    assert_eq!(
        (inv, out),
        (PathBuf::from("i.toml"), PathBuf::from("/tmp/o"))
    );
}
