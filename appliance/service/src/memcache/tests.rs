//! Byte-exact session tests. Expected replies were taken from memcached 1.6.18 on
//! loopback (`memcached -p 22122 -U 0 -l 127.0.0.1`) for the same input; CAS uniques are
//! ringstore's own (a fresh store counts from 1). Every case also runs with the input
//! split at every byte boundary and fed one byte at a time, which must not change a byte.

use std::sync::Arc;

use crate::{Flow, Now, Protocol, ServiceConfig, Session, Shared, Topology};
use ringstore_store::{Store, StoreConfig};

pub(super) const NOW: Now = Now {
    store: 100,
    unix: 1_700_000_100,
    mono_ms: 0,
    mono_ns: 0,
};
const ITEM_MAX: usize = 1024;

pub(super) fn shared() -> Arc<Shared> {
    shared_started(crate::Started::default())
}

/// [`shared`] as a runtime that knew `started` built it.
pub(super) fn shared_started(started: crate::Started) -> Arc<Shared> {
    shared_on_started(
        Topology {
            numa_node: 1,
            worker_cpus: vec![2, 3],
            hostname: "cache-01".into(),
        },
        started,
    )
}

/// [`shared`] on another machine.
fn shared_on(topology: Topology) -> Arc<Shared> {
    shared_on_started(topology, crate::Started::default())
}

