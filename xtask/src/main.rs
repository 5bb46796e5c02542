//! Project automation entry point: `cargo xtask test|run|image|pxe|keygen|bench|...`
//! (the commands and their flags: cli.rs).
//!
//! One command per thing a developer or CI does; each installs what it needs on a fresh
//! Debian/Ubuntu machine (apt when root, otherwise it prints the command).

// The kernel is called through rustix.
#![forbid(unsafe_code)]

mod cli;
mod deps;
mod disk;
mod image;
mod image_secure_boot;
mod initramfs;
mod inventory;
mod kernel;
mod keygen;
mod keygen_secure_boot;
mod keyscan;
mod layering;
mod oci;
mod pxe;
#[cfg(test)]
mod reference;
mod run;
mod scaleout;
mod test;
mod uki;
mod vm_test;

// Running commands, the workspace root, a server child: shared with the benchmarks.
use ringstore_testkit as util;

use anyhow::Result;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{}", cli::usage());
        std::process::exit(2);
    };
    match command.as_str() {
        "test" => test::run(rest),
        "bench" => bench(rest),
        "image" => image::run(rest),
        "oci" => oci::run(rest),
        "run" => run::run(rest),
        "pxe" => pxe::run(rest),
        "scaleout" => scaleout::run(rest),
        "vm-test" => vm_test::run(rest),
        "keygen" => keygen::run(rest),
        "help" | "--help" | "-h" => {
            print!("{}", cli::usage());
            Ok(())
        }
        other => {
            eprint!("unknown command {other:?}\n\n{}", cli::usage());
            std::process::exit(2);
        }
    }
}

/// `cargo xtask bench ARGS`: the packages the benchmark needs, then the bench crate's binary
/// (tests/bench) with the same arguments.
fn bench(args: &[String]) -> Result<()> {
    if !args.iter().any(|a| a == "-h" || a == "--help") {
        deps::apt()?;
    }
    let mut cmd = util::cargo();
    cmd.args(["run", "--quiet", "-p", "ringstore-bench", "--"])
        .args(args);
    util::exec(&mut cmd)
}
