//! `hotkeys [N]`: the keys read and written most, from the server's sampled sketches
//! (memcache `stats hotkeys N`, answered in-process; ADR 0044).

use serde_json::{json, Value};

use super::ctx::Ctx;
use super::output::Output;

/// The reply of `stats hotkeys 100` is at most 100 × 3 lines of a 340-byte base64 key.
const REPLY_MAX: usize = 64 << 10;

/// `hotkeys [N]`: N (1 to 100, default 10) keys, ranked.
pub fn run(ctx: &mut Ctx, args: &[&str]) -> Output {
    let n = match args {
        [] => 10,
        [n] => match n.parse::<u32>() {
            Ok(n @ 1..) => n.min(100),
            _ => return Output::error(format!("not a count from 1 to 100: {n}")),
        },
        _ => return Output::error("usage: hotkeys [N]"),
    };
    let request = format!("stats hotkeys {n}\r\n");
    match ctx
        .machine
        .with_server(|s| Ok(s.admin(request.as_bytes(), REPLY_MAX)))
    {
        Ok(reply) => listing(&reply),
        Err(why) => Output::error(why),
    }
}

/// The `STAT hotkey:<rank>:<field> <value>` lines as a table (`RANK COUNT KEY`, a base64 key
/// marked `(base64)`) and as `hotkeys`: [{`rank`, `key`, `count`, `base64`}].
fn listing(reply: &[u8]) -> Output {
    let mut keys: Vec<Value> = Vec::new();
    for line in String::from_utf8_lossy(reply).lines() {
        let Some((name, value)) = line
            .strip_prefix("STAT hotkey:")
            .and_then(|l| l.split_once(' '))
        else {
            continue;
        };
        let Some((rank, field)) = name.split_once(':') else {
            continue;
        };
        let Ok(rank) = rank.parse::<u64>() else {
            continue;
        };
        if keys.last().and_then(|k| k["rank"].as_u64()) != Some(rank) {
            keys.push(json!({"rank": rank, "key": "", "count": 0, "base64": false}));
        }
        let Some(entry) = keys.last_mut() else {
            continue;
        };
        match field {
            "key" => entry["key"] = value.into(),
            "count" => entry["count"] = value.parse::<u64>().unwrap_or(0).into(),
            "base64" => entry["base64"] = (value == "1").into(),
            _ => {}
        }
    }
    let mut out = Output::new();
    if keys.is_empty() {
        out.line("no keys sampled yet");
    }
    for k in &keys {
        let note = if k["base64"] == true { " (base64)" } else { "" };
        let (rank, count) = (
            k["rank"].as_u64().unwrap_or(0),
            k["count"].as_u64().unwrap_or(0),
        );
        let key = k["key"].as_str().unwrap_or("");
        out.line(format!("{rank:>3} {count:>12} {key}{note}"));
    }
    out.set("hotkeys", keys);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stats_lines_become_a_ranked_table() {
        let reply = b"STAT hotkey:1:key user:1\r\nSTAT hotkey:1:count 6400\r\n\
            STAT hotkey:2:key AAH/\r\nSTAT hotkey:2:base64 1\r\nSTAT hotkey:2:count 32\r\nEND\r\n";
        let out = listing(reply);
        assert_eq!(
            out.text,
            ["  1         6400 user:1", "  2           32 AAH/ (base64)"]
        );
        assert_eq!(
            out.fields["hotkeys"],
            json!([
                {"rank": 1, "key": "user:1", "count": 6400, "base64": false},
                {"rank": 2, "key": "AAH/", "count": 32, "base64": true},
            ])
        );
        assert_eq!(listing(b"END\r\n").text, ["no keys sampled yet"]);
    }
}
