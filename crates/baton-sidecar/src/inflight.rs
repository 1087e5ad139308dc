//! The turns this replica is running, and the drain that waits for them.
//!
//! At most one local turn per session: a turn that was fenced out (taken
//! over) may still be inside its agent call, and the next turn of that
//! session must not materialise the workspace under its feet.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_session::{Lease, SessionKey};
use tokio::sync::watch;

pub use baton_views::TurnInFlight;

struct Entry {
    turn_seq: Option<u64>,
    fence: Option<u64>,
    started: Instant,
    /// Set to true to abort the turn (drain timeout).
    abort: watch::Sender<bool>,
}

pub struct InFlight {
    turns: Mutex<HashMap<SessionKey, Entry>>,
    count: watch::Sender<usize>,
    draining: AtomicBool,
    /// Turns true with `draining`, for those who wait for a drain to start.
    drain_started: watch::Sender<bool>,
    /// Turns told to abort by the drain.
    aborted: AtomicU64,
    /// How long the drain took until no turn ran; `u64::MAX` until then.
    drained_in_ms: AtomicU64,
    /// Leases of ended turns whose release failed: a handover retries them.
    unreleased: Mutex<Vec<Lease>>,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            turns: Mutex::new(HashMap::new()),
            count: watch::channel(0).0,
            draining: AtomicBool::new(false),
            drain_started: watch::channel(false).0,
            aborted: AtomicU64::new(0),
            drained_in_ms: AtomicU64::new(u64::MAX),
            unreleased: Mutex::new(Vec::new()),
        }
    }
}

/// Why a turn could not enter.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Draining,
    /// This replica already runs a turn of the session.
    SessionBusy,
}

/// Removes its turn from the registry when dropped, however the turn ends.
pub struct Slot<'a> {
    registry: &'a InFlight,
    key: SessionKey,
    /// Becomes true when the turn must abort.
    pub abort: watch::Receiver<bool>,
}

impl Slot<'_> {
    /// Records the lease the turn got, for the status page.
    pub fn granted(&self, fence: u64, turn_seq: u64) {
        if let Some(e) = self.registry.lock().get_mut(&self.key) {
            e.fence = Some(fence);
            e.turn_seq = Some(turn_seq);
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut turns = self.registry.lock();
        turns.remove(&self.key);
        self.registry.count.send_replace(turns.len());
    }
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionKey, Entry>> {
        // A panic while holding this lock leaves a consistent map.
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a turn of `key`, unless the replica is draining or already
    /// runs a turn of that session.
    pub fn enter(&self, key: &SessionKey, turn_seq: Option<u64>) -> Result<Slot<'_>, Refused> {
        let mut turns = self.lock();
        // Read under the lock that `start_drain` takes: with several runtime
        // threads, a drain either sees this turn counted or it is refused,
        // never a turn that slips in after the drain found none running.
        if self.draining.load(Ordering::SeqCst) {
            return Err(Refused::Draining);
        }
        if turns.contains_key(key) {
            return Err(Refused::SessionBusy);
        }
        let (abort, receiver) = watch::channel(false);
        turns.insert(
            key.clone(),
            Entry {
                turn_seq,
                fence: None,
                started: Instant::now(),
                abort,
            },
        );
        self.count.send_replace(turns.len());
        Ok(Slot {
            registry: self,
            key: key.clone(),
            abort: receiver,
        })
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Marks the replica draining; true if it was not already.
    pub fn start_drain(&self) -> bool {
        let _turns = self.lock();
        let first = !self.draining.swap(true, Ordering::SeqCst);
        self.drain_started.send_replace(true);
        first
    }

    /// Returns once a drain has started (at once if one has).
    pub async fn drain_started(&self) {
        let mut started = self.drain_started.subscribe();
        // The sender lives as long as `self`: an error cannot happen here.
        let _ = started.wait_for(|started| *started).await;
    }

    pub fn len(&self) -> usize {
        *self.count.borrow()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> Vec<TurnInFlight> {
        let mut list: Vec<_> = self
            .lock()
            .iter()
            .map(|(key, e)| TurnInFlight {
                tenant: key.tenant.to_string(),
                session: key.session.to_string(),
                turn_seq: e.turn_seq,
                fence: e.fence,
                running_ms: e.started.elapsed().as_millis() as u64,
            })
            .collect();
        list.sort_by(|a, b| (&a.tenant, &a.session).cmp(&(&b.tenant, &b.session)));
        list
    }

    /// Waits until no turn runs, at most `timeout`; true if none runs.
    pub async fn wait_empty(&self, timeout: Duration) -> bool {
        let mut count = self.count.subscribe();
        tokio::time::timeout(timeout, count.wait_for(|n| *n == 0))
            .await
            .is_ok()
    }

    /// Tells every running turn to abort; returns how many were told.
    pub fn abort_all(&self) -> usize {
        let turns = self.lock();
        for e in turns.values() {
            if !e.abort.send_replace(true) {
                self.aborted.fetch_add(1, Ordering::Relaxed);
            }
        }
        turns.len()
    }

    pub fn set_drained_in(&self, ms: u64) {
        self.drained_in_ms.store(ms, Ordering::Relaxed);
    }

    /// How long the drain took, once it is over.
    pub fn drained_in_ms(&self) -> Option<u64> {
        let ms = self.drained_in_ms.load(Ordering::Relaxed);
        (ms != u64::MAX).then_some(ms)
    }

    /// Turns aborted so far (each counted once).
    pub fn aborted(&self) -> u64 {
        self.aborted.load(Ordering::Relaxed)
    }

    /// Keeps a lease the replica could not release, for the handover.
    pub fn remember_unreleased(&self, lease: Lease) {
        self.unreleased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(lease);
    }

    /// The leases still to release (taken: the caller puts back the ones
    /// it fails on).
    pub fn take_unreleased(&self) -> Vec<Lease> {
        std::mem::take(&mut *self.unreleased.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn unreleased_count(&self) -> usize {
        self.unreleased
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> SessionKey {
        SessionKey::new("t", s).unwrap()
    }

    #[test]
    fn one_local_turn_per_session_and_slots_free_on_drop() {
        let reg = InFlight::default();
        let a = reg.enter(&key("a"), None).unwrap();
        assert_eq!(
            reg.enter(&key("a"), Some(2)).err(),
            Some(Refused::SessionBusy)
        );
        let b = reg.enter(&key("b"), Some(1)).unwrap();
        assert_eq!(reg.len(), 2);
        a.granted(7, 3);
        let snap = reg.snapshot();
        assert_eq!((snap[0].fence, snap[0].turn_seq), (Some(7), Some(3)));
        drop(a);
        assert!(reg.enter(&key("a"), None).is_ok());
        drop(b);
        assert!(reg.is_empty());
        assert!(reg.start_drain());
        assert_eq!(reg.enter(&key("c"), None).err(), Some(Refused::Draining));
    }

    #[tokio::test]
    async fn abort_all_reaches_running_turns_and_wait_empty_sees_them_leave() {
        let reg = std::sync::Arc::new(InFlight::default());
        let r = reg.clone();
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let turn = tokio::spawn(async move {
            let mut slot = r.enter(&key("a"), None).unwrap();
            entered_tx.send(()).unwrap();
            slot.abort.wait_for(|a| *a).await.unwrap();
        });
        entered_rx.await.unwrap();
        assert!(!reg.wait_empty(Duration::from_millis(20)).await);
        assert_eq!(reg.abort_all(), 1);
        assert!(reg.wait_empty(Duration::from_secs(10)).await);
        turn.await.unwrap();
        assert!(reg.start_drain());
        assert!(!reg.start_drain());
    }
}
