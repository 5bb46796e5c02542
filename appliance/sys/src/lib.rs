//! The operating-system boundary of ringstore: every syscall wrapper, sysfs/procfs reader and
//! the CPU-list code, in one crate, so "`unsafe` only in sys" is a crate boundary (ADR-0017).
//!
//! Where [`rustix`] has a safe wrapper it is used (affinity, sockets and their options, poll,
//! eventfd, mounts, reboot, rlimits, no_new_privs, the capability bounding set, waitpid,
//! kill, stdio dup2). Raw `libc` calls remain only where rustix has none: each says so, and
//! each `unsafe` block carries a `// SAFETY:` comment with the bound it relies on.
//!
//! Everything is re-exported at the crate root; the runtime imports the crate as `sys`.

mod block;
mod bpf;
mod cpus;
mod dax;
mod epoll;
mod fs;
mod hint;
mod kexec;
mod ktls;
mod mmap;
mod mounts;
mod net;
mod netdev;
mod num;
mod power;
mod process;
mod signals;
mod time;
mod tpm;
mod tty;
mod xsk;

pub use block::resize_partition;
pub use bpf::{
    prog_load_xdp, steer_program, xdp_link_attach, xskmap_clear, xskmap_create, xskmap_set,
    BpfError, Insn, XdpAttach, STEER_PROGRAM_LEN,
};
pub use cpus::{
    affinity, cpumask_hex, format_cpus, mbind_bind, parse_cpulist, set_affinity,
    set_mempolicy_bind, CPULIST_LEN_MAX, CPULIST_SPAN_MAX,
};
pub use dax::{
    find_device_dax, make_device_dax, pmem_namespaces, probe_map, region_holding, wait_for_pmem,
    zero_head, DaxDevice, Probed, Reservation, DAX_ALIGN, SYSFS,
};
pub use epoll::{
    recv_into_nowait, recv_nowait, recvmmsg_nowait, send_nowait, sendmmsg_nowait,
    sendmsg_iovecs_nowait, set_nonblocking, Epoll, Readiness, Received, RecvBatch, Transfer, Watch,
    RECVMMSG_MAX, SENDMMSG_MAX,
};
pub use fs::{drop_cached, read_trim};
pub use hint::prefetch_read;
pub use kexec::{kexec_file_load, reboot_kexec, KEXEC_CMDLINE_MAX};
pub use ktls::{
    install_kernel_tls, kernel_has_tls, quick_ack, KtlsCipher, KtlsError, KtlsKeys, KTLS_TLS12,
    KTLS_TLS13,
};
pub use mmap::{map_file_for_process, Mapping};
pub use mounts::{mount, MountFlags};
pub use net::{
    accept, bind_socket, bind_udp_to_device, eventfd, eventfd_read, eventfd_signal,
    interface_addresses, local_addr, peer_addr, peer_ip, poll_one_readable, poll_readable,
    recv_discard, recv_from, send_nosignal, send_to, set_nodelay, set_send_buffer, shutdown,
    socket_addr_of, zeroed_msghdr, LISTEN_BACKLOG,
};
pub use netdev::{add_default_route, set_ipv4, set_up};
pub use num::{u32_of, usize_of};
pub use power::{disable_ctrl_alt_del, reboot, sync, RebootCommand};
pub use process::{
    bounding_set_drop, bounding_set_has, ensure_console_fds, hostname, monotonic_ns, no_new_privs,
    process_cpu_time, raise_nofile_limit, replace_stderr, return_freed_memory_promptly,
    set_hostname, set_memlock_unlimited, set_no_new_privs, set_nofile_limit, thread_cpu_time,
    MALLOC_MMAP_THRESHOLD,
};
pub use signals::{
    block_signals, ignore_sigpipe, install_noop_handlers, kill, read_signal, reap_children,
    set_signal_mask, signal_set, signal_this_thread, signalfd, termination_set, wait_signal,
};
pub use time::{civil_from_days, days_from_civil};
pub use tpm::{TpmDevice, TPM_RESPONSE_MAX};
pub use tty::KeysAtOnce;
pub use xsk::{ifindex, rx_queue_count, Frame, Xsk, XskConfig, XskError, XskMode};
