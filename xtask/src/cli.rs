//! The one table of xtask's commands and their flags: clap parses every command's arguments
//! from it ([`parse`]) and writes the help (`cargo xtask help`, `--help`, errors), and a test
//! holds docs/REFERENCE.md to it.

use anyhow::Result;

/// One flag: `--name VALUE` (or a switch without `value`) and what it does.
pub struct Flag {
    pub name: &'static str,
    pub value: Option<&'static str>,
    pub help: &'static str,
}

/// One `cargo xtask` command.
pub struct Command {
    pub name: &'static str,
    /// Positional arguments after the flags (`NAME...`, `OUT`), if the command takes any.
    pub positional: Option<&'static str>,
    pub summary: &'static str,
    pub flags: &'static [Flag],
}

const fn flag(name: &'static str, value: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        value: Some(value),
        help,
    }
}

const fn switch(name: &'static str, help: &'static str) -> Flag {
    Flag {
        name,
        value: None,
        help,
    }
}

const AUTHORIZED_KEYS: Flag = flag(
    "--authorized-keys",
    "FILE",
    "the console's SSH keys (OpenSSH authorized_keys) in the initramfs",
);
const CONSOLE_PASSWORD_HASH: Flag = flag(
    "--console-password-hash",
    "FILE",
    "the console password's argon2id PHC string (e.g. from `argon2 SALT -id -e`)",
);
const SIGNING_KEY: Flag = flag(
    "--signing-key",
    "FILE",
    "the update signing key (64 hex digits, `cargo xtask keygen`); its public half goes in",
);
const TEST_KEYS: Flag = switch(
    "--test-keys",
    "TEST ONLY: authorize tests/keys/test_ed25519.pub and sign with image/test-signing-key.hex",
);
const INVENTORY: Flag = flag("--inventory", "FILE", "the fleet inventory (TOML)");

/// Every command, in the order `help` lists them.
pub const COMMANDS: &[Command] = &[
    Command {
        name: "test",
        positional: None,
        summary: "every test: lint, unit, property, fuzz smoke, memccapable, end-to-end, artifact scan, QEMU",
        flags: &[
            switch("--quick", "lint and unit tests only"),
            switch("--skip-vm", "everything but the QEMU tests"),
        ],
    },
    Command {
        name: "bench",
        positional: Some("[FLAGS]"),
        summary: "ringstore vs memcached (and nginx for HTTP), side by side; writes target/bench/ (the bench crate, tests/bench: its flags with --help)",
        flags: &[],
    },
    Command {
        name: "image",
        positional: None,
        summary: "build target/appliance/{bzImage,initramfs.img,ringstore.efi,disk.img}",
        flags: &[
            AUTHORIZED_KEYS,
            flag(
                "--config-authorized-keys",
                "FILE",
                "more console keys, in disk.img's config partition",
            ),
            CONSOLE_PASSWORD_HASH,
            SIGNING_KEY,
            switch(
                "--test-keys",
                "TEST ONLY: authorize tests/keys/test_ed25519.pub, sign updates with image/test-signing-key.hex and, without --secure-boot-key, Secure Boot with Debian's snakeoil key",
            ),
            flag(
                "--secure-boot-key",
                "FILE",
                "the db key (PEM) that signs systemd-boot and ringstore.efi for Secure Boot (`cargo xtask keygen --secure-boot`)",
            ),
            flag(
                "--secure-boot-cert",
                "FILE",
                "its certificate (PEM), the one enrolled in the firmware's db",
            ),
            flag("--size", "SIZE", "disk.img's size (256M, 2G)"),
            flag("--seed", "TEXT", "every GUID and FAT volume id derives from it"),
            flag("--append", "ARGS", "appended to ringstore.efi's kernel command line"),
            flag("--out", "DIR", "write everything here instead of target/appliance"),
        ],
    },
    Command {
        name: "oci",
        positional: None,
        summary: "the container image: target/oci/ringstore.tar (OCI archive, reproducible; podman load -i) and seccomp-allow-io_uring.json beside it",
        flags: &[switch(
            "--check",
            "then load and run it with podman as `cargo xtask test` does (docs/CONTAINER.md's commands too)",
        )],
    },
    Command {
        name: "run",
        positional: None,
        summary: "build everything and boot the appliance in QEMU; prints how to log in",
        flags: &[
            flag("--profile", "NAME", "qemu/profiles/NAME.toml (default numa2)"),
            flag("--append", "ARGS", "more kernel arguments"),
            flag("--disk", "FILE", "a data disk file (repeatable)"),
            flag(
                "--authorized-keys",
                "FILE",
                "log in with your own key instead of the test key",
            ),
        ],
    },
    Command {
        name: "pxe",
        positional: None,
        summary: "build the image, write the PXE bundle (target/appliance/pxe) and its scaleout/ files",
        flags: &[
            INVENTORY,
            flag("--out", "DIR", "the bundle's folder (default target/appliance/pxe)"),
            AUTHORIZED_KEYS,
            CONSOLE_PASSWORD_HASH,
            SIGNING_KEY,
            TEST_KEYS,
        ],
    },
    Command {
        name: "scaleout",
        positional: None,
        summary: "write only the twemproxy pool and the client server list",
        flags: &[
            INVENTORY,
            flag("--out", "DIR", "default target/appliance/scaleout"),
        ],
    },
    Command {
        name: "keygen",
        positional: Some("OUT"),
        summary: "write a new update signing key to OUT (mode 0600), print its public half",
        flags: &[flag(
            "--secure-boot",
            "DIR",
            "instead: a Secure Boot PK/KEK/db key set and the signed EFI signature lists to enroll, in DIR (new)",
        )],
    },
    Command {
        name: "vm-test",
        positional: Some("NAME..."),
        summary: "the QEMU tests whose names contain NAME (all without one)",
        flags: &[switch("--help", "list the QEMU tests by name")],
    },
];

