//! The cores part's plan: which worker counts fit this machine, and which CPUs the servers
//! and the load generators get (one client core per four server cores, never shared).

/// The worker counts the part measures where the machine has the cores.
pub(super) const WIDTHS: [usize; 5] = [1, 2, 4, 8, 16];
/// Server cores one load-generator core drives: one client core (one io_uring thread) keeps
/// up with about four server workers at depth 16 (measured: one client core saturates at
/// 1.2–1.5M requests/s, a ringstore worker serves about 0.3–0.4M).
pub(super) const SERVER_CORES_PER_CLIENT: usize = 4;

/// One measured width: the servers on `server_cpus`, one load generator on each client CPU.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Width {
    pub workers: usize,
    pub server_cpus: Vec<usize>,
    pub client_cpus: Vec<usize>,
}

/// A width this machine cannot hold without a client sharing a server core.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Skipped {
    pub workers: usize,
    /// Server plus client cores it needs.
    pub needs: usize,
}

impl Skipped {
    /// The line the report and stderr print, so a skip is never silent.
    pub(super) fn reason(&self, cpus: usize) -> String {
        format!(
            "{} workers skipped: they need {} CPUs ({} server + {} client), this machine has {cpus}",
            self.workers,
            self.needs,
            self.workers,
            clients_for(self.workers)
        )
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    pub widths: Vec<Width>,
    pub skipped: Vec<Skipped>,
}

/// Load-generator cores for `workers` server workers.
pub(super) fn clients_for(workers: usize) -> usize {
    workers.div_ceil(SERVER_CORES_PER_CLIENT)
}

/// The plan on a machine with `cpus` CPUs: servers on CPUs `0..N` (where ringstore places its
/// workers itself), clients on the next `clients_for(N)` CPUs; a width is measured only
/// where N + clients ≤ cpus, so no client shares a core with a server worker.
pub(super) fn plan(cpus: usize) -> Plan {
    let mut widths = Vec::new();
    let mut skipped = Vec::new();
    for workers in WIDTHS {
        let clients = clients_for(workers);
        if workers + clients <= cpus {
            widths.push(Width {
                workers,
                server_cpus: (0..workers).collect(),
                client_cpus: (workers..workers + clients).collect(),
            });
        } else {
            skipped.push(Skipped {
                workers,
                needs: workers + clients,
            });
        }
    }
    Plan { widths, skipped }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(p: &Plan) -> (Vec<usize>, Vec<usize>) {
        (
            p.widths.iter().map(|w| w.workers).collect(),
            p.skipped.iter().map(|s| s.workers).collect(),
        )
    }

    #[test]
    fn two_cpus_run_one_worker_and_say_why_the_rest_are_skipped() {
        let p = plan(2);
        assert_eq!(counts(&p), (vec![1], vec![2, 4, 8, 16]));
        assert_eq!(p.widths[0].server_cpus, vec![0]);
        assert_eq!(p.widths[0].client_cpus, vec![1]);
        assert_eq!(
            p.skipped[0].reason(2),
            "2 workers skipped: they need 3 CPUs (2 server + 1 client), this machine has 2"
        );
    }

    #[test]
    fn sixteen_cpus_hold_eight_workers_not_sixteen() {
        // 16 workers need 4 client cores: 20 CPUs.
        let p = plan(16);
        assert_eq!(counts(&p), (vec![1, 2, 4, 8], vec![16]));
        let eight = &p.widths[3];
        assert_eq!(eight.server_cpus, (0..8).collect::<Vec<_>>());
        assert_eq!(eight.client_cpus, vec![8, 9]);
        assert_eq!(p.skipped[0].needs, 20);
    }

    #[test]
    fn twenty_cpus_run_every_width_with_clients_apart() {
        let p = plan(20);
        assert!(p.skipped.is_empty());
        for w in &p.widths {
            assert_eq!(w.client_cpus.len(), clients_for(w.workers));
            assert!(w.client_cpus.iter().all(|c| !w.server_cpus.contains(c)));
            assert!(w.client_cpus.iter().all(|&c| c < 20));
        }
        assert_eq!(p.widths[4].client_cpus, vec![16, 17, 18, 19]);
    }

    #[test]
    fn one_client_core_per_four_server_cores() {
        assert_eq!(
            WIDTHS.map(clients_for),
            [1, 1, 1, 2, 4],
            "1, 2, 4, 8, 16 workers"
        );
        assert_eq!(counts(&plan(1)), (vec![], WIDTHS.to_vec()));
    }
}