fn shared_on_started(topology: Topology, started: crate::Started) -> Arc<Shared> {
    let store = Store::new(StoreConfig {
        memory_bytes: 8 << 20,
        item_size_max: ITEM_MAX,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        item_size_max: ITEM_MAX,
        max_line: 2048,
        out_high_water: 1 << 20,
        max_conns: 10,
        object_size_max: 0,
        conn_memory: 64 << 20,
    };
    Shared::with(store, config, topology, 2, 42, 1_700_000_000, started)
}

/// Feeds `chunks` in order to a fresh session; returns all output and the last flow.
pub(super) fn feed(shared: &Shared, chunks: &[&[u8]]) -> (Vec<u8>, Flow) {
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut flow = Flow::Continue;
    for c in chunks {
        flow = s.on_bytes(c, NOW, shared, None, &mut out);
        while flow == Flow::Drain {
            flow = s.on_bytes(&[], NOW, shared, None, &mut out);
        }
        if flow == Flow::Close {
            break;
        }
    }
    (out, flow)
}

fn run(input: &[u8]) -> (Vec<u8>, Flow) {
    feed(&shared(), &[input])
}

/// Checks the reply to `input` byte for byte, whole and split every way.
pub(super) fn check(input: &[u8], expected: &[u8]) {
    let (whole, flow) = run(input);
    assert_eq!(
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(expected),
        "input {:?}",
        String::from_utf8_lossy(input)
    );
    for cut in 1..input.len() {
        let (split, f) = feed(&shared(), &[&input[..cut], &input[cut..]]);
        assert_eq!(
            split,
            whole,
            "split at {cut} of {:?}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(f, flow);
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    let (bytewise, f) = feed(&shared(), &bytes);
    assert_eq!(
        bytewise,
        whole,
        "byte by byte: {:?}",
        String::from_utf8_lossy(input)
    );
    assert_eq!(f, flow);
}

#[test]
fn get_set_basics() {
    check(
        b"set a 0 0 1\r\nx\r\nget a b\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set a 5 0 1\r\nx\r\ngets a\r\n",
        b"STORED\r\nVALUE a 5 1 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1\nx\r\nget a\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set a 4294967296 0 1\r\nx\r\nget a\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set   a  0 0 1  \r\nx\r\nget a \r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(b"set a 0 0 1 junk\r\nx\r\n", b"STORED\r\n");
    check(b"get a\r\n\r\n\r\n", b"END\r\nERROR\r\nERROR\r\n");
    check(
        b"set a 0 0 1\r\nx\r\nget a\x00b c\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(b"bget a\r\n", b"END\r\n");
}

#[test]
fn unknown_and_malformed_commands() {
    check(b"foo\r\n", b"ERROR\r\n");
    check(b"get\r\n", b"ERROR\r\n");
    check(b"gets\r\n", b"ERROR\r\n");
    check(b"GET a\r\n", b"ERROR\r\n");
    check(b"\r\n", b"ERROR\r\n");
    check(b"set a 0 0 1 2 3\r\nx\r\n", b"ERROR\r\nERROR\r\n");
    check(b"set a 0 0\r\n", b"ERROR\r\n");
    check(
        b"set a 0 0 -1\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    check(
        b"set a abc 0 1\r\nx\r\n",
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    check(
        b"set a -1 0 1\r\nx\r\n",
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    check(
        b"cas a 0 0 1 abc\r\nx\r\n",
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    check(b"cas b 0 0 1 abc noreply\r\nx\r\n", b"ERROR\r\n");
    let long_get = [b"get a ".as_slice(), &[b'k'; 251], b"\r\n"].concat();
    check(&long_get, b"CLIENT_ERROR bad command line format\r\n");
    let long_set = [b"set ".as_slice(), &[b'k'; 251], b" 0 0 1\r\nx\r\n"].concat();
    check(
        &long_set,
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    // ringstore refuses control characters in keys (memcached accepts them).
    check(
        b"set a\x01b 0 0 1\r\nx\r\n",
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
}

#[test]
fn bad_data_chunk() {
    check(
        b"set a 0 0 1\r\nxy\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
    );
    check(
        b"set a 0 0 1\r\nxyzw\r\nget a\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1 noreply\r\nxy\r\nget a\r\n",
        b"ERROR\r\nEND\r\n",
    );
}

#[test]
fn storage_modes() {
    check(
        b"set a 0 0 1\r\nx\r\nappend a 0 0 1\r\ny\r\nprepend a 0 0 1\r\nz\r\nget a\r\nappend q 0 0 1\r\ny\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\nVALUE a 0 3\r\nzxy\r\nEND\r\nNOT_STORED\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\nadd a 0 0 1\r\nx\r\nreplace q 0 0 1\r\nx\r\n",
        b"STORED\r\nNOT_STORED\r\nNOT_STORED\r\n",
    );
    check(
        b"add a 7 0 1\r\nx\r\nreplace a 8 0 2\r\nyy\r\nget a\r\n",
        b"STORED\r\nSTORED\r\nVALUE a 8 2\r\nyy\r\nEND\r\n",
    );
    check(
        b"set a 3 0 1\r\nx\r\nappend a 9 0 1\r\ny\r\nget a\r\n",
        b"STORED\r\nSTORED\r\nVALUE a 3 2\r\nxy\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1 noreply\r\nx\r\nget a\r\n",
        b"VALUE a 0 1\r\nx\r\nEND\r\n",
    );
    check(b"set a 0 -1 1\r\nx\r\nget a\r\n", b"STORED\r\nEND\r\n");
    check(
        b"set a 0 0 1\r\nx\r\nset a 0 -1 1\r\ny\r\nget a\r\n",
        b"STORED\r\nSTORED\r\nEND\r\n",
    );
    // An absolute exptime in the past (beyond 30 days = unix time).
    check(
        b"set a 0 1600000000 1\r\nx\r\nget a\r\n",
        b"STORED\r\nEND\r\n",
    );
    check(
        b"set a 0 1700000200 1\r\nx\r\nget a\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n",
    );
}

#[test]
fn cas_command() {
    check(b"cas a 0 0 1\r\n", b"ERROR\r\n");
    check(b"cas zz 0 0 1 99\r\nz\r\n", b"NOT_FOUND\r\n");
    check(
        b"set a 0 0 1\r\nx\r\ncas a 0 0 1 99\r\nz\r\n",
        b"STORED\r\nEXISTS\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\ngets a\r\ncas a 0 0 1 1\r\nz\r\ngets a\r\n",
        b"STORED\r\nVALUE a 0 1 1\r\nx\r\nEND\r\nSTORED\r\nVALUE a 0 1 2\r\nz\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\ncas a 0 0 1 1 noreply\r\nz\r\nget a\r\n",
        b"STORED\r\nVALUE a 0 1\r\nz\r\nEND\r\n",
    );
}

#[test]
fn incr_decr() {
    check(
        b"set n 0 0 2\r\n10\r\nincr n abc\r\nincr n 18446744073709551615\r\ndecr n 100\r\nincr nokey 1\r\n",
        b"STORED\r\nCLIENT_ERROR invalid numeric delta argument\r\n9\r\n0\r\nNOT_FOUND\r\n",
    );
    check(
        b"set n 0 0 20\r\n18446744073709551615\r\nincr n 1\r\n",
        b"STORED\r\n0\r\n",
    );
    check(b"set n 0 0 3\r\n 12\r\nincr n 1\r\n", b"STORED\r\n13\r\n");
    check(
        b"set n 0 0 3\r\n-12\r\nincr n 1\r\n",
        b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    check(
        b"set n 0 0 0\r\n\r\nincr n 1\r\n",
        b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\nincr a 1\r\n",
        b"STORED\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    check(
        b"incr n -1\r\n",
        b"CLIENT_ERROR invalid numeric delta argument\r\n",
    );
    check(
        b"incr\r\nincr a\r\nincr a 1 2\r\n",
        b"ERROR\r\nERROR\r\nNOT_FOUND\r\n",
    );
    check(
        b"set b 0 0 1\r\nx\r\nincr b 1 noreply\r\nincr b abc noreply\r\nget b\r\n",
        b"STORED\r\nVALUE b 0 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set n 7 0 1\r\n5\r\nincr n 2\r\nget n\r\n",
        b"STORED\r\n7\r\nVALUE n 7 1\r\n7\r\nEND\r\n",
    );
    // memcached rewrites shorter results in place, padded with spaces.
    check(
        b"set n 0 0 3\r\n100\r\ndecr n 1\r\nget n\r\n",
        b"STORED\r\n99\r\nVALUE n 0 3\r\n99 \r\nEND\r\n",
    );
    check(
        b"set n 0 0 20\r\n18446744073709551615\r\nincr n 1\r\nget n\r\n",
        b"STORED\r\n0\r\nVALUE n 0 20\r\n0                   \r\nEND\r\n",
    );
    check(
        b"set n 0 0 2\r\n99\r\nincr n 1\r\nget n\r\n",
        b"STORED\r\n100\r\nVALUE n 0 3\r\n100\r\nEND\r\n",
    );
}

#[test]
fn touch_delete_flush() {
    check(
        b"set a 0 0 1\r\nx\r\ntouch a 10\r\ntouch zz 10\r\ntouch a\r\ntouch a abc\r\n",
        b"STORED\r\nTOUCHED\r\nNOT_FOUND\r\nERROR\r\nCLIENT_ERROR invalid exptime argument\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\ntouch a 10 noreply\r\ntouch a -1\r\nget a\r\n",
        b"STORED\r\nTOUCHED\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\ndelete a\r\ndelete a\r\n",
        b"STORED\r\nDELETED\r\nNOT_FOUND\r\n",
    );
    check(
        b"delete a 0\r\ndelete a 5\r\ndelete a noreply\r\n",
        b"NOT_FOUND\r\nCLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
    );
    check(
        b"delete b 0 noreply\r\ndelete b 0 x\r\ndelete b x noreply\r\n",
        b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
    );
    check(b"flush_all\r\nflush_all 10\r\nflush_all 0 noreply\r\nflush_all noreply\r\nflush_all abc\r\n", b"OK\r\nOK\r\nCLIENT_ERROR invalid exptime argument\r\n");
    check(
        b"flush_all -1\r\nflush_all 1 2\r\nflush_all 1 2 3\r\n",
        b"OK\r\nOK\r\nERROR\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\nflush_all\r\nget a\r\nset a 0 0 1\r\ny\r\nget a\r\n",
        b"STORED\r\nOK\r\nEND\r\nSTORED\r\nVALUE a 0 1\r\ny\r\nEND\r\n",
    );
}

#[test]
fn huge_exptimes_and_lengths_truncate_like_memcached() {
    // memcached 1.6.18 truncates the long to int32: 2147483648 is negative, 99999999999
    // an absolute time in 2008 (both expired at once), 4294967301 is 5 s.
    check(
        b"set a 0 2147483648 1\r\nx\r\nset b 0 99999999999 1\r\nx\r\nset c 0 4294967301 1\r\nx\r\nget a b c\r\n",
        b"STORED\r\nSTORED\r\nSTORED\r\nVALUE c 0 1\r\nx\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\ngat 99999999999 a\r\nget a\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\nEND\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\nmg a v T2147483648\r\nget a\r\nms a 1 T99999999999\r\ny\r\nget a\r\n",
        b"STORED\r\nVA 1\r\nx\r\nEND\r\nHD\r\nEND\r\n",
    );
    // A data length of 4294967296 is 0: the block must be empty.
    check(
        b"set a 0 0 4294967296\r\nx\r\nset b 0 0 4294967296\r\n\r\nms c 4294967296\r\nx\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\nSTORED\r\nCLIENT_ERROR bad data chunk\r\nERROR\r\n",
    );
    check(
        b"set a 0 0 2147483648\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    // flush_all: an absolute time before the start flushes nothing; a negative one, all.
    check(
        b"set a 0 0 1\r\nx\r\nflush_all 99999999999\r\nget a\r\nflush_all 2147483648\r\nget a\r\n",
        b"STORED\r\nOK\r\nVALUE a 0 1\r\nx\r\nEND\r\nOK\r\nEND\r\n",
    );
}

#[test]
fn gat_gats() {
    check(
        b"set a 0 0 1\r\nx\r\ngat 100 a a\r\ngats -1 a\r\nget a\r\n",
        b"STORED\r\nVALUE a 0 1\r\nx\r\nVALUE a 0 1\r\nx\r\nEND\r\nVALUE a 0 1 1\r\nx\r\nEND\r\nEND\r\n",
    );
    check(b"gat 0 a\r\ngats 0 a\r\ngat a\r\ngat 0\r\ngat abc a\r\n", b"END\r\nEND\r\nCLIENT_ERROR invalid exptime argument\r\nEND\r\nCLIENT_ERROR invalid exptime argument\r\n");
}

#[test]
fn admin_commands() {
    check(
        b"version\r\nversion x\r\n",
        b"VERSION 1.6.18\r\nVERSION 1.6.18\r\n",
    );
    check(b"verbosity 1\r\nverbosity\r\nverbosity 1 noreply\r\nverbosity a\r\nverbosity 1 2 3\r\nverbosity noreply\r\n", b"OK\r\nERROR\r\nCLIENT_ERROR bad command line format\r\nERROR\r\n");
    check(b"stats reset\r\nstats detail\r\nstats detail on\r\nstats foo\r\nstats detail dump\r\nstats sizes\r\n", b"RESET\r\nCLIENT_ERROR usage: stats detail on|off|dump\r\nOK\r\nERROR\r\nEND\r\nSTAT sizes_status disabled\r\nEND\r\n");
    check(
        b"stats cachedump 1\r\nstats cachedump 1 1\r\n",
        b"CLIENT_ERROR bad command line\r\nEND\r\n",
    );
}

#[test]
fn quit_closes() {
    check(b"quit\r\n", b"");
    assert_eq!(run(b"quit\r\n").1, Flow::Close);
    check(b"get a\r\nquit\r\nget a\r\n", b"END\r\n");
    assert_eq!(run(b"quit x\r\nget a\r\n"), (Vec::new(), Flow::Close));
}

#[test]
fn meta_get_and_set() {
    check(
        b"ms foo 2\r\nhi\r\nmg foo v\r\nmg foo\r\nmg missing v k Oab\r\nmg missing v q k\r\nmn\r\n",
        b"HD\r\nVA 2\r\nhi\r\nHD\r\nEN kmissing Oab\r\nMN\r\n",
    );
    check(
        b"ms foo 2\r\nhi\r\nmg foo v\r\nmg foo s v f t c k O123 h l\r\n",
        b"HD\r\nVA 2\r\nhi\r\nVA 2 s2 f0 t-1 c1 kfoo O123 h1 l0\r\nhi\r\n",
    );
    check(
        b"ms foo 2 T100 F5\r\nhi\r\nmg foo f t v\r\n",
        b"HD\r\nVA 2 f5 t100\r\nhi\r\n",
    );
    check(b"ms foo 2 ME\r\nhi\r\nms foo 2 ME\r\nhi\r\nms foo 2 MR\r\nho\r\nms nothere 2 MR\r\nho\r\nms foo 1 MA\r\n!\r\nms foo 1 MP\r\n^\r\nmg foo v\r\n", b"HD\r\nNS\r\nHD\r\nNS\r\nHD\r\nHD\r\nVA 4\r\n^ho!\r\n");
    check(b"ms foo 2\r\nhi\r\nms foo 2 C99\r\nhi\r\nms foo 2 q\r\nhi\r\nms foo 2 C2 c\r\nyo\r\nmn\r\n", b"HD\r\nEX\r\nHD c3\r\nMN\r\n");
    check(
        b"ms x 1 MR q\r\nx\r\nms a 1 C1 q\r\nx\r\nmn\r\n",
        b"NS\r\nNF\r\nMN\r\n",
    );
    check(
        b"ms foo 2 k q\r\nhi\r\nmg foo q k v\r\nmg foo q k\r\nmn\r\n",
        b"VA 2 kfoo\r\nhi\r\nHD kfoo\r\nMN\r\n",
    );
    check(b"ms foo 2 T-1\r\nhi\r\nmg foo v\r\n", b"HD\r\nEN\r\n");
    check(
        b"ms foo 2\r\nhi\r\nmg foo T-1 v\r\nmg foo v\r\n",
        b"HD\r\nVA 2\r\nhi\r\nEN\r\n",
    );
    check(
        b"set a 0 0 1\r\nx\r\nmn\r\nms a 1 MS c\r\ny\r\nmg a Ox k c\r\n",
        b"STORED\r\nMN\r\nHD c2\r\nHD Ox ka c2\r\n",
    );
}

#[test]
fn meta_errors() {
    check(
        b"ms foo 2 MX\r\nhi\r\n",
        b"CLIENT_ERROR invalid mode for ms M token\r\n",
    );
    check(b"ms foo\r\n", b"CLIENT_ERROR bad command line format\r\n");
    check(
        b"ms foo abc\r\nhi\r\n",
        b"CLIENT_ERROR bad command line format\r\nERROR\r\n",
    );
    check(b"ms foo 2 Z\r\nhi\r\n", b"CLIENT_ERROR invalid flag\r\n");
    check(
        b"ms foo 2\r\nhiX\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
    );
    check(
        b"ms foo 2 q\r\nhiX\r\n",
        b"CLIENT_ERROR bad data chunk\r\nERROR\r\n",
    );
    check(
        b"ms foo 2 T100 F5 c k O1 b\r\nhi\r\n",
        b"CLIENT_ERROR error decoding key\r\n",
    );
    check(
        b"ms a 1 F-1\r\nx\r\n",
        b"CLIENT_ERROR bad command line format\r\n",
    );
    check(
        b"ms a 1 MEE\r\nx\r\n",
        b"CLIENT_ERROR incorrect length for M token\r\n",
    );
    check(b"mg foo v v\r\nmg foo zz\r\nmg\r\nmx foo\r\nmg foo Tabc\r\nmg a b\r\n", b"CLIENT_ERROR duplicate flag\r\nCLIENT_ERROR invalid flag\r\nERROR\r\nERROR\r\nCLIENT_ERROR bad token in command line format\r\nCLIENT_ERROR error decoding key\r\n");
    let opaque = [b"mg foo O".as_slice(), &[b'x'; 40], b"\r\n"].concat();
    check(&opaque, b"CLIENT_ERROR opaque token too long\r\n");
    check(b"me missing\r\nme\r\nme a b\r\nmn foo bar\r\n", b"EN\r\nCLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\nMN\r\n");
}

#[test]
fn meta_base64_keys() {
    check(
        b"ms Zm9v 2 b k c\r\nhi\r\nmg Zm9v b k v\r\nmg foo v\r\n",
        b"HD kZm9v b c1\r\nVA 2 kZm9v b\r\nhi\r\nVA 2\r\nhi\r\n",
    );
    check(b"mg YQ== b v k\r\n", b"EN kYQ== b\r\n");
}

#[test]
fn meta_delete_and_invalidate() {
    check(
        b"ms foo 2\r\nhi\r\nmd foo\r\nmd foo\r\nmd foo q\r\nmd foo k O9\r\n",
        b"HD\r\nHD\r\nNF\r\nNF\r\nNF kfoo O9\r\n",
    );
    check(b"ms foo 2\r\nhi\r\nmd foo q\r\nmn\r\n", b"HD\r\nMN\r\n");
    check(
        b"ms foo 2\r\nhi\r\nmd foo C99\r\nmd foo I T30\r\nmg foo v c\r\nmg foo v c\r\n",
        b"HD\r\nEX\r\nHD\r\nVA 2 c2 X W\r\nhi\r\nVA 2 c2 Z X\r\nhi\r\n",
    );
    check(
        b"md foo zz\r\n",
        b"CLIENT_ERROR invalid or duplicate flag\r\n",
    );
}

#[test]
fn meta_arithmetic() {
    check(
        b"ma cnt\r\nma cnt N0 J10\r\nma cnt v\r\nma cnt MD D3 v\r\nma cnt M- D100 v c t\r\nma cnt MX\r\nma cnt Dabc\r\nma cnt q\r\nmn\r\n",
        b"NF\r\nHD\r\nVA 2\r\n11\r\nVA 1\r\n8\r\nVA 1 c4 t-1\r\n0\r\nCLIENT_ERROR invalid mode for ma M token\r\nCLIENT_ERROR invalid or duplicate flag\r\nMN\r\n",
    );
    check(b"ma cnt N0 J5 v\r\n", b"VA 1\r\n5\r\n");
    check(
        b"ms t 2\r\nhi\r\nma t\r\n",
        b"HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
    );
    check(b"ma nope q\r\nmn\r\n", b"NF\r\nMN\r\n");
    check(
        b"ma a Jabc q\r\n",
        b"CLIENT_ERROR invalid or duplicate flag\r\n",
    );
}

#[test]
fn meta_vivify_and_tokens() {
    check(
        b"mg missing N30 v c\r\nmg missing v c\r\n",
        b"VA 0 c1 W\r\n\r\nVA 0 c1 Z\r\n\r\n",
    );
    check(b"mg missing N30 t\r\n", b"HD t30 W\r\n");
    check(
        b"ms foo 2 T10\r\nhi\r\nmg foo R30 c\r\nmg foo R30 c\r\n",
        b"HD\r\nHD c1 W\r\nHD c1 Z\r\n",
    );
}

#[test]
fn meta_debug() {
    check(
        b"ms foo 2 T30\r\nhi\r\nme foo\r\n",
        b"HD\r\nME foo exp=-30 la=0 cas=1 fetch=no cls=1 size=64\r\n",
    );
}

#[test]
fn too_large_values_are_swallowed() {
    let mut input = b"set big 0 0 1\r\nx\r\nset big 0 0 2000\r\n".to_vec();
    input.extend_from_slice(&[b'v'; 2000]);
    input.extend_from_slice(b"\r\nget big\r\n");
    check(
        &input,
        b"STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\n",
    );
    let mut input = b"add big 0 0 2000 noreply\r\n".to_vec();
    input.extend_from_slice(&[b'v'; 2002]);
    input.extend_from_slice(b"get big\r\n");
    check(&input, b"END\r\n");
    let mut input = b"ms big 2000 T0\r\n".to_vec();
    input.extend_from_slice(&[b'v'; 2002]);
    input.extend_from_slice(b"mn\r\n");
    check(&input, b"SERVER_ERROR object too large for cache\r\nMN\r\n");
}

#[test]
fn overlong_lines() {
    // memcached closes on a non-get line over 2048 bytes without a newline, silently.
    let junk = vec![b'x'; 3000];
    assert_eq!(run(&junk), (Vec::new(), Flow::Close));
    // A long multi-get is kept waiting for its newline ...
    let mut get = b"get".to_vec();
    for _ in 0..1500 {
        get.extend_from_slice(b" a");
    }
    let shared = shared();
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    assert_eq!(
        s.on_bytes(&get, NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert!(s.has_partial_request());
    assert_eq!(
        s.on_bytes(b"\r\n", NOW, &shared, None, &mut out),
        Flow::Continue
    );
    assert_eq!(out, b"END\r\n");
    assert!(!s.has_partial_request());
    // ... up to the hard bound, then it is refused and the connection closed.
    let mut huge = b"get".to_vec();
    while huge.len() < ITEM_MAX + 2048 + 10 {
        huge.extend_from_slice(b" a");
    }
    let (out, flow) = run(&huge);
    assert_eq!(
        (out.as_slice(), flow),
        (&b"CLIENT_ERROR line too long\r\n"[..], Flow::Close)
    );
}

#[test]
fn backpressure_drains_and_keeps_order() {
    let store = Store::new(StoreConfig {
        memory_bytes: 8 << 20,
        item_size_max: ITEM_MAX,
        shards: 2,
        huge_pages: false,
        external_threshold: 0,
    })
    .expect("store");
    let config = ServiceConfig {
        item_size_max: ITEM_MAX,
        max_line: 2048,
        out_high_water: 64,
        max_conns: 10,
        object_size_max: 0,
        conn_memory: 64 << 20,
    };
    let shared = Shared::new(store, config, Topology::default(), 1, 1, 0);
    let mut input = b"set a 0 0 40\r\n".to_vec();
    input.extend_from_slice(&[b'z'; 40]);
    input.extend_from_slice(b"\r\n");
    for _ in 0..5 {
        input.extend_from_slice(b"get a\r\n");
    }
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut flow = s.on_bytes(&input, NOW, &shared, None, &mut out);
    let mut sent = Vec::new();
    let mut drains = 0;
    while flow == Flow::Drain {
        drains += 1;
        assert!(s.has_partial_request());
        sent.append(&mut out); // the runtime sends and empties the buffer
        flow = s.on_bytes(&[], NOW, &shared, None, &mut out);
    }
    sent.append(&mut out);
    assert!(drains >= 2, "drained {drains} times");
    assert_eq!(flow, Flow::Continue);
    let one = [b"VALUE a 0 40\r\n".as_slice(), &[b'z'; 40], b"\r\nEND\r\n"].concat();
    assert_eq!(sent, [b"STORED\r\n".as_slice(), &one.repeat(5)].concat());
}

#[test]
fn stats_lists_no_hostname_when_none_is_known() {
    let shared = shared();
    let (out, _) = feed(&shared, &[b"stats\r\n"]);
    assert!(String::from_utf8_lossy(&out).contains("STAT hostname cache-01\r\n"));
    let unnamed = shared_on(Topology::default());
    let (out, _) = feed(&unnamed, &[b"stats\r\n"]);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.ends_with("END\r\n") && !text.contains("hostname"),
        "{text}"
    );
}

#[test]
fn stats_reports_counters_and_topology() {
    let shared = shared();
    let (out, _) = feed(
        &shared,
        &[b"set a 0 0 1\r\nx\r\nget a\r\nget b\r\nstats\r\n"],
    );
    let text = String::from_utf8(out).expect("ascii");
    for line in [
        "STAT pid 42\r\n",
        "STAT uptime 100\r\n",
        "STAT time 1700000100\r\n",
        "STAT version 1.6.18\r\n",
        "STAT cmd_get 2\r\n",
        "STAT cmd_set 1\r\n",
        "STAT get_hits 1\r\n",
        "STAT get_misses 1\r\n",
        "STAT curr_items 1\r\n",
        "STAT threads 2\r\n",
        "STAT numa_node 1\r\n",
        "STAT worker_cpus 2,3\r\n",
        "STAT hostname cache-01\r\n",
        "STAT hugepage_bytes 0\r\n",
        "STAT worker_capeff 0000000000000000\r\n",
        "STAT max_connections 10\r\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in {text}");
    }
    assert!(text.ends_with("END\r\n"));
    let (out, _) = feed(&shared, &[b"stats reset\r\nstats\r\n"]);
    let text = String::from_utf8(out).expect("ascii");
    assert!(text.contains("STAT cmd_get 0\r\n"), "{text}");
    // Bytes are counted when read: the reset in the same read zeroes them too, as in memcached.
    assert!(text.contains("STAT bytes_read 0\r\n"), "{text}");
    let (out, _) = feed(
        &shared,
        &[b"stats settings\r\nstats items\r\nstats slabs\r\n"],
    );
    let text = String::from_utf8(out).expect("ascii");
    assert!(
        text.contains("STAT item_size_max 1024\r\n")
            && text.contains("STAT items:1:number 1\r\n")
            && text.contains("STAT active_slabs 1\r\n"),
        "{text}"
    );
    assert_eq!(text.matches("END\r\n").count(), 3);
}

#[test]
fn connection_counters() {
    let shared = shared();
    shared.conn_opened(0);
    shared.conn_opened(1);
    shared.conn_closed(0);
    shared.conn_refused();
    assert_eq!(shared.curr_connections(), 1);
    assert_eq!(shared.rejected_connections(), 1);
    assert_eq!(shared.totals().conns_opened, 2);
    // A worker index past the end lands in the spare slot instead of panicking.
    shared.stats(99).cmd_get.inc();
    assert_eq!(shared.stats(shared.aux_slot()).cmd_get.get(), 1);
}

/// A pipelined stream of 900-byte sets (under this store's item limit) cut wherever a receive buffer ends (inside values,
/// inside lines, exactly at a request's end): each set completes from the head of the next
/// chunk and the rest of that chunk is parsed where it lies; the replies and the values
/// read back are those of the whole stream fed at once.
#[test]
fn pipelined_big_sets_cut_anywhere_store_every_value() {
    let mut input = Vec::new();
    let mut expected = Vec::new();
    for i in 0..16u8 {
        let value = vec![b'a' + i; 900];
        input.extend_from_slice(format!("set k{i} {i} 0 900\r\n").as_bytes());
        input.extend_from_slice(&value);
        input.extend_from_slice(b"\r\n");
        expected.extend_from_slice(b"STORED\r\n");
    }
    for i in 0..16u8 {
        input.extend_from_slice(format!("get k{i}\r\n").as_bytes());
        expected.extend_from_slice(format!("VALUE k{i} {i} 900\r\n").as_bytes());
        expected.extend_from_slice(&vec![b'a' + i; 900]);
        expected.extend_from_slice(b"\r\nEND\r\n");
    }
    let (whole, _) = run(&input);
    assert_eq!(whole, expected);
    let request = "set k0 0 0 900\r\n".len() + 902; // the first sets' length, to cut at their ends
    for size in [4096, 1000, 901, request, request + 1, request - 1, 7] {
        let chunks: Vec<&[u8]> = input.chunks(size).collect();
        let (split, flow) = feed(&shared(), &chunks);
        assert_eq!(split, expected, "chunks of {size}");
        assert_eq!(flow, Flow::Continue);
    }
}

mod split_proptest {
    use super::*;
    use proptest::prelude::*;

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        let frag = prop_oneof![
            Just(b"set k 0 0 3\r\nabc\r\n".to_vec()),
            Just(b"get k j\r\n".to_vec()),
            Just(b"gets k\r\n".to_vec()),
            Just(b"incr k 1\r\n".to_vec()),
            Just(b"set n 0 0 1\r\n9\r\nincr n 5\r\n".to_vec()),
            Just(b"ms k 2 T10 c k v\r\nhi\r\n".to_vec()),
            Just(b"mg k v c f t s k O1 q\r\n".to_vec()),
            Just(b"mg z N5 v c\r\n".to_vec()),
            Just(b"ma c N0 J5 MD D2 v\r\n".to_vec()),
            Just(b"md k q I T5\r\nmn\r\n".to_vec()),
            Just(b"set k 0 0 2000\r\n".to_vec()),
            Just(b"set k 0 0 1\r\nxy\r\n".to_vec()),
            Just(b"delete k\r\n".to_vec()),
            Just(b"stats detail\r\n".to_vec()),
            prop::collection::vec(any::<u8>(), 0..24),
        ];
        prop::collection::vec(frag, 0..10).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

        /// However the runtime chunks a stream, the replies are the same bytes.
        #[test]
        fn chunking_does_not_change_replies(input in stream(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6)) {
            let (whole, flow) = run(&input);
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
            points.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for p in points {
                chunks.push(&input[at..p]);
                at = p;
            }
            chunks.push(&input[at..]);
            let (split, f) = feed(&shared(), &chunks);
            prop_assert_eq!(split, whole);
            prop_assert_eq!(f, flow);
        }
    }
}

/// A data device for session tests: each record gets the next token; while `refuse` is set
/// it refuses like a full device.
#[derive(Default)]
pub(super) struct TestDevice {
    refuse: std::sync::atomic::AtomicBool,
    staged: std::sync::atomic::AtomicU64,
}

impl ringstore_store::Journal for TestDevice {
    fn record(&self, _: ringstore_store::Mutation<'_>) -> Result<(), ringstore_store::StoreError> {
        if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ringstore_store::StoreError::OutOfMemory);
        }
        self.staged
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl crate::Device for TestDevice {
    fn staged(&self) -> u64 {
        self.staged.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn chunk_len(&self) -> usize {
        0
    }
    fn region_len(&self) -> u64 {
        0
    }
    fn new_object_id(&self) -> u64 {
        0
    }
    fn stage_chunk(&self, _: u64, _: u32, _: &[u8]) -> Result<(), ringstore_store::StoreError> {
        Err(ringstore_store::StoreError::OutOfMemory)
    }
    fn abandon_object(&self, _: u64, _: u32) {}
    fn read_chunk(&self, _: u64, _: u32) -> Option<Vec<u8>> {
        None
    }
    fn read_chunk_range(&self, _: u64, _: u32, _: usize, _: usize) -> Option<Vec<u8>> {
        None
    }
    fn stats(&self, _: &mut dyn FnMut(&'static str, u64)) {}
}

/// [`feed`] with a data device: after each call every staged token is settled, as failed
/// when it is in `fail`.
fn feed_device(
    shared: &Shared,
    device: &TestDevice,
    fail: &[u64],
    chunks: &[&[u8]],
) -> (Vec<u8>, Flow) {
    use crate::Device;
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let mut flow = Flow::Continue;
    let mut settled = device.staged();
    for c in chunks {
        flow = s.on_bytes(c, NOW, shared, Some(device), &mut out);
        loop {
            while settled < device.staged() {
                settled += 1;
                s.on_durable(settled, !fail.contains(&settled), shared, &mut out);
            }
            assert!(!s.awaits_durable(), "every token is settled");
            if flow != Flow::Drain {
                break;
            }
            flow = s.on_bytes(&[], NOW, shared, Some(device), &mut out);
        }
        if flow == Flow::Close {
            break;
        }
    }
    (out, flow)
}

#[test]
fn a_reply_waits_for_its_records_and_a_failed_one_is_the_error_in_its_place() {
    use crate::Device;
    let shared = shared();
    let device = TestDevice::default();
    let mut s = Session::new(Protocol::Memcache, 0);
    let mut out = Vec::new();
    let input = b"get a\r\nset a 0 0 1\r\nx\r\nget a\r\nset b 0 0 1 noreply\r\ny\r\nset c 0 0 1\r\nz\r\nget zz\r\n";
    assert_eq!(
        s.on_bytes(input, NOW, &shared, Some(&device), &mut out),
        Flow::Continue
    );
    assert_eq!(
        out, b"END\r\n",
        "everything after the first set waits for token 1"
    );
    assert!(s.awaits_durable());
    assert_eq!(device.staged(), 3);
    s.on_durable(1, true, &shared, &mut out);
    assert_eq!(out, b"END\r\nSTORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n");
    s.on_durable(2, false, &shared, &mut out);
    assert_eq!(
        out.len(),
        34,
        "a failed noreply set answers nothing; c still waits"
    );
    s.on_durable(3, false, &shared, &mut out);
    assert_eq!(
        String::from_utf8_lossy(&out[34..]),
        "SERVER_ERROR data device write failed\r\nEND\r\n"
    );
    assert!(!s.awaits_durable());
}

#[test]
fn refused_touches_answer_the_error_and_change_nothing() {
    let shared = shared();
    let device = TestDevice::default();
    shared.store.require_journal();
    let (out, _) = feed_device(
        &shared,
        &device,
        &[],
        &[b"set a 0 0 1\r\nx\r\nset b 0 0 1\r\ny\r\nmg b T0\r\n"],
    );
    assert_eq!(out, b"STORED\r\nSTORED\r\nHD\r\n");
    device
        .refuse
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let oom = "SERVER_ERROR out of memory storing object\r\n";
    let (out, _) = feed_device(
        &shared,
        &device,
        &[],
        &[b"touch a 10\r\ngat 10 a\r\ngats 10 zz a\r\ngat -1 a\r\ntouch a -1\r\nmg a T10 v\r\nmg a T10 q\r\nmg b T10 N30 v\r\ntouch a 10 noreply\r\ntouch zz 10\r\nget a\r\nmg a t v\r\n"],
    );
    let expected = format!(
        "{oom}{oom}{oom}{oom}{oom}{oom}{oom}{oom}NOT_FOUND\r\nVALUE a 0 1\r\nx\r\nEND\r\nVA 1 t-1\r\nx\r\n"
    );
    assert_eq!(String::from_utf8_lossy(&out), expected);
}

#[test]
fn response_marks_split_the_output_as_memcached_frames_udp_replies() {
    use crate::memcache::ResponseMark;
    let shared = shared();
    feed(&shared, &[b"set a 0 0 1\r\n1\r\nset b 0 0 1\r\n2\r\n"]);
    let mut s = Session::new(Protocol::Memcache, 0);
    s.mark_responses();
    let mut out = Vec::new();
    let flow = s.on_bytes(
        b"get x a x b\r\nset q 0 0 1 noreply\r\nq\r\ndelete x\r\n",
        NOW,
        &shared,
        None,
        &mut out,
    );
    assert_eq!(flow, Flow::Continue);
    let text = b"VALUE a 0 1\r\n1\r\nVALUE b 0 1\r\n2\r\nEND\r\nNOT_FOUND\r\n";
    assert_eq!(out, text);
    let a_end = b"VALUE a 0 1\r\n1\r\n".len();
    let get_end = a_end + b"VALUE b 0 1\r\n2\r\nEND\r\n".len();
    let keep = |end| ResponseMark {
        end,
        keep_empty: true,
    };
    let command = |end| ResponseMark {
        end,
        keep_empty: false,
    };
    // One per key but the last (misses included), one per command (noreply too).
    assert_eq!(
        s.take_response_marks(),
        [
            keep(0),
            keep(a_end),
            keep(a_end),
            command(get_end),
            command(get_end),
            command(out.len())
        ]
    );
    assert!(s.take_response_marks().is_empty(), "taken");
    // A session not asked to mark notes nothing.
    let mut plain = Session::new(Protocol::Memcache, 0);
    plain.on_bytes(b"get a b\r\n", NOW, &shared, None, &mut Vec::new());
    assert!(plain.take_response_marks().is_empty());
    // The marks are bounded: 5000 commands in one input note at most RESPONSE_MARKS_MAX.
    let mut many = Session::new(Protocol::Memcache, 0);
    many.mark_responses();
    let mut out = Vec::new();
    many.on_bytes(&b"mn\r\n".repeat(5000), NOW, &shared, None, &mut out);
    assert_eq!(out.len(), 5000 * 4);
    assert_eq!(
        many.take_response_marks().len(),
        crate::memcache::RESPONSE_MARKS_MAX
    );
}

/// `stats slabs` as name → value, for the lines that are numbers.
fn slab_stats(shared: &Arc<Shared>) -> std::collections::HashMap<String, u64> {
    let (out, _) = feed(shared, &[b"stats slabs\r\n"]);
    let text = String::from_utf8(out).expect("ascii");
    assert!(text.ends_with("END\r\n"), "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .map(|l| {
            let (k, v) = l.split_once(' ').expect("name value");
            (k.to_string(), v.parse().expect("number"))
        })
        .collect()
}

#[test]
fn stats_slabs_reports_class_1_from_the_segments() {
    let shared = shared();
    let empty = slab_stats(&shared);
    assert_eq!(empty.len(), 2, "{empty:?}");
    assert_eq!(empty["active_slabs"], 0);
    let (out, _) = feed(
        &shared,
        &[b"set a 0 0 10\r\n0123456789\r\nset b 0 0 10\r\n0123456789\r\nset c 0 0 1\r\nx\r\nget a\r\ndelete c\r\nincr a 1\r\ntouch b 0\r\n"],
    );
    assert!(
        out.ends_with(b"TOUCHED\r\n"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    let s = slab_stats(&shared);
    assert_eq!(s["active_slabs"], 1);
    assert_eq!(s["1:used_chunks"], 2);
    let chunk = s["1:chunk_size"];
    assert!(chunk.trailing_zeros() >= 3 && chunk > 10, "{s:?}");
    assert_eq!(
        s["1:total_chunks"],
        s["1:total_pages"] * s["1:chunks_per_page"]
    );
    assert_eq!(s["1:free_chunks"] + s["1:used_chunks"], s["1:total_chunks"]);
    assert!(s["1:total_pages"] >= 1 && s["1:free_chunks_end"] <= s["1:free_chunks"]);
    // Little is written yet: most of the held segments' space is their unwritten tails.
    assert!(s["1:free_chunks_end"] * 2 > s["1:free_chunks"], "{s:?}");
    let st = shared.store.stats();
    assert_eq!(s["total_malloced"], st.segment_bytes);
    assert_eq!(s["1:total_pages"] * st.segment_size, st.segment_bytes);
    assert_eq!(s["1:chunks_per_page"], st.segment_size / chunk);
    for (name, want) in [
        ("1:get_hits", 1),
        ("1:cmd_set", 3),
        ("1:delete_hits", 1),
        ("1:incr_hits", 1),
        ("1:touch_hits", 1),
        ("1:cas_hits", 0),
    ] {
        assert_eq!(s[name], want, "{name}: {s:?}");
    }
}