/// The command named `name` (a programming error if it is not in the table).
pub fn command(name: &str) -> &'static Command {
    COMMANDS
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no command {name:?} in cli::COMMANDS"))
}

impl Command {
    /// The clap command of this table row; a repeated flag keeps every value.
    fn clap(&self) -> clap::Command {
        let mut cmd = clap::Command::new(self.name)
            .bin_name(format!("cargo xtask {}", self.name))
            .about(self.summary)
            .disable_version_flag(true);
        if self.flags.iter().any(|f| f.name == "--help") {
            // vm-test's own `--help` lists the tests.
            cmd = cmd.disable_help_flag(true);
        }
        for f in self.flags {
            let arg = clap::Arg::new(f.name)
                .long(f.name.trim_start_matches("--"))
                .help(f.help);
            cmd = cmd.arg(match f.value {
                Some(v) => arg.value_name(v).action(clap::ArgAction::Append),
                None => arg.action(clap::ArgAction::SetTrue),
            });
        }
        if let Some(p) = self.positional {
            // `NAME...`: any number; `OUT`: at most one; `[FLAGS]`: the rest, as given.
            let many = p.ends_with("...") || p == "[FLAGS]";
            cmd = cmd.arg(
                clap::Arg::new("positional")
                    .value_name(p.trim_matches(['[', ']', '.']))
                    .num_args(if many { 0..usize::MAX } else { 0..2 })
                    .allow_hyphen_values(p == "[FLAGS]")
                    .trailing_var_arg(p == "[FLAGS]"),
            );
        }
        cmd
    }

    /// The command's own help, as clap writes it.
    pub fn help(&self) -> String {
        self.clap().render_help().to_string()
    }
}

/// `cargo xtask help`: every command's help.
pub fn usage() -> String {
    let mut s = String::from("usage: cargo xtask <command> [flags]\n");
    for c in COMMANDS {
        s.push_str(&format!("\ncargo xtask {}: {}", c.name, c.help()));
    }
    s
}

