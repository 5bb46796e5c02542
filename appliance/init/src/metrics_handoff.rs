//! PID 1's own series on the server's `/metrics` (`ringstore_appliance_*`, docs/METRICS.md):
//! the server runs in this process, so PID 1 hands them over in memory, through
//! [`crate::plane::Serving::publish`], with no port or file between them. What is fixed for
//! the boot (the booted slot, the data device) goes once, right after the start; the tuning
//! checks whenever PID 1 verifies (at the start and at each console `tuning`); the
//! certificate's expiry at the start and after each `certs reload`.

use ringstore_config::Config;

use crate::machine::Machine;
use crate::plane::BoxSeries;
use crate::tuning::Check;

/// Right after the server started: the boot's series, the certificate, and the checks.
pub fn at_start(machine: &Machine, config: &Config) {
    let slot = machine
        .state()
        .slots
        .booted
        .map_or_else(|| "none".to_string(), |s| s.to_string());
    let data_device = config.data.as_ref().map(|p| p.display().to_string());
    publish(machine, BoxSeries::Boot { slot, data_device });
    certificate(machine);
    if let Some(facts) = crate::tuning::gather(machine) {
        tuning(machine, &crate::tuning::verify(&facts));
    }
}

/// The checks of one verification.
pub fn tuning(machine: &Machine, checks: &[Check]) {
    let checks = checks
        .iter()
        .map(|c| (c.check.to_string(), c.subject.clone(), !c.difference))
        .collect();
    publish(machine, BoxSeries::Tuning(checks));
}

/// The certificate the server serves, read again (after the start and after `certs reload`).
pub fn certificate(machine: &Machine) {
    let path = machine
        .state()
        .config
        .as_ref()
        .and_then(|c| c.tls.cert.clone());
    let not_after = path
        .and_then(|path| crate::tls_files::summary_of(&path).ok())
        .map(|s| s.not_after);
    publish(machine, BoxSeries::Certificate(not_after));
}

fn publish(machine: &Machine, series: BoxSeries) {
    if let Some(server) = machine.state().server.as_ref() {
        server.publish(series);
    }
}
