//! A software TPM for tests: `swtpm` started on a state directory and spoken to over its
//! socket, as the unit tests of this crate and of PID 1's sealing logic use it. Never used by
//! the product (the appliance talks to `/dev/tpmrm0` through [`crate::Device`]).
use crate::wire::{self, Command, ALG_SHA256, RS_PW, ST_SESSIONS};
use crate::{TpmError, Transport, COMMAND_TIMEOUT};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command as Process};
use std::time::{Duration, Instant};

/// Where Debian's package installs it.
pub const SWTPM: &str = "/usr/bin/swtpm";

/// A running `swtpm`, killed when dropped.
#[derive(Debug)]
pub struct SwTpm {
    child: Child,
    socket: UnixStream,
    /// resetCount at this start (it changes only at the next TPM Reset).
    resets: u32,
}

impl Drop for SwTpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SwTpm {
    /// Whether swtpm is installed; under CI=true a missing one panics (a test that cannot run
    /// must fail there, not skip).
    pub fn available() -> bool {
        let there = Path::new(SWTPM).exists();
        assert!(
            there || std::env::var("CI").as_deref() != Ok("true"),
            "swtpm is not installed (apt-get install swtpm; cargo xtask deps)"
        );
        there
    }

    /// Starts swtpm with its state in `state` (kept there: a later start finds the same TPM),
    /// returning once it has answered a command. swtpm listens before it has run its
    /// `startup-clear`, and one killed in between never stored that TPM Reset: tests that
    /// rebooted several times in a row counted fewer resets than reboots (a CI flake).
    pub fn start(state: &Path) -> Result<SwTpm, TpmError> {
        let sock = state.join("tpm.sock");
        let _ = std::fs::remove_file(&sock);
        let child = Process::new(SWTPM)
            .arg("socket")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--server")
            .arg(format!("type=unixio,path={}", sock.display()))
            .arg("--ctrl")
            .arg(format!(
                "type=unixio,path={}",
                state.join("ctrl.sock").display()
            ))
            .args(["--flags", "not-need-init,startup-clear"])
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let socket = loop {
            match UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e.into()),
            }
        };
        socket.set_read_timeout(Some(COMMAND_TIMEOUT))?;
        let mut tpm = SwTpm {
            child,
            socket,
            resets: 0,
        };
        tpm.resets = crate::one_boot::read_reset_count(&mut tpm)?;
        Ok(tpm)
    }

    /// A reboot: this swtpm stopped (without TPM2_Shutdown, as at a power loss) and another
    /// started on the same state, whose TPM2_Startup(CLEAR) is a TPM Reset (resetCount + 1,
    /// checked: a lost reset would make a test of the reset policy weaker without a word).
    pub fn reboot(self, state: &Path) -> Result<SwTpm, TpmError> {
        let before = self.resets;
        drop(self);
        let tpm = SwTpm::start(state)?;
        if tpm.resets != before.wrapping_add(1) {
            return Err(TpmError::Malformed(
                "swtpm: a reboot did not count one TPM Reset",
            ));
        }
        Ok(tpm)
    }

    /// Extends PCR 7, as a change of the Secure Boot state would.
    pub fn extend_pcr7(&mut self) -> Result<(), TpmError> {
        let mut c = Command::new(ST_SESSIONS, 0x182);
        c.u32(7)
            .auth(RS_PW, 0)
            .u32(1)
            .u16(ALG_SHA256)
            .bytes(&[0x5A; 32]);
        let rsp = self.transact(&c.finish())?;
        wire::check("PCR_Extend", tpm2_protocol::data::TpmCc::PcrExtend, &rsp).map(|_| ())
    }
}

impl Transport for SwTpm {
    fn transact(&mut self, command: &[u8]) -> Result<Vec<u8>, TpmError> {
        self.socket.write_all(command)?;
        let mut rsp = vec![0u8; 10];
        self.socket.read_exact(&mut rsp)?;
        let len = u32::from_be_bytes([rsp[2], rsp[3], rsp[4], rsp[5]]) as usize;
        rsp.resize(len.clamp(10, ringstore_sys::TPM_RESPONSE_MAX), 0);
        self.socket.read_exact(&mut rsp[10..])?;
        Ok(rsp)
    }
}
