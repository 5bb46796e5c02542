//! The saturation check: memaslap against each server, beside our load generator's own GET
//! 100 B depth-1 cell, to show which client runs out of CPU first.

use super::cpu_table::{cpu_row, CPU_TABLE_HEAD};
use super::doc::Doc;
use super::options::Options;
use super::procs::Pinned;
use super::{client, memaslap};
use std::path::Path;

/// memaslap against each server, beside our generator's own GET 100 B depth-1 cell.
pub(super) fn memaslap_section(
    o: &Options,
    base: &mut Pinned,
    subj: Option<&mut Pinned>,
    name: &str,
    ours: Option<(client::LoadResult, Option<client::LoadResult>)>,
    out_dir: &Path,
    doc: &mut Doc,
) -> String {
    let mut out = String::from("### Does the load generator saturate before the server?\n\n");
    out.push_str(
        &CPU_TABLE_HEAD
            .replace("### CPU use (server on CPU 0, client on CPU 1)\n\n", "")
            .replace("| run |", "| client (ops/s) |"),
    );
    let Some(program) = memaslap::binary() else {
        doc.note("memaslap not installed (libmemcached-tools): saturation check skipped".into());
        return out;
    };
    let seconds = o.seconds.min(5);
    let mut servers = vec![(base, "memcached")];
    if let Some(s) = subj {
        servers.push((s, name));
    }
    for (server, who) in servers {
        match memaslap::run(program, server, o.conns, seconds, out_dir) {
            Ok(r) => {
                doc.command(&r.command);
                let run = format!(
                    "memaslap, 90% get / 10% set, 100 B ({:.0})",
                    r.ops_per_second
                );
                cpu_row(
                    &mut out,
                    &run,
                    who,
                    r.server_cpu_percent,
                    r.server_core,
                    r.client_cpu_percent,
                    r.client_core,
                );
            }
            Err(e) => doc.note(format!("memaslap against {who}: {e:#}")),
        }
    }
    if let Some((b, s)) = ours {
        for (who, r) in [("memcached", Some(b)), (name, s)] {
            if let Some(r) = r {
                let run = format!("loadgen, GET 100 B, depth 1 ({:.0})", r.throughput());
                cpu_row(
                    &mut out,
                    &run,
                    who,
                    r.server_cpu_percent(),
                    r.server_core,
                    r.client_cpu_percent(),
                    r.client_core,
                );
            }
        }
    }
    out
}
