//! bpf(2) for the AF_XDP fast path: an XSKMAP, the hand-assembled XDP program that steers
//! memcache UDP into it ([`steer_program`]), loading with the verifier's log on failure, and
//! attaching with `BPF_LINK_CREATE` (native first, generic as the fallback). The link is a
//! file descriptor: closing it (or the process ending) detaches the program, so the
//! interface is left clean whatever way ringstore stops. rustix has no bpf(2) wrapper, so
//! these are raw `libc::syscall`s.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `attach_type` of an XDP link.
const BPF_XDP: u32 = 37;
/// XDP_FLAGS_SKB_MODE: generic XDP, run by the kernel after the driver built an skb.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// XDP_FLAGS_DRV_MODE: native XDP in the driver.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// Bytes of verifier log kept when a load fails.
const VERIFIER_LOG_MAX: usize = 64 << 10;
/// Helper number of `bpf_redirect_map`.
const HELPER_REDIRECT_MAP: i32 = 51;
/// XDP_PASS: hand the frame to the kernel's stack.
const XDP_PASS: i32 = 2;

/// Why the XDP program could not be loaded or attached.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    /// A bpf(2) command failed.
    #[error("bpf({what}): {err}")]
    Syscall { what: &'static str, err: io::Error },
    /// The verifier refused the program; its log (truncated to 64 KiB) says why.
    #[error("the verifier refused the XDP program: {err}\n{log}")]
    Verifier { err: io::Error, log: String },
}

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// Destination register in the low nibble, source in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        }
    }
}

// Opcodes used (class | size/op | source).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x57;
const JGT_X: u8 = 0x2d;
const JNE_K: u8 = 0x55;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
/// `src_reg` of an `LD_IMM64` whose immediate is a map file descriptor.
const PSEUDO_MAP_FD: u8 = 1;

/// Number of instructions of [`steer_program`].
pub const STEER_PROGRAM_LEN: usize = 24;

/// A 16-bit big-endian wire value as a native-endian `ldxh` reads it from the packet.
const fn wire16(v: u16) -> i32 {
    u16::from_ne_bytes(v.to_be_bytes()) as i32
}

/// The XDP program: a frame that is Ethernet II + IPv4 without options, not a fragment, UDP
/// to `port`, is redirected to slot `rx_queue_index` of the XSKMAP `map_fd`, with
/// `XDP_PASS` as `bpf_redirect_map`'s default (an empty slot passes the frame to the
/// kernel); every other frame (ARP, IPv6, VLAN-tagged, ICMP, TCP, other UDP, IPv4 with
/// options or fragments, anything shorter than its headers) is passed untouched.
pub fn steer_program(map_fd: RawFd, port: u16) -> [Insn; STEER_PROGRAM_LEN] {
    // Registers: r1 = ctx (struct xdp_md), r2 = data, r3 = data_end, r4/r5 scratch.
    const PASS: i16 = 22; // index of the pass tail
    let j = |at: i16| PASS - (at + 1); // jump offset from instruction `at` to PASS
    [
        Insn::new(LDX_W, 2, 1, 0, 0),                     // 0: r2 = ctx->data
        Insn::new(LDX_W, 3, 1, 4, 0),                     // 1: r3 = ctx->data_end
        Insn::new(MOV64_X, 4, 2, 0, 0),                   // 2: r4 = r2
        Insn::new(ADD64_K, 4, 0, 0, 42),                  // 3: r4 += eth + ipv4 + udp
        Insn::new(JGT_X, 4, 3, j(4), 0),                  // 4: short frame: pass
        Insn::new(LDX_H, 5, 2, 12, 0),                    // 5: r5 = ethertype
        Insn::new(JNE_K, 5, 0, j(6), wire16(0x0800)),     // 6: not IPv4: pass
        Insn::new(LDX_B, 5, 2, 14, 0),                    // 7: r5 = version, IHL
        Insn::new(JNE_K, 5, 0, j(8), 0x45),               // 8: options or not v4: pass
        Insn::new(LDX_H, 5, 2, 20, 0),                    // 9: r5 = flags, fragment offset
        Insn::new(AND64_K, 5, 0, 0, wire16(0x3fff)),      // 10: more-fragments + offset
        Insn::new(JNE_K, 5, 0, j(11), 0),                 // 11: a fragment: pass
        Insn::new(LDX_B, 5, 2, 23, 0),                    // 12: r5 = protocol
        Insn::new(JNE_K, 5, 0, j(13), 17),                // 13: not UDP: pass
        Insn::new(LDX_H, 5, 2, 36, 0),                    // 14: r5 = UDP destination port
        Insn::new(JNE_K, 5, 0, j(15), wire16(port)),      // 15: another port: pass
        Insn::new(LDX_W, 2, 1, 16, 0),                    // 16: r2 = ctx->rx_queue_index
        Insn::new(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd), // 17: r1 = &xskmap
        Insn::new(0, 0, 0, 0, 0),                         // 18: (second half of LD_IMM64)
        Insn::new(MOV64_K, 3, 0, 0, XDP_PASS),            // 19: r3 = default action
        Insn::new(CALL, 0, 0, 0, HELPER_REDIRECT_MAP),    // 20: bpf_redirect_map(r1, r2, r3)
        Insn::new(EXIT, 0, 0, 0, 0),                      // 21: return its verdict
        Insn::new(MOV64_K, 0, 0, 0, XDP_PASS),            // 22: PASS: r0 = XDP_PASS
        Insn::new(EXIT, 0, 0, 0, 0),                      // 23: return
    ]
}

