//! Project automation entry point: `cargo xtask test|run|image|pxe|keygen|bench|...`
//! (the commands and their flags: cli.rs).
//!
//! One command per thing a developer or CI does; each installs what it needs on a fresh
//! Debian/Ubuntu machine (apt when root, otherwise it prints the command).

// `unsafe` only where the load generator pushes io_uring SQEs (bench/loadgen.rs): the buffers
// they point into outlive the operations, which only that code can show. The rest calls the
// kernel through ringstore-sys and rustix.
#![deny(unsafe_code)]

mod bench;
mod cli;
mod deps;
mod disk;
mod image;
mod initramfs;
mod inventory;
mod kernel;
mod keygen;
mod keyscan;
mod layering;
mod oci;
mod pxe;
mod qemu;
#[cfg(test)]
mod reference;
mod run;
mod scaleout;
mod test;
mod uki;
mod util;
mod vm_tests;

use anyhow::Result;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{}", cli::usage());
        std::process::exit(2);
    };
    match command.as_str() {
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        // The bench's floor server, started by `cargo xtask bench` (bench/floor.rs).
        "bench-floor" => bench::floor::main(rest),
        "image" => image::run(rest),
        "oci" => oci::run(rest),
        "run" => run::run(rest),
        "pxe" => pxe::run(rest),
        "scaleout" => scaleout::run(rest),
        "vm-test" => vm_tests::run(rest),
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
