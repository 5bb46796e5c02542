//! memcached_exporter's series, derived the way that exporter derives them from `stats`,
//! `stats settings` and `stats items` (its default collectors; docs/METRICS.md has the
//! table). The lines come from the same code that answers those commands, so a scrape and a
//! `stats` at the same moment agree by construction; a stat ringstore does not report gives
//! no series, as the exporter skips a missing key.

use super::text::{Exposition, Kind};

/// `stats` (general) keys mapped one to one: metric, type, stat key, help.
const GENERAL: &[(&str, Kind, &str, &str)] = &[
    (
        "memcached_uptime_seconds",
        Kind::Counter,
        "uptime",
        "Number of seconds since the server started.",
    ),
    (
        "memcached_time_seconds",
        Kind::Gauge,
        "time",
        "current UNIX time according to the server.",
    ),
    (
        "memcached_process_user_cpu_seconds_total",
        Kind::Counter,
        "rusage_user",
        "Accumulated user time for this process.",
    ),
    (
        "memcached_process_system_cpu_seconds_total",
        Kind::Counter,
        "rusage_system",
        "Accumulated system time for this process.",
    ),
    (
        "memcached_current_bytes",
        Kind::Gauge,
        "bytes",
        "Current number of bytes used to store items.",
    ),
    (
        "memcached_limit_bytes",
        Kind::Gauge,
        "limit_maxbytes",
        "Number of bytes this server is allowed to use for storage.",
    ),
    (
        "memcached_current_items",
        Kind::Gauge,
        "curr_items",
        "Current number of items stored by this instance.",
    ),
    (
        "memcached_items_total",
        Kind::Counter,
        "total_items",
        "Total number of items stored during the life of this instance.",
    ),
    (
        "memcached_read_bytes_total",
        Kind::Counter,
        "bytes_read",
        "Total number of bytes read by this server from network.",
    ),
    (
        "memcached_written_bytes_total",
        Kind::Counter,
        "bytes_written",
        "Total number of bytes sent by this server to network.",
    ),
    (
        "memcached_current_connections",
        Kind::Gauge,
        "curr_connections",
        "Current number of open connections.",
    ),
    (
        "memcached_connections_total",
        Kind::Counter,
        "total_connections",
        "Total number of connections opened since the server started running.",
    ),
    (
        "memcached_connections_rejected_total",
        Kind::Counter,
        "rejected_connections",
        "Total number of connections rejected due to hitting the connection limit.",
    ),
    (
        "memcached_connections_yielded_total",
        Kind::Counter,
        "conn_yields",
        "Total number of connections yielded running due to hitting the output limit.",
    ),
    (
        "memcached_connections_listener_disabled_total",
        Kind::Counter,
        "listen_disabled_num",
        "Number of times the server has hit its connections limit and disabled its listener.",
    ),
    (
        "memcached_items_evicted_total",
        Kind::Counter,
        "evictions",
        "Total number of valid items removed from cache to free memory for new items.",
    ),
    (
        "memcached_items_reclaimed_total",
        Kind::Counter,
        "reclaimed",
        "Total number of times an entry was stored using memory from an expired entry.",
    ),
    (
        "memcached_item_too_large_total",
        Kind::Counter,
        "store_too_large",
        "The number of times an item exceeded the max-item-size when being stored.",
    ),
    (
        "memcached_item_no_memory_total",
        Kind::Counter,
        "store_no_memory",
        "The number of times an item could not be stored due to no more memory.",
    ),
    (
        "memcached_lru_crawler_starts_total",
        Kind::Counter,
        "lru_crawler_starts",
        "Times an LRU crawler was started.",
    ),
    (
        "memcached_direct_reclaims_total",
        Kind::Counter,
        "direct_reclaims",
        "Times worker threads had to directly reclaim or evict items.",
    ),
    (
        "memcached_lru_crawler_items_checked_total",
        Kind::Counter,
        "crawler_items_checked",
        "Total items examined by LRU Crawler.",
    ),
    (
        "memcached_lru_crawler_reclaimed_total",
        Kind::Counter,
        "crawler_reclaimed",
        "Total items freed by LRU Crawler.",
    ),
    (
        "memcached_lru_crawler_moves_to_cold_total",
        Kind::Counter,
        "moves_to_cold",
        "Total number of items moved from HOT/WARM to COLD LRU's.",
    ),
    (
        "memcached_lru_crawler_moves_to_warm_total",
        Kind::Counter,
        "moves_to_warm",
        "Total number of items moved from COLD to WARM LRU.",
    ),
    (
        "memcached_lru_crawler_moves_within_lru_total",
        Kind::Counter,
        "moves_within_lru",
        "Total number of items reshuffled within HOT or WARM LRU's.",
    ),
    (
        "memcached_malloced_bytes",
        Kind::Gauge,
        "total_malloced",
        "Number of bytes of memory allocated to slab pages.",
    ),
    (
        "memcached_accepting_connections",
        Kind::Gauge,
        "accepting_conns",
        "The server is currently accepting new connections.",
    ),
];

