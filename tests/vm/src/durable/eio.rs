//! QEMU test of a data disk that really fails: QEMU's blkdebug driver sits under the guest's
//! virtio-blk disk and answers one write with EIO. The sets whose records that write carried
//! answer `SERVER_ERROR data device write failed`, every other set is acknowledged, the server
//! keeps serving, and after a reboot on the healthy disk every acknowledged set reads back and
//! no failed one does.

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::{
    check_model, console_line_with, port_of, set_request, value_of, Conn, Model, ScratchDisks,
    DISK_PROFILE,
};
use crate::image::Image;
use crate::vm::Vm;
use crate::{BOOT_LIMIT, COMMAND_LIMIT, PROMPT};

/// blkdebug rules: the first flush the guest sends (the format's) arms the rule, and the next
/// write after it fails once with EIO (errno 5). Later writes succeed.
const RULES: &str = "[set-state]\nevent = \"flush_to_disk\"\nstate = \"1\"\nnew_state = \"2\"\n\n\
[inject-error]\nevent = \"write_aio\"\nstate = \"2\"\nerrno = \"5\"\nonce = \"on\"\n";

/// Sets sent one after another on one connection (each is its own write and flush).
const SETS: usize = 300;

pub fn failed_disk_write_fails_only_its_requests(image: &Image) -> Result<String> {
    let disks = ScratchDisks::create("eio", DISK_PROFILE)?;
    let rules = disks.dir.join("eio-rules.conf");
    std::fs::write(&rules, RULES)?;
    let failing = [PathBuf::from(format!(
        "blkdebug:{}:{}",
        rules.display(),
        disks.files[0].display()
    ))];
    let mut vm = Vm::boot_with_disks(image, "eio-1", DISK_PROFILE, "", &failing)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    console_line_with(&vm, "data device /dev/vda: formatted")?;

    let mut conn = Conn::open(port_of(&vm)?)?;
    let mut model = Model::new();
    let mut failed = Vec::new();
    for i in 0..SETS {
        let key = format!("eio-{i}");
        let (flags, value) = value_of(&key, 0);
        match conn
            .line_reply(&set_request(&key, flags, &value))?
            .as_deref()
        {
            Some("STORED\r\n") => {
                model.insert(key, Some((flags, value)));
            }
            Some("SERVER_ERROR data device write failed\r\n") => {
                failed.push(key.clone());
                model.insert(key, None);
            }
            other => bail!("set {key} answered {other:?}"),
        }
    }
    drop(conn);
    anyhow::ensure!(
        !failed.is_empty(),
        "no set failed: the injected EIO never reached ringstore"
    );
    anyhow::ensure!(
        failed.len() < 10,
        "{} sets failed for one failed write: {failed:?}",
        failed.len()
    );
    let line = console_line_with(&vm, "failing the affected requests")?;
    // A failed set reads as absent (there was no older value), every other as acknowledged.
    check_model(port_of(&vm)?, &model)?;
    vm.poweroff()?;
    drop(vm);

    let mut vm = Vm::boot_with_disks(image, "eio-2", DISK_PROFILE, "", &disks.files)?;
    let ready = vm.wait_for("ringstore: ready memcache=", 0, BOOT_LIMIT)?;
    vm.wait_for(PROMPT, ready, COMMAND_LIMIT)?;
    let live = check_model(port_of(&vm)?, &model)?;
    vm.poweroff()?;
    Ok(format!(
        "{} of {SETS} sets failed ({}), {live} acknowledged read back after a reboot; [{line}]",
        failed.len(),
        failed.join(" ")
    ))
}