/// Flags given to a command: the table's name and its value (switches have none), in table
/// order, every occurrence of a repeated flag.
pub struct Parsed {
    pub flags: Vec<(&'static str, Option<String>)>,
    pub positional: Vec<String>,
}

/// Parses `args` by `command`'s flag table with clap; an unknown flag or a missing value is an
/// error with the command's help. `--help` prints it and exits.
pub fn parse(command: &str, args: &[String]) -> Result<Parsed> {
    let cmd = self::command(command);
    let name = format!("cargo xtask {command}");
    let matches = match cmd
        .clap()
        .try_get_matches_from(std::iter::once(&name).chain(args))
    {
        Ok(m) => m,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.exit(),
        Err(e) => anyhow::bail!("{}", e.render().to_string().trim_start_matches("error: ")),
    };
    let mut out = Parsed {
        flags: Vec::new(),
        positional: match cmd.positional {
            Some(_) => matches
                .get_many::<String>("positional")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
            None => Vec::new(),
        },
    };
    for f in cmd.flags {
        if f.value.is_some() {
            for v in matches.get_many::<String>(f.name).into_iter().flatten() {
                out.flags.push((f.name, Some(v.clone())));
            }
        } else if matches.get_flag(f.name) {
            out.flags.push((f.name, None));
        }
    }
    Ok(out)
}

/// The error for a flag in the table that its command's parser does not handle.
pub fn unhandled(command: &str, flag: &str) -> anyhow::Error {
    anyhow::anyhow!("{command}: flag {flag} is in cli::COMMANDS but not handled")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The page that lists every command and flag.
    const REFERENCE: &str = "docs/REFERENCE.md";

    /// Every `--flag` `page` names on a line about `cargo xtask CMD`, by command; `bench`'s
    /// are the bench crate's (tests/bench holds the pages to them).
    fn documented_flags(page: &str) -> BTreeSet<(String, String)> {
        let text = std::fs::read_to_string(crate::util::root().join(page)).unwrap();
        let mut found = crate::util::docs::documented_flags(&text);
        found.retain(|(command, _)| command != "bench");
        found
    }

    /// docs/REFERENCE.md lists every xtask flag; it and the README name no flag xtask lacks.
    #[test]
    fn every_flag_the_docs_name_exists_and_every_flag_is_in_the_reference() {
        let documented = documented_flags(REFERENCE);
        let readme = documented_flags("README.md");
        let unknown: Vec<_> = readme.iter().filter(|f| !documented.contains(f)).collect();
        assert!(
            unknown.is_empty(),
            "README.md names flags {REFERENCE} lacks: {unknown:?}"
        );
        let table: BTreeSet<(String, String)> = COMMANDS
            .iter()
            .flat_map(|c| {
                c.flags
                    .iter()
                    .map(|f| (c.name.to_string(), f.name.to_string()))
            })
            .collect();
        let unknown: Vec<_> = documented.difference(&table).collect();
        assert!(
            unknown.is_empty(),
            "{REFERENCE} names flags xtask lacks: {unknown:?}"
        );
        let undocumented: Vec<_> = table.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "flags {REFERENCE} does not document (on a `cargo xtask CMD` line): {undocumented:?}"
        );
        for c in COMMANDS {
            assert!(
                documented.iter().any(|(n, _)| n == c.name) || c.flags.is_empty(),
                "{}",
                c.name
            );
        }
    }

    /// A value each flag's parser accepts.
    fn sample(value: &str) -> &'static str {
        match value {
            "SIZE" => "1G",
            "N" => "5",
            "PART" => "memcache",
            "LIST" => "get-100-1",
            _ => "x",
        }
    }

    #[test]
    fn every_flag_in_the_table_is_handled_by_its_parser() {
        for c in COMMANDS {
            for f in c.flags {
                let mut args = vec![f.name.to_string()];
                args.extend(f.value.map(|v| sample(v).to_string()));
                let outcome = match c.name {
                    "image" => crate::image::BootOptions::parse(&args).map(|_| ()),
                    "pxe" | "scaleout" => {
                        args.extend(["--inventory".to_string(), "i.toml".to_string()]);
                        let mut secrets = crate::image::BootOptions::new();
                        crate::inventory::inventory_args(&args, c.name, "x", &mut secrets)
                            .map(|_| ())
                    }
                    "run" => crate::run::RunOptions::parse(&args).map(|_| ()),
                    "test" => crate::test::parse_options(&args).map(|_| ()),
                    "oci" => crate::oci::parse_options(&args).map(|_| ()),
                    "keygen" => crate::keygen::parse(&args).map(|_| ()),
                    // Only `--help`, which lists the tests and builds nothing.
                    "vm-test" => crate::vm_test::run(&args),
                    other => panic!("no parser check for {other}"),
                };
                if let Err(err) = outcome {
                    assert!(
                        !err.to_string().contains("not handled"),
                        "{} {}: {err}",
                        c.name,
                        f.name
                    );
                }
            }
        }
    }

    #[test]
    fn help_lists_every_flag() {
        let help = usage();
        for c in COMMANDS {
            for f in c.flags {
                assert!(help.contains(f.name), "{} {}", c.name, f.name);
            }
            assert!(help.contains(&format!("cargo xtask {}", c.name)));
        }
    }

    #[test]
    fn parse_takes_table_flags_and_refuses_others() {
        let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let p = parse("image", &args(&["--test-keys", "--out", "d"])).unwrap();
        assert_eq!(
            p.flags,
            [("--test-keys", None), ("--out", Some("d".to_string()))]
        );
        assert!(parse("image", &args(&["--out"])).is_err());
        assert!(parse("image", &args(&["--nope"])).is_err());
        assert!(parse("image", &args(&["stray"])).is_err());
        let p = parse("keygen", &args(&["k.hex"])).unwrap();
        assert_eq!(p.positional, ["k.hex"]);
        assert_eq!(
            crate::keygen::parse(&args(&["--secure-boot", "sb"])).unwrap(),
            crate::keygen::Keygen::SecureBoot("sb".into())
        );
        assert!(crate::keygen::parse(&args(&["--secure-boot", "sb", "k.hex"])).is_err());
    }
}
