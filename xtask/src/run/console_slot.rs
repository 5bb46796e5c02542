//! The one console client `cargo xtask run` relays at a time: who holds the slot, and how a
//! client that arrives just as the previous one leaves waits for it instead of being closed.
//!
//! The previous client's copy thread notices its EOF a moment after that client exits, so a
//! second `ringstore console` started right after the first (the QEMU test does exactly that:
//! `status`, then `poweroff`) used to find the slot still taken and got a broken pipe. Now a
//! newcomer waits up to [`BUSY_WAIT`] for the slot; only a client that really overlaps another
//! is refused, with a line saying why.

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How long a newcomer waits for the connected client to leave before it is refused.
pub const BUSY_WAIT: Duration = Duration::from_secs(5);
/// What a refused client reads before its connection closes.
pub const BUSY_LINE: &[u8] =
    b"run: another console client is connected; try again when it ends\r\n";

/// The connected client (with the number it was given when accepted) and a signal for its end.
#[derive(Default)]
pub struct ConsoleSlot {
    held: Mutex<Option<(u64, UnixStream)>>,
    freed: Condvar,
}

impl ConsoleSlot {
    fn lock(&self) -> MutexGuard<'_, Option<(u64, UnixStream)>> {
        // A poisoned lock only means a relay thread panicked; the stream inside is whole.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Guest output to the connected client, if any; a client that cannot take it is dropped.
    pub fn write(&self, bytes: &[u8]) {
        let mut held = self.lock();
        if let Some((_, stream)) = held.as_mut() {
            if stream.write_all(bytes).is_err() {
                *held = None;
                self.freed.notify_all();
            }
        }
    }

    /// Frees the slot if client `id` still holds it (a newer client's slot is left alone).
    fn release(&self, id: u64) {
        let mut held = self.lock();
        if held.as_ref().is_some_and(|(holder, _)| *holder == id) {
            *held = None;
            self.freed.notify_all();
        }
    }

    /// Gives the slot to `stream` as client `id` once it is free, waiting at most `wait`;
    /// false (the slot still taken) when the wait ran out.
    fn take(&self, id: u64, stream: UnixStream, wait: Duration) -> bool {
        let held = self.lock();
        let (mut held, _) = self
            .freed
            .wait_timeout_while(held, wait, |h| h.is_some())
            .unwrap_or_else(PoisonError::into_inner);
        if held.is_some() {
            return false;
        }
        *held = Some((id, stream));
        true
    }
}

/// Accepts console clients on `listener`, one at a time; each client's bytes go to `guest`.
pub fn spawn_acceptor(listener: UnixListener, guest: UnixStream, slot: Arc<ConsoleSlot>) {
    std::thread::spawn(move || {
        for (id, stream) in (0u64..).zip(listener.incoming().flatten()) {
            let (Ok(reader), Ok(mut to_guest)) = (stream.try_clone(), guest.try_clone()) else {
                continue;
            };
            let mut refused = match stream.try_clone() {
                Ok(s) => s,
                Err(_) => continue,
            };
            if !slot.take(id, stream, BUSY_WAIT) {
                let _ = refused.write_all(BUSY_LINE);
                continue;
            }
            let slot = Arc::clone(&slot);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut { reader }, &mut to_guest);
                slot.release(id);
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::time::Instant;

    fn relay_in(dir: &std::path::Path) -> (std::path::PathBuf, UnixStream, Arc<ConsoleSlot>) {
        std::fs::create_dir_all(dir).unwrap();
        let socket = dir.join("console.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let (guest_end, relay_end) = UnixStream::pair().unwrap();
        let slot = Arc::new(ConsoleSlot::default());
        spawn_acceptor(listener, relay_end, Arc::clone(&slot));
        (socket, guest_end, slot)
    }

    fn read_exactly(from: &mut UnixStream, n: usize) -> Vec<u8> {
        from.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = vec![0u8; n];
        from.read_exact(&mut got).unwrap();
        got
    }

    /// The race the `cargo xtask run` QEMU test hit: a client closes and the next connects at
    /// once, 200 times; every second client's bytes must reach the guest, and it must get the
    /// guest's answer.
    #[test]
    fn back_to_back_clients_each_reach_the_guest() {
        let dir = std::env::temp_dir().join(format!("xtask-slot-{}", std::process::id()));
        let (socket, mut guest, slot) = relay_in(&dir);
        for round in 0..200u32 {
            let mut client = UnixStream::connect(&socket).unwrap();
            let word = format!("{round:05}");
            client.write_all(word.as_bytes()).unwrap();
            assert_eq!(read_exactly(&mut guest, 5), word.as_bytes());
            slot.write(b"ok");
            assert_eq!(read_exactly(&mut client, 2), b"ok");
            drop(client);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A client that overlaps a connected one for longer than [`BUSY_WAIT`] is told so and
    /// closed; the first keeps the guest.
    #[test]
    fn an_overlapping_client_is_refused_with_a_line() {
        let dir = std::env::temp_dir().join(format!("xtask-slot-busy-{}", std::process::id()));
        let (socket, mut guest, slot) = relay_in(&dir);
        let mut first = UnixStream::connect(&socket).unwrap();
        first.write_all(b"a").unwrap();
        assert_eq!(read_exactly(&mut guest, 1), b"a");
        let started = Instant::now();
        let mut second = UnixStream::connect(&socket).unwrap();
        second
            .set_read_timeout(Some(BUSY_WAIT + Duration::from_secs(5)))
            .unwrap();
        let mut told = Vec::new();
        second.read_to_end(&mut told).unwrap();
        assert_eq!(told, BUSY_LINE);
        assert!(started.elapsed() >= BUSY_WAIT);
        slot.write(b"z");
        assert_eq!(read_exactly(&mut first, 1), b"z");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
