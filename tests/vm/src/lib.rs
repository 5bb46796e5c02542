//! QEMU tests that boot the real image and talk to it through the serial console (a unix
//! socket) and the forwarded data ports. Every wait is bounded; the kernel runs with panic=-1
//! and QEMU with -no-reboot, so a kernel panic ends QEMU and fails the test that waits.
//!
//! `cargo xtask vm-test [NAME]` builds the test image and calls [`run`] with it and the
//! [`Builder`] for the variants a test needs (ADR 0041). A new test is a file in this folder
//! (a `mod` line below) with a `fn(&Image) -> Result<…>`, registered by one entry in
//! [`tests`] (the order they run); it drives the box with `Vm` (vm.rs) and `client.rs`.

// The kernel is called through rustix.
#![forbid(unsafe_code)]

mod auth;
mod client;
mod console;
mod devrun;
mod drain;
mod durable;
mod first_boot;
mod full_box;
mod hardware;
pub mod image;
mod kernel_panic;
mod kexec;
mod ktls_reset;
mod metrics;
mod netns;
mod numa2;
mod numa_sub;
mod operator;
mod portscan;
mod pxe;
pub mod qemu;
mod runbook;
mod scan;
mod secure_boot;
mod serial;
mod tls;
mod tls12;
mod tls_client;
mod tpm;
mod twonic;
mod uefi;
mod vm;
mod xdp;
mod zipf;

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

pub use devrun::LOGIN_HINT;
pub use image::{BootImage, BootRequest, Builder, Image, PxeHost};
// Running commands, the workspace root, a server child: shared with xtask and the benchmarks.
use ringstore_testkit as util;

use kernel_panic::kernel_panic_fails_the_wait;
use numa2::numa2_serves;
use numa_sub::sub_memory_keeps_more_and_promotes_hot as numa_sub_test;
use scan::scan_finds_only_data_ports;
use twonic::{twonic_refuses_without_numa, twonic_serves_with_numa1};

/// Boot to the ready line under TCG on a loaded 2-core machine.
const BOOT_LIMIT: Duration = Duration::from_secs(180);
const COMMAND_LIMIT: Duration = Duration::from_secs(20);
/// The console's prompt, printed after every command's output.
const PROMPT: &str = "ringstore> ";

type TestFn = fn(&Image) -> Result<String>;

