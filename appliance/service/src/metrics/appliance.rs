//! `ringstore_appliance_*`: what PID 1 knows about the box it runs the server in (the booted
//! slot, the tuning verifier's checks, the serving certificate's days left, the data device),
//! handed over in-process after the server started (`appliance/init/src/metrics_handoff.rs`).
//! `ringstore serve` never sets it, so it serves none of these series.
//!
//! Only a scrape reads this, never a request: what is fixed for the boot is set once
//! ([`OnceLock`]), the certificate's expiry is one atomic (PID 1 stores it again after `certs
//! reload`), and the tuning checks are a list PID 1 replaces whole when it verifies again.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::text::{Exposition, Kind};

/// Seconds in a day, for the certificate's days left.
const DAY_SECS: i64 = 86_400;

/// Most tuning checks kept (a box has a few per NIC queue IRQ): bounds the scrape's size.
pub const TUNING_CHECKS_MAX: usize = 512;

/// What PID 1 knows once the server runs, fixed for the boot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Boot {
    /// The A/B slot booted (`A`, `B`), `none` without disk.img (QEMU `-kernel`, PXE).
    slot: String,
    /// The data device's path, `None` without one.
    data_device: Option<String>,
}

/// One check of the tuning verifier: name, what it is about, and whether it is as wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TuningCheck {
    check: String,
    subject: String,
    ok: bool,
}

/// PID 1's series; empty (nothing rendered) until PID 1 hands them over.
#[derive(Debug)]
pub struct Appliance {
    boot: OnceLock<Boot>,
    tuning: Mutex<Arc<[TuningCheck]>>,
    /// The serving certificate's notAfter in Unix seconds; `i64::MIN`: no certificate.
    cert_not_after: AtomicI64,
}

impl Default for Appliance {
    fn default() -> Self {
        Appliance {
            boot: OnceLock::new(),
            tuning: Mutex::new(Arc::from(Vec::new())),
            cert_not_after: AtomicI64::new(i64::MIN),
        }
    }
}

impl Appliance {
    /// Sets what is fixed for the boot: the A/B slot booted (`A`, `B`; `none` without
    /// disk.img, as QEMU `-kernel` or PXE) and the data device's path (`None`: none);
    /// `false` if it was set already (the first one stays). Plain values: PID 1 does not
    /// depend on this crate.
    pub fn set_boot(&self, slot: String, data_device: Option<String>) -> bool {
        self.boot.set(Boot { slot, data_device }).is_ok()
    }

    /// Replaces the tuning checks, each (check, subject, as wanted): the first
    /// [`TUNING_CHECKS_MAX`]; a (check, subject) pair met twice is one series, as wanted only
    /// if both are.
    pub fn set_tuning(&self, checks: impl IntoIterator<Item = (String, String, bool)>) {
        let mut merged: Vec<TuningCheck> = Vec::new();
        for (check, subject, ok) in checks {
            let c = TuningCheck { check, subject, ok };
            let same = |m: &TuningCheck| m.check == c.check && m.subject == c.subject;
            if let Some(m) = merged.iter_mut().find(|m| same(m)) {
                m.ok &= c.ok;
            } else if merged.len() < TUNING_CHECKS_MAX {
                merged.push(c);
            }
        }
        *self.tuning.lock().unwrap_or_else(|e| e.into_inner()) = Arc::from(merged);
    }

    /// The serving certificate's notAfter (Unix seconds), `None` when nothing is served
    /// over TLS.
    pub fn set_certificate(&self, not_after: Option<i64>) {
        self.cert_not_after
            .store(not_after.unwrap_or(i64::MIN), Ordering::Relaxed);
    }

    fn tuning(&self) -> Arc<[TuningCheck]> {
        self.tuning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Writes the appliance families at Unix time `unix` (nothing before PID 1's handover).
pub fn write(e: &mut Exposition<'_>, a: &Appliance, unix: u64) {
    let Some(boot) = a.boot.get() else { return };
    let name = "ringstore_appliance_booted_slot_info";
    e.head(
        name,
        Kind::Gauge,
        "1, labelled with the A/B slot this boot runs from (none: no disk.img).",
    );
    e.sample_labelled(name, &[("slot", &boot.slot)], "1");
    let name = "ringstore_appliance_data_device_state";
    e.head(
        name,
        Kind::Gauge,
        "The data device: 1 for the state it is in (absent: no ringstore.data; serving: opened and serving), 0 for the other.",
    );
    let serving = boot.data_device.is_some();
    for (state, on) in [("absent", !serving), ("serving", serving)] {
        e.sample_u64(name, &[("state", state)], u64::from(on));
    }
    let not_after = a.cert_not_after.load(Ordering::Relaxed);
    if not_after != i64::MIN {
        let name = "ringstore_appliance_certificate_days_left";
        e.head(
            name,
            Kind::Gauge,
            "Whole days until the serving TLS certificate expires (negative: expired), as status shows.",
        );
        let now = i64::try_from(unix).unwrap_or(i64::MAX);
        let days = (not_after.saturating_sub(now)).div_euclid(DAY_SECS);
        e.sample_labelled(name, &[], &days.to_string());
    }
    let checks = a.tuning();
    if !checks.is_empty() {
        let name = "ringstore_appliance_tuning_check";
        e.head(
            name,
            Kind::Gauge,
            "The tuning verifier's checks (the console's tuning): 1 as wanted, 0 a difference to fix.",
        );
        for c in checks.iter() {
            let labels = [("check", c.check.as_str()), ("subject", c.subject.as_str())];
            e.sample_u64(name, &labels, u64::from(c.ok));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(a: &Appliance, unix: u64) -> String {
        let mut out = Vec::new();
        let mut e = Exposition::new(&mut out, false);
        write(&mut e, a, unix);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn nothing_until_pid1_hands_over_then_each_series() {
        let a = Appliance::default();
        a.set_certificate(Some(100 * DAY_SECS));
        assert_eq!(render(&a, 0), "");
        assert!(a.set_boot("B".into(), Some("/dev/vda".into())));
        assert!(!a.set_boot("A".into(), None));
        let check = |name: &str, subject: &str, ok| (name.to_string(), subject.to_string(), ok);
        a.set_tuning([
            check("irq", "irq 25", true),
            check("rps", "eth0", false),
            check("irq", "irq 25", false),
        ]);
        let text = render(&a, (86 * DAY_SECS + 1) as u64);
        assert!(text.contains("\nringstore_appliance_booted_slot_info{slot=\"B\"} 1\n"));
        assert!(text.contains("\nringstore_appliance_data_device_state{state=\"absent\"} 0\n"));
        assert!(text.contains("\nringstore_appliance_data_device_state{state=\"serving\"} 1\n"));
        assert!(text.contains("\nringstore_appliance_certificate_days_left 13\n"));
        assert!(text
            .contains("\nringstore_appliance_tuning_check{check=\"irq\",subject=\"irq 25\"} 0\n"));
        assert!(
            text.contains("\nringstore_appliance_tuning_check{check=\"rps\",subject=\"eth0\"} 0\n")
        );
        a.set_certificate(None);
        a.set_tuning([]);
        let text = render(&a, 0);
        assert!(!text.contains("certificate") && !text.contains("tuning_check"));
    }
}
