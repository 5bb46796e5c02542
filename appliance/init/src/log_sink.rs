//! `log_sink` on the appliance (ADR 0045): once the network is up, PID 1 ships its own log
//! (the ring's backlog first), the server's (every line written to stderr, through a tee that
//! still writes the console) and the kernel's (/dev/kmsg from its oldest record) to the
//! syslog receiver. Queuing never waits: a full queue drops and counts.

use std::fs::File;
use std::io::Read;

use ringstore_config::Config;
use ringstore_logsink::{Facility, Ident, Severity, Shipper};

use crate::log;
use crate::{info, warn};

/// Longest /dev/kmsg record read (the kernel's own limit is about 1 KiB of text plus its
/// dictionary).
const KMSG_RECORD_MAX: usize = 8192;

/// Starts the sink of `config` (if any): PID 1's lines, the server's and the kernel's.
pub fn start(config: &Config) {
    let Some(sink) = &config.log_sink else {
        return;
    };
    let shipper = match Shipper::start(sink, config.tls.ca.as_deref(), Ident::of_this_process()) {
        Ok(shipper) => shipper,
        Err(err) => {
            warn!("{err}; the log stays on this box");
            return;
        }
    };
    log::attach_shipper(shipper.clone());
    match ringstore_logsink::tee_stderr(shipper.clone(), "server", Some(&log::CONSOLE)) {
        Ok(tee) => match tee.original() {
            Ok(console) => log::write_console_directly(console),
            Err(err) => warn!("log-sink: the console: {err}"),
        },
        Err(err) => warn!("log-sink: the server's lines stay on the console: {err}"),
    }
    match File::open("/dev/kmsg") {
        Ok(kmsg) => {
            let spawned = std::thread::Builder::new()
                .name("log-sink-kmsg".into())
                .spawn(move || ship_kmsg(kmsg, &shipper));
            if let Err(err) = spawned {
                warn!("log-sink: no kernel lines: {err}");
            }
        }
        Err(err) => warn!("log-sink: no kernel lines: /dev/kmsg: {err}"),
    }
    info!("log-sink: shipping this log to {sink}");
}

/// Reads the kernel's records from the oldest the ring still holds, forever.
fn ship_kmsg(mut kmsg: File, shipper: &Shipper) {
    let mut record = vec![0u8; KMSG_RECORD_MAX];
    loop {
        match kmsg.read(&mut record) {
            Ok(0) => return,
            Ok(n) => {
                if let Some((level, text)) = kernel_record(&record[..n]) {
                    let severity = Severity::from_kernel_level(level);
                    shipper.log(Facility::Kern, severity, "kernel", &text);
                }
            }
            // EPIPE: records were overwritten before they were read; the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The level and text of one /dev/kmsg record (`PRI,SEQ,USEC,FLAGS[,…];TEXT\n` and
/// continuation lines), if it is the kernel's own (facility 0): PID 1's copies of its lines
/// and anything else user space wrote there have another facility and are left out.
pub fn kernel_record(record: &[u8]) -> Option<(u8, String)> {
    let text = String::from_utf8_lossy(record);
    let (head, body) = text.split_once(';')?;
    let pri: u32 = head.split(',').next()?.parse().ok()?;
    if pri >> 3 != 0 {
        return None;
    }
    let level = u8::try_from(pri & 7).ok()?;
    let message = body.lines().next().unwrap_or("");
    Some((level, message.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_records_are_read_and_user_space_ones_left_out() {
        assert_eq!(
            kernel_record(b"6,339,5140900,-;virtio_net virtio0 eth0: up\n SUBSYSTEM=net\n"),
            Some((6, "virtio_net virtio0 eth0: up".into()))
        );
        assert_eq!(
            kernel_record(b"3,1,2,c;EXT4-fs error\n"),
            Some((3, "EXT4-fs error".into()))
        );
        // PID 1's debug copies: facility user (1), level 7.
        assert_eq!(
            kernel_record(b"15,340,5141000,-;ringstore: info: x\n"),
            None
        );
        assert_eq!(kernel_record(b"no separator"), None);
        assert_eq!(kernel_record(b"x,1;y"), None);
    }
}
