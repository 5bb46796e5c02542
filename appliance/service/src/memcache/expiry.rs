//! memcached exptime rules: 0 never expires, up to 30 days is relative, beyond is an
//! absolute Unix time, negative (or an absolute time already past) is expired on arrival.

use ringstore_store::{Time, NEVER};

use crate::Now;

/// memcached's `REALTIME_MAXDELTA`: 30 days.
pub const RELATIVE_LIMIT: i64 = 60 * 60 * 24 * 30;

/// An exptime converted to store time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// Expires at this store time ([`NEVER`] = never).
    At(Time),
    /// Already expired: the item is as good as gone.
    Expired,
}

/// Converts a memcached exptime with the clock the runtime read.
pub fn expiry(exptime: i64, now: Now) -> Expiry {
    let relative = match exptime {
        0 => return Expiry::At(NEVER),
        e if e < 0 => return Expiry::Expired,
        e if e <= RELATIVE_LIMIT => e,
        e => {
            let unix = i64::try_from(now.unix).unwrap_or(i64::MAX);
            if e <= unix {
                return Expiry::Expired;
            }
            e - unix
        }
    };
    let at = i64::from(now.store).saturating_add(relative);
    Expiry::At(Time::try_from(at).unwrap_or(Time::MAX).max(1))
}

/// Seconds left until `exptime` (meta `t`), or -1 for never.
pub fn ttl_left(exptime: Time, now: Now) -> i64 {
    if exptime == NEVER {
        -1
    } else {
        i64::from(exptime) - i64::from(now.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcached_rules() {
        let now = Now {
            store: 100,
            unix: 1_700_000_000,
            mono_ms: 0,
            mono_ns: 0,
        };
        assert_eq!(expiry(0, now), Expiry::At(NEVER));
        assert_eq!(expiry(-1, now), Expiry::Expired);
        assert_eq!(expiry(10, now), Expiry::At(110));
        assert_eq!(
            expiry(RELATIVE_LIMIT, now),
            Expiry::At(100 + u32::try_from(RELATIVE_LIMIT).unwrap())
        );
        assert_eq!(expiry(1_700_000_050, now), Expiry::At(150));
        assert_eq!(expiry(1_700_000_000, now), Expiry::Expired);
        assert_eq!(expiry(RELATIVE_LIMIT + 1, now), Expiry::Expired);
        assert_eq!(ttl_left(NEVER, now), -1);
        assert_eq!(ttl_left(130, now), 30);
    }
}