/// `stats items` fields (`items:<slab>:<field>`): metric, type, field, help. Each series
/// carries `slab`.
const ITEMS: &[(&str, Kind, &str, &str)] = &[
    ("memcached_slab_current_items", Kind::Gauge, "number", "Number of items currently stored in this slab class."),
    ("memcached_slab_items_age_seconds", Kind::Gauge, "age", "Number of seconds the oldest item has been in the slab class."),
    ("memcached_slab_items_evicted_total", Kind::Counter, "evicted", "Total number of times an item had to be evicted from the LRU before it expired."),
    ("memcached_slab_items_reclaimed_total", Kind::Counter, "reclaimed", "Total number of items reclaimed."),
    ("memcached_slab_items_expired_unfetched_total", Kind::Counter, "expired_unfetched", "Total number of valid items evicted from the LRU which were never touched after being set."),
    ("memcached_slab_items_evicted_unfetched_total", Kind::Counter, "evicted_unfetched", "Total nmber of items evicted and never fetched."),
    ("memcached_slab_items_outofmemory_total", Kind::Counter, "outofmemory", "Total number of items for this slab class that have triggered an out of memory error."),
];

/// `memcached_commands_total`'s one-to-one series: stat key, command, status.
const COMMANDS: &[(&str, &str, &str)] = &[
    ("get_hits", "get", "hit"),
    ("get_misses", "get", "miss"),
    ("delete_hits", "delete", "hit"),
    ("delete_misses", "delete", "miss"),
    ("incr_hits", "incr", "hit"),
    ("incr_misses", "incr", "miss"),
    ("decr_hits", "decr", "hit"),
    ("decr_misses", "decr", "miss"),
    ("cas_hits", "cas", "hit"),
    ("cas_misses", "cas", "miss"),
    ("touch_hits", "touch", "hit"),
    ("touch_misses", "touch", "miss"),
    ("cas_badval", "cas", "badval"),
    ("cmd_flush", "flush", "hit"),
];

/// `STAT name value` lines of a `stats` reply.
pub struct StatLines<'a>(pub &'a [u8]);

impl<'a> StatLines<'a> {
    /// Every `(name, value)` pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let text = std::str::from_utf8(self.0).unwrap_or("");
        text.split("\r\n").filter_map(|line| {
            let rest = line.strip_prefix("STAT ")?;
            rest.split_once(' ')
        })
    }

    /// The value of `name`.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
}

/// Writes the memcached_* series of `general`, `settings` and `items` (`stats` replies).
pub fn write(
    e: &mut Exposition<'_>,
    general: &StatLines<'_>,
    settings: &StatLines<'_>,
    items: &StatLines<'_>,
) {
    e.head(
        "memcached_up",
        Kind::Gauge,
        "Could the memcached server be reached.",
    );
    e.sample("memcached_up", "", "1");
    if let Some(v) = general.get("version") {
        e.head(
            "memcached_version",
            Kind::Gauge,
            "The version of this memcached server.",
        );
        e.sample_labelled("memcached_version", &[("version", v)], "1");
    }
    commands(e, general);
    for &(metric, kind, key, help) in GENERAL {
        if let Some(v) = general.get(key).filter(|v| v.parse::<f64>().is_ok()) {
            e.head(metric, kind, help);
            e.sample(metric, "", v);
        }
    }
    if let Some(v) = settings.get("maxconns") {
        e.head(
            "memcached_max_connections",
            Kind::Gauge,
            "Maximum number of clients allowed.",
        );
        e.sample("memcached_max_connections", "", v);
    }
    if settings.get("lru_crawler") == Some("yes") {
        // The exporter then reads the LRU settings; ringstore has none but the switch.
        e.head(
            "memcached_lru_crawler_enabled",
            Kind::Gauge,
            "Whether the LRU crawler is enabled.",
        );
        e.sample("memcached_lru_crawler_enabled", "", "1");
    }
    slab_items(e, items);
}

/// `memcached_commands_total`: hits and misses, `cas_badval`, `cmd_flush`, and `cmd_set`
/// less the cas counts (memcached counts a cas in cmd_set too).
fn commands(e: &mut Exposition<'_>, s: &StatLines<'_>) {
    let name = "memcached_commands_total";
    e.head(
        name,
        Kind::Counter,
        "Total number of all requests broken down by command (get, set, etc.) and status.",
    );
    for &(key, command, status) in COMMANDS {
        if let Some(v) = s.get(key) {
            e.sample_labelled(name, &[("command", command), ("status", status)], v);
        }
    }
    // ringstore's counts are whole numbers: the difference is exact (the exporter's float
    // subtraction gives the same value below 2^53).
    let int = |k: &str| s.get(k).and_then(|v| v.parse::<i128>().ok());
    let cas = ["cas_misses", "cas_hits", "cas_badval"].map(int);
    if let (Some(set), [Some(a), Some(b), Some(c)]) = (int("cmd_set"), cas) {
        let v = (set - (a + b + c)).to_string();
        e.sample_labelled(name, &[("command", "set"), ("status", "hit")], &v);
    }
}

/// `memcached_slab_*{slab}` from `items:<slab>:<field>` lines, one family at a time.
fn slab_items(e: &mut Exposition<'_>, items: &StatLines<'_>) {
    for &(metric, kind, field, help) in ITEMS {
        let mut headed = false;
        for (name, value) in items.iter() {
            let Some((slab, f)) = name.strip_prefix("items:").and_then(|r| r.split_once(':'))
            else {
                continue;
            };
            if f != field || value.parse::<f64>().is_err() {
                continue;
            }
            if !headed {
                e.head(metric, kind, help);
                headed = true;
            }
            e.sample_labelled(metric, &[("slab", slab)], value);
        }
    }
}