/// bpf(2) with `attr` (a `union bpf_attr` prefix of `size` bytes).
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // The kernel reads (for some commands writes) only `size_of::<T>()` bytes of `attr`.
    // SAFETY: `attr` is a live, exclusive `#[repr(C)]` bpf_attr prefix; its pointers are valid.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            crate::num::u32_of(std::mem::size_of::<T>()),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A descriptor bpf(2) returned.
#[expect(
    clippy::cast_possible_truncation,
    reason = "bpf(2) returns an int in a long: a descriptor always fits in RawFd"
)]
fn owned(rc: libc::c_long) -> OwnedFd {
    // SAFETY: bpf(2) returned a new file descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(rc as RawFd) }
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// Creates an XSKMAP of `max_entries` slots (one per receive queue).
pub fn xskmap_create(max_entries: u32) -> Result<OwnedFd, BpfError> {
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries,
        map_flags: 0,
    };
    bpf(BPF_MAP_CREATE, &mut attr)
        .map(owned)
        .map_err(|err| BpfError::Syscall {
            what: "BPF_MAP_CREATE xskmap",
            err,
        })
}

#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Puts the AF_XDP socket `xsk` in slot `key` of the XSKMAP `map`.
pub fn xskmap_set(map: BorrowedFd<'_>, key: u32, xsk: BorrowedFd<'_>) -> Result<(), BpfError> {
    let value: u32 = xsk.as_raw_fd() as u32;
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0, // BPF_ANY
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
        .map(drop)
        .map_err(|err| BpfError::Syscall {
            what: "BPF_MAP_UPDATE_ELEM xskmap",
            err,
        })
}

/// Empties slot `key` of the XSKMAP `map` (its frames pass to the kernel again).
pub fn xskmap_clear(map: BorrowedFd<'_>, key: u32) -> Result<(), BpfError> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: 0,
        flags: 0,
    };
    bpf(BPF_MAP_DELETE_ELEM, &mut attr)
        .map(drop)
        .map_err(|err| BpfError::Syscall {
            what: "BPF_MAP_DELETE_ELEM xskmap",
            err,
        })
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// Loads `insns` as an XDP program named `name` (at most 15 bytes kept). On failure the
/// load is repeated with the verifier log on, and the log is returned in the error.
pub fn prog_load_xdp(insns: &[Insn], name: &str) -> Result<OwnedFd, BpfError> {
    const LICENSE: &[u8] = b"Apache-2.0\0";
    let mut prog_name = [0u8; 16];
    let n = name.len().min(15);
    prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let attr = |log: &mut [u8]| ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: crate::num::u32_of(insns.len()),
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        log_level: u32::from(!log.is_empty()),
        log_size: crate::num::u32_of(log.len()),
        log_buf: if log.is_empty() {
            0
        } else {
            log.as_mut_ptr() as u64
        },
        prog_name,
        ..ProgLoad::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr(&mut [])) {
        Ok(rc) => Ok(owned(rc)),
        Err(first) => {
            let mut log = vec![0u8; VERIFIER_LOG_MAX];
            match bpf(BPF_PROG_LOAD, &mut attr(&mut log)) {
                Ok(rc) => Ok(owned(rc)),
                Err(err) => {
                    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                    let log = String::from_utf8_lossy(&log[..end]).into_owned();
                    if log.is_empty() {
                        Err(BpfError::Syscall {
                            what: "BPF_PROG_LOAD xdp",
                            err: first,
                        })
                    } else {
                        Err(BpfError::Verifier { err, log })
                    }
                }
            }
        }
    }
}

/// How an XDP program runs on an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttach {
    /// In the driver, before any skb exists.
    Native,
    /// In the kernel's generic hook, after the skb is built (any driver; slowest).
    Generic,
}

impl XdpAttach {
    pub fn name(self) -> &'static str {
        match self {
            XdpAttach::Native => "native",
            XdpAttach::Generic => "generic",
        }
    }
}

#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// Attaches `prog` to interface `ifindex` with a BPF link: native XDP if the driver has it,
/// else generic. The program stays attached while the returned link descriptor is open.
pub fn xdp_link_attach(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    allow_native: bool,
) -> Result<(OwnedFd, XdpAttach), BpfError> {
    let attach = |flags: u32| {
        let mut attr = LinkCreate {
            prog_fd: prog.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags,
        };
        bpf(BPF_LINK_CREATE, &mut attr).map(owned)
    };
    if allow_native {
        if let Ok(link) = attach(XDP_FLAGS_DRV_MODE) {
            return Ok((link, XdpAttach::Native));
        }
    }
    attach(XDP_FLAGS_SKB_MODE)
        .map(|link| (link, XdpAttach::Generic))
        .map_err(|err| BpfError::Syscall {
            what: "BPF_LINK_CREATE xdp",
            err,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jump_lands_on_the_pass_tail_and_the_port_is_in_wire_order() {
        let prog = steer_program(7, 11211);
        for (at, insn) in prog.iter().enumerate() {
            if insn.code == JNE_K || insn.code == JGT_X {
                assert_eq!(
                    i16::try_from(at).unwrap() + 1 + insn.off,
                    22,
                    "jump at {at}"
                );
            }
        }
        assert_eq!((prog[22].code, prog[22].imm), (MOV64_K, XDP_PASS));
        assert_eq!(prog[23].code, EXIT);
        assert_eq!(
            (prog[17].code, prog[17].imm, prog[17].regs),
            (LD_IMM64, 7, 0x11)
        );
        // The port compares against the bytes as they lie in the packet.
        let wire = 11211u16.to_be_bytes();
        assert_eq!(
            u16::try_from(prog[15].imm).unwrap(),
            u16::from_ne_bytes(wire)
        );
        assert_eq!(
            u16::try_from(prog[6].imm).unwrap(),
            u16::from_ne_bytes([0x08, 0x00])
        );
    }
}