/// Every QEMU test by name.
#[expect(
    clippy::too_many_lines,
    reason = "the list of every QEMU test, one entry each, in the order they run"
)]
pub fn tests() -> Vec<(&'static str, TestFn)> {
    vec![
        // Builds (not boots) the default image and PXE bundle: first, so a leak fails fast.
        ("default_artifacts_carry_no_test_key", |_| {
            image::builder()?.default_artifacts_carry_no_test_secret()
        }),
        (
            "xtask_run_prints_a_working_login",
            devrun::xtask_run_prints_a_working_login,
        ),
        ("numa2_serves", |i| {
            numa2_serves(i).map(|r| format!(
                "/init at {:?} s, ready at {:?} s kernel time ({:.1} s after QEMU started), poweroff in {:.1} s",
                r.init_secs,
                r.ready_secs,
                r.ready_wall.as_secs_f64(),
                r.poweroff.as_secs_f64()
            ))
        }),
        ("numa2_sub_memory", numa_sub_test),
        (
            "prometheus_scrapes_the_appliance",
            metrics::prometheus_scrapes_the_appliance,
        ),
        ("console_login_and_json", operator::console_login_and_json),
        (
            "tuning_names_each_difference",
            operator::tuning_names_each_difference,
        ),
        ("scan_finds_only_data_ports", |i| {
            scan_finds_only_data_ports(i).map(|r| {
                format!(
                    "IPv4 open {:?} (65535 ports in {:.1} s), {} open {:?} (in {:.1} s)",
                    r.open,
                    r.scan.as_secs_f64(),
                    r.link_local,
                    r.open_v6,
                    r.scan_v6.as_secs_f64()
                )
            })
        }),
        ("twonic_refuses_without_numa", |i| {
            twonic_refuses_without_numa(i).map(|()| String::new())
        }),
        ("twonic_serves_with_numa1", |i| {
            twonic_serves_with_numa1(i).map(|()| String::new())
        }),
        ("kernel_panic_fails_the_wait", |i| {
            kernel_panic_fails_the_wait(i).map(|()| String::new())
        }),
        ("durable_writes_survive_power_cut", |i| {
            durable::acknowledged_writes_survive_power_cut_and_poweroff(i).map(|r| format!(
                "{} sets acknowledged in {:.1} s before the cut, {} live keys checked after the third boot; [{}] [{}] [{}]",
                r.acked_before_cut,
                r.load.as_secs_f64(),
                r.live_keys,
                r.scan_line,
                r.checkpoint_line,
                r.from_checkpoint_line
            ))
        }),
        ("foreign_data_device_is_refused", |i| {
            durable::foreign_data_device_is_refused(i)
        }),
        ("failed_disk_write_fails_only_its_requests", |i| {
            durable::failed_disk_write_fails_only_its_requests(i)
        }),
        ("large_object_survives_poweroff_and_power_cut", |i| {
            durable::large_object_survives_poweroff_and_power_cut(i)
        }),
        (
            "server_hw_serves_through_igb_from_a_sas_disk",
            hardware::serves_through_igb_from_a_sas_disk,
        ),
        ("pxe_boots_each_host_from_its_mac", |i| {
            pxe::pxe_boots_each_host_from_its_mac(i).map(|r| {
                let ready: Vec<String> = r
                    .ready
                    .iter()
                    .map(|(name, secs)| format!("{name} ready {secs:.1} s after QEMU started"))
                    .collect();
                ready.join(", ")
            })
        }),
        ("xdp_serves_udp_on_virtio_mq", |i| {
            xdp::xdp_serves_udp_on_virtio_mq(i).map(|r| {
                format!(
                    "{:?}; UDP get round trip {:.1} ms; open TCP ports {:?}",
                    r.xdp_lines,
                    r.udp_round_trip.as_secs_f64() * 1e3,
                    r.open
                )
            })
        }),
        (
            "tls_kernel_offload_and_rotation",
            tls::serves_tls_with_kernel_offload_and_rotates,
        ),
        ("uefi_updates_commit_roll_back_and_refuse", |i| {
            uefi::updates_commit_roll_back_and_refuse(i).map(|r| {
                format!(
                    "[{}] [{}] full box: {}",
                    r.commit_line.trim(),
                    r.rollback_line.trim(),
                    r.filled
                )
            })
        }),
        ("kexec_reboot_keeps_the_ram_tier", |i| {
            kexec::kexec_reboot_keeps_the_ram_tier(i).map(|r| {
                let secs: Vec<String> = r
                    .outages
                    .iter()
                    .map(|d| format!("{:.2} s", d.as_secs_f64()))
                    .collect();
                let (before, after) = r.zipf;
                format!(
                    "outage reboot, update [{}] ({}), keys kept {:?} of 20000 (reboot, update, failed trial); zipf hit ratio 60 s before/after the update {:.2} %/{:.2} % ({}/{} lookups); [{}] [{}]",
                    secs.join(", "),
                    r.steps.join("; "),
                    r.kept,
                    before.ratio(),
                    after.ratio(),
                    before.lookups(),
                    after.lookups(),
                    r.cold_line,
                    r.layout_line
                )
            })
        }),
        ("runbook_rotates_signing_key_and_replaces_data_disk", |i| {
            runbook::rotate_signing_key_and_replace_data_disk(i).map(|r| {
                format!(
                    "[{}] [{}] [{}] [{}]",
                    r.commit_line.trim(),
                    r.drain_line,
                    r.refusal_line,
                    r.replaced_line
                )
            })
        }),
        ("secure_boot_boots_only_signed_images", |i| {
            secure_boot::secure_boot_boots_only_signed_images(i).map(|r| {
                format!(
                    "unsigned: {:?}; changed after signing: {:?}; signed: ready {:.1} s after QEMU started; {:?}",
                    r.unsigned_refusal,
                    r.changed_refusal,
                    r.ready_wall.as_secs_f64(),
                    r.update_refusal
                )
            })
        }),
        ("tpm_seals_the_data_key", |i| {
            tpm::tpm_seals_the_data_key(i).map(|r| {
                format!(
                    "first boot: {:?}; Secure Boot off: {:?}; after data reseal, Secure Boot off: {:?}; Secure Boot back on: {:?}; another TPM: {:?}",
                    r.sealed_line,
                    r.secure_boot_off_line,
                    r.resealed_line,
                    r.secure_boot_back_line,
                    r.other_tpm_line
                )
            })
        }),
        ("uefi_disk_boots_serves_and_keeps_data", |i| {
            uefi::disk_boots_serves_and_keeps_data(i).map(|r| {
                format!(
                    "firmware start to ready {:.1} s, reboot (tuned) to ready {:.1} s, bad config partition boot to ready {:.1} s, ringstore.efi {} KiB",
                    r.ready_wall.as_secs_f64(),
                    r.second_ready_wall.as_secs_f64(),
                    r.third_ready_wall.as_secs_f64(),
                    r.efi_kib
                )
            })
        }),
    ]
}

/// The QEMU tests' names, in the order they run.
pub fn names() -> Vec<&'static str> {
    tests().into_iter().map(|(name, _)| name).collect()
}

/// Runs every QEMU test whose name contains one of `filters` (all when empty) on `image`,
/// building what they need beyond it with `builder`. Console logs go to
/// target/appliance/vm/NAME.log.
pub fn run(builder: &'static dyn Builder, image: &Image, filters: &[String]) -> Result<()> {
    image::set_builder(builder);
    let mut failed = Vec::new();
    for (name, test) in tests() {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let started = Instant::now();
        let mut outcome = test(image);
        if let Err(err) = &outcome {
            // A guest kernel stall or a QEMU crash before /init is the emulator's, not ours: run
            // the test once more.
            let text = format!("{err:#}");
            if text.contains(vm::STALL_BEFORE_INIT)
                || text.contains(vm::EMULATOR_FAILED_BEFORE_INIT)
            {
                eprintln!("vm test {name}: {err:#}\nvm test {name}: running it once more");
                outcome = test(image);
            }
        }
        match outcome {
            Ok(note) => eprintln!(
                "vm test {name}: ok in {:.1} s {note}",
                started.elapsed().as_secs_f64()
            ),
            Err(err) => {
                eprintln!(
                    "vm test {name}: FAILED in {:.1} s: {err:#}",
                    started.elapsed().as_secs_f64()
                );
                failed.push(format!("{name} ({})", failure_summary(&err)));
            }
        }
    }
    if !failed.is_empty() {
        // Each failure's reason again at the end, where a CI log's tail shows it.
        bail!("QEMU tests failed: {}", failed.join("; "));
    }
    Ok(())
}

/// A failed test's error on one line, at most [`SUMMARY_MAX`] characters (its start: the
/// outermost context and the first causes).
fn failure_summary(err: &anyhow::Error) -> String {
    let text = format!("{err:#}").replace('\n', " | ");
    match text.char_indices().nth(SUMMARY_MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// Characters of each failure repeated in the closing summary.
const SUMMARY_MAX: usize = 600;
