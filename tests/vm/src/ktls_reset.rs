//! Kernel TLS decided per connection (issue 35): clients that complete a TLS 1.3 handshake,
//! send their Finished and reset at once (SO_LINGER 0) make the server's hand-over to the
//! kernel fail for their connection (the socket is no longer established: ENOTCONN); that
//! must keep only those connections in user space, so a normal session afterwards still gets
//! kernel TLS (`tls_ktls_tx` and `tls_ktls_rx` grow for it) and the failures are counted.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use super::client::tcp;
use super::console::stat;
use super::tls_client::{connect, tls_set_get};
use super::vm::Vm;

/// How many clients reset right after their Finished: each is a chance for the reset to reach
/// the guest before the server's hand-over (a race the guest usually loses under TCG; one lost
/// race is enough to switch kernel TLS off for the process where the fallback is global).
const RESETS: usize = 16;
/// Time for the server to see the last reset before `stats` is read (TCG is slow).
const SETTLE: Duration = Duration::from_secs(2);

/// One client: the TLS 1.3 handshake driven by hand, its Finished written, then a reset.
fn finished_then_reset(port: u16, config: &Arc<ClientConfig>) -> Result<()> {
    let mut conn = ClientConnection::new(config.clone(), ServerName::try_from("localhost")?)?;
    let mut sock: TcpStream = tcp(port)?;
    while conn.is_handshaking() {
        while conn.wants_write() {
            conn.write_tls(&mut sock)?;
        }
        let n = conn.read_tls(&mut sock)?;
        ensure!(n > 0, "closed during the handshake");
        conn.process_new_packets()?;
    }
    ensure!(
        conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_3),
        "not TLS 1.3: {:?}",
        conn.protocol_version()
    );
    // The handshake is done on our side: the Finished is queued; send it, then reset.
    while conn.wants_write() {
        conn.write_tls(&mut sock)?;
    }
    rustix::net::sockopt::set_socket_linger(&sock, Some(Duration::ZERO))?;
    drop(sock);
    Ok(())
}

fn counter(stats: &str, name: &str) -> Result<u64> {
    stat(stats, name)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {name} in stats:\n{stats}"))
}

/// [`RESETS`] clients that reset after their Finished, then one normal session on `port`:
/// it must be handed to the kernel. Returns a line for the test's report.
pub(super) fn resets_leave_kernel_tls_on(
    vm: &mut Vm,
    port: u16,
    config: &Arc<ClientConfig>,
) -> Result<String> {
    for i in 0..RESETS {
        finished_then_reset(port, config).with_context(|| format!("reset client {i}"))?;
    }
    std::thread::sleep(SETTLE);
    let before = vm.command("stats")?;
    let (tx, rx) = (
        counter(&before, "tls_ktls_tx")?,
        counter(&before, "tls_ktls_rx")?,
    );
    let mut session = connect(port, config)?;
    tls_set_get(&mut session, "after-resets", "still-kernel-tls")?;
    let after = vm.command("stats")?;
    let (tx2, rx2) = (
        counter(&after, "tls_ktls_tx")?,
        counter(&after, "tls_ktls_rx")?,
    );
    ensure!(
        tx2 > tx && rx2 > rx,
        "the session after {RESETS} reset clients stayed in user space (tls_ktls_tx {tx} -> {tx2}, \
         tls_ktls_rx {rx} -> {rx2}): one client's failed hand-over switched kernel TLS off:\n{}",
        vm.tail()
    );
    // The reset clients reached the per-connection fallback (else this proved nothing).
    let fallbacks = counter(&after, "tls_ktls_fallbacks")?;
    ensure!(
        fallbacks >= 1,
        "no tls_ktls_fallbacks after {RESETS} reset clients: the race was never lost:\n{after}"
    );
    drop(session);
    Ok(format!(
        "{RESETS} Finished-then-reset clients: {fallbacks} fell back to user space, the next session in kernel TLS"
    ))
}
