//! The serial console's byte stream split into its two writers: PID 1 (its lines, the prompt,
//! command output, the server's lines) and the kernel's log records.
//!
//! The kernel writes a log record straight to the UART, between any two bytes of whatever PID 1
//! has queued on the tty: a record can land in the middle of a PID 1 line (seen in CI:
//! `ringstore: ready[    4.418821] ringstore: serving: ready memcache=…` and then
//! ` memcache=0.0.0.0:11211 …` on the next line). A record is always whole and always
//! `[SECONDS.MICROS] text` up to its newline (CONFIG_PRINTK_TIME, six decimals), so it is cut out
//! wherever it starts and PID 1's text is put back together. PID 1 never prints that shape (its
//! `log` ring has three decimals).

//!
//! The splitter itself is `ringstore_console::split`, shared with `ringstore console`.

pub use ringstore_console::split::{Splitter, Utf8Pieces};

#[cfg(test)]
mod tests {
    use super::super::console::{data_sockets, ready_line};
    use ringstore_console::split::split_in_chunks;

    const READY: &str = "ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n";

    /// What the old reader did: the console text as it came, `\r` dropped.
    fn old_reader(text: &str) -> String {
        text.replace('\r', "")
    }

    #[test]
    fn the_ci_split_ready_line_is_whole_again() {
        // Byte for byte what a fresh-machine CI run printed (durable_writes_survive_power_cut
        // waited 180 s for it): the kernel's copy of PID 1's log line landed inside PID 1's
        // ready line, and PID 1's line continued on the next one.
        let console = "ringstore: ready[    4.418821] ringstore: serving: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\r\n memcache=0.0.0.0:11211 http=0.0.0.0:8080\r\nringstore> ";
        assert!(
            !old_reader(console).contains("ringstore: ready memcache="),
            "the old wait could never see it"
        );
        for chunk in [1, 2, 3, 7, 64, console.len()] {
            let s = split_in_chunks(console, chunk);
            assert_eq!(s.pid1, format!("{READY}ringstore> "), "chunks of {chunk}");
            assert_eq!(
                s.kernel,
                "[    4.418821] ringstore: serving: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n"
            );
            assert!(s.pid1.contains("ringstore: ready memcache="));
            let line = ready_line(&s.pid1).expect("a ready line");
            assert_eq!(line, READY.trim_end());
            assert_eq!(
                data_sockets(&line),
                ["tcp 0.0.0.0:11211", "tcp 0.0.0.0:8080"]
            );
        }
    }

    #[test]
    fn the_double_ready_shape_gives_one_ready_line() {
        // Seen in an earlier CI run: the ready line twice on one console line, the kernel's
        // copy glued to the end.
        let console = "ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080ringstore: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080[    2.605666] ringstore: serving: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\nringstore> ";
        let s = split_in_chunks(console, 4);
        assert_eq!(
            s.kernel,
            "[    2.605666] ringstore: serving: ready memcache=0.0.0.0:11211 http=0.0.0.0:8080\n"
        );
        let line = ready_line(&s.pid1).expect("a ready line");
        assert_eq!(line, READY.trim_end(), "only the first event");
        assert_eq!(
            data_sockets(&line),
            ["tcp 0.0.0.0:11211", "tcp 0.0.0.0:8080"]
        );
    }
}
