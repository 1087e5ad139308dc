//! What the front door makes of a replica's readiness probes, the way a
//! kubelet applies `failureThreshold`: on a busy machine one probe can time
//! out while the replica is fine, and taking it out of rotation for that
//! turns a slow moment into "no replica ready" for clients. A drain, on the
//! other hand, is the replica saying so itself and counts at once.

/// Consecutive failed probes that take a ready replica out of rotation
/// (the kubelet's default `failureThreshold` is 3).
pub const FAILURE_THRESHOLD: u32 = 3;

/// The answer of one probe of `/readyz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Ready,
    /// Not ready because the replica is draining.
    Draining,
    /// Not ready for another reason, no answer, or no answer in time.
    Failed,
}

/// A replica's readiness as the front door routes by it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub draining: bool,
}

/// The probes of one replica so far.
#[derive(Debug, Default)]
pub struct ProbeHistory {
    failures_in_a_row: u32,
}

impl ProbeHistory {
    /// The readiness to show after `probe`, or `None` to keep the current one
    /// (a failure below the threshold).
    pub fn observe(&mut self, probe: Probe) -> Option<Readiness> {
        match probe {
            Probe::Ready => {
                self.failures_in_a_row = 0;
                Some(Readiness {
                    ready: true,
                    draining: false,
                })
            }
            Probe::Draining => {
                self.failures_in_a_row = FAILURE_THRESHOLD;
                Some(Readiness {
                    ready: false,
                    draining: true,
                })
            }
            Probe::Failed => {
                self.failures_in_a_row = self.failures_in_a_row.saturating_add(1);
                (self.failures_in_a_row >= FAILURE_THRESHOLD).then_some(Readiness::default())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READY: Option<Readiness> = Some(Readiness {
        ready: true,
        draining: false,
    });
    const DRAINING: Option<Readiness> = Some(Readiness {
        ready: false,
        draining: true,
    });
    const NOT_READY: Option<Readiness> = Some(Readiness {
        ready: false,
        draining: false,
    });

    #[test]
    fn a_replica_leaves_rotation_after_the_threshold_of_failures_in_a_row() {
        let mut h = ProbeHistory::default();
        assert_eq!(h.observe(Probe::Ready), READY);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Failed), NOT_READY);
        assert_eq!(h.observe(Probe::Failed), NOT_READY);
        assert_eq!(h.observe(Probe::Ready), READY);
    }

    #[test]
    fn a_success_starts_the_count_again() {
        let mut h = ProbeHistory::default();
        assert_eq!(h.observe(Probe::Ready), READY);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Ready), READY);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Failed), None);
        assert_eq!(h.observe(Probe::Failed), NOT_READY);
    }

    #[test]
    fn a_drain_counts_at_once_and_a_failure_after_it_keeps_the_replica_out() {
        let mut h = ProbeHistory::default();
        assert_eq!(h.observe(Probe::Ready), READY);
        assert_eq!(h.observe(Probe::Draining), DRAINING);
        // The drained process stops: it must not come back as "draining,
        // keep the old readiness" for the next two probes.
        assert_eq!(h.observe(Probe::Failed), NOT_READY);
    }
}
