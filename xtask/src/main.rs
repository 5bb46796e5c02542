//! Project automation entry point: `cargo xtask test|run|image|bench`.
//!
//! One command per thing a developer or CI does; each installs what it needs on a fresh
//! Debian/Ubuntu machine (apt when root, otherwise it prints the command).

// `unsafe` only where the load generator pushes io_uring SQEs (bench/loadgen.rs): the buffers
// they point into outlive the operations, which only that code can show. The rest calls the
// kernel through ringstore-sys and rustix.
#![deny(unsafe_code)]

mod bench;
mod deps;
mod disk;
mod image;
mod initramfs;
mod inventory;
mod kernel;
mod pxe;
mod qemu;
mod scaleout;
mod test;
mod uki;
mod util;
mod vm_tests;

use anyhow::Result;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test [--quick] [--skip-vm]   every test: lint, unit, property, fuzz smoke, memccapable, end-to-end, QEMU
  bench [--seconds N]          ringstore vs memcached (and nginx for HTTP), side by side; writes target/bench/
  image [--authorized-keys F] [--size SIZE] [--signing-key FILE] [--seed TEXT] [--append ARGS] [--out DIR]
                               F: the console's SSH keys
                               build target/appliance/{bzImage,initramfs.img,ringstore.efi,disk.img}
  run                          build everything and boot the appliance in QEMU (numa2 profile)
  pxe --inventory FILE [--out DIR]
                               build the image, write the PXE bundle (target/appliance/pxe: kernel,
                               initramfs, boot.ipxe, one script per host) and its scaleout/ files
  scaleout --inventory FILE [--out DIR]
                               write only the twemproxy pool and the client server list
                               (target/appliance/scaleout)
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        std::process::exit(2);
    };
    match command.as_str() {
        "test" => test::run(rest),
        "bench" => bench::run(rest),
        // The bench's floor server, started by `cargo xtask bench` (bench/floor.rs).
        "bench-floor" => bench::floor::main(rest),
        "image" => image::run(rest),
        "run" => qemu::run(rest),
        "pxe" => pxe::run(rest),
        "scaleout" => scaleout::run(rest),
        "vm-test" => vm_tests::run(rest),
        "help" | "--help" | "-h" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            eprint!("unknown command {other:?}\n\n{USAGE}");
            std::process::exit(2);
        }
    }
}
