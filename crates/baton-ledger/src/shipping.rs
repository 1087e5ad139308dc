//! Moving turn records from Redis's logs into the ledger: each replica's
//! shipper, woken by its own commits, and the one sweeper (whoever holds
//! the sweeper lease) that ships what the index still names.

use std::collections::BTreeSet;
use std::time::Duration;

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use baton_session::ids::SessionKey;

use crate::store::RedisLedgerStore;
use baton_session::store::StoreResult;
use baton_session::turn_record::now_ms;

/// How often the sweeper ships the logs no one else shipped.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);
/// How old an index entry is before the sweeper takes it: the committing
/// replica's own shipper normally ships it within [`SHIP_LINGER`] and a round.
pub const SWEEP_AFTER: Duration = Duration::from_secs(2);
/// Index entries one sweep looks at, at most (the rest wait a second).
pub(crate) const SWEEP_LIMIT: usize = 16 * SESSIONS_PER_ROUND;
/// After a failed round, the shipper waits this long, doubling up to
/// [`MAX_BACKOFF`], before it tries again.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Records shipped per round trip.
pub(crate) const SHIP_BATCH: usize = 256;
/// How long the shipper waits after a commit for more to ship with it. A
/// session's records ship together when they wait in the same round, and
/// each (session, round) costs a log read, a state read, an ack and a
/// ledger row: at 20 ms a busy session shipped every turn on its own, and
/// the turn cost Redis and Postgres about 10 µs more CPU than at 250 ms
/// (BENCHMARKS.md, issue 13). The ledger lags the commits by this much.
pub(crate) const SHIP_LINGER: Duration = Duration::from_millis(250);
/// Most sessions shipped in one round of the sweep.
pub(crate) const SESSIONS_PER_ROUND: usize = 256;
/// Most sessions shipped in one woken round: what one linger gathers.
pub(crate) const WOKEN_SESSIONS_PER_ROUND: usize = 1024;

#[derive(Default)]
pub(crate) struct ShipRound {
    shipped: usize,
    more: Vec<SessionKey>,
}

impl RedisLedgerStore {
    /// Ships every unshipped record of `key`; returns how many.
    pub async fn ship(&self, key: &SessionKey) -> StoreResult<usize> {
        let mut shipped = 0;
        loop {
            let round = self.ship_round(std::slice::from_ref(key)).await?;
            shipped += round.shipped;
            if round.more.is_empty() {
                return Ok(shipped);
            }
        }
    }

    /// Ships the unshipped records of several sessions together: one Redis
    /// read, one ledger transaction and one Redis ack for all of them.
    pub async fn ship_many(&self, keys: &[SessionKey]) -> StoreResult<usize> {
        let round = self.ship_round(keys).await?;
        let mut shipped = round.shipped;
        for key in &round.more {
            shipped += self.ship(key).await?;
        }
        Ok(shipped)
    }

    /// One batch per session; `more` lists the sessions that had a full one.
    pub(crate) async fn ship_round(&self, keys: &[SessionKey]) -> StoreResult<ShipRound> {
        let batches: Vec<_> = self
            .catalog
            .redis
            .ship_batches(keys, SHIP_BATCH)
            .await?
            .into_iter()
            .filter(|b| !b.records.is_empty())
            .collect();
        if batches.is_empty() {
            return Ok(ShipRound::default());
        }
        let refused = self.catalog.ledger.record_many(&batches).await?;
        // Refused batches (read from a state an earlier Redis run vouched
        // for) stay in the logs to be read again.
        let batches: Vec<_> = batches
            .into_iter()
            .filter(|b| !refused.contains(&b.key))
            .collect();
        // Only the records just stored leave the logs, named one by one: a
        // record that arrived meanwhile stays, even with a turnSeq no higher.
        let dropped = self.catalog.redis.ack_shipped(&batches).await?;
        let mut round = ShipRound::default();
        for (batch, dropped) in batches.iter().zip(dropped) {
            round.shipped += batch.records.len();
            // Nothing dropped means the head of the log is not what we
            // read: stop rather than loop; the next sweep looks again.
            if batch.records.len() == SHIP_BATCH && dropped > 0 {
                round.more.push(batch.key.clone());
            }
        }
        Ok(round)
    }

    /// One sweep, if this shipper holds the sweeper lease (or takes it):
    /// ships the sessions the index has named for longer than
    /// [`SWEEP_AFTER`] and drops the entries whose logs are empty. A session
    /// that fails (a corrupt record, a ledger error) is logged and skipped,
    /// so it cannot hold back the others. Returns how many records it
    /// shipped (0 when another shipper sweeps).
    pub async fn sweep(&self) -> StoreResult<usize> {
        if !self
            .catalog
            .redis
            .sweeper_lease(&self.shipper.id, SWEEP_INTERVAL * 3)
            .await?
        {
            return Ok(0);
        }
        let shipped = self.sweep_now().await?;
        // Its errors are the ledger's or Redis's, which the shipping above
        // reports already; the index waits for the next sweep.
        if let Err(e) = self.maintain_known_index().await {
            tracing::debug!(error = %e, "maintaining the known-session index failed");
        }
        Ok(shipped)
    }

    /// [`Self::sweep`] without the lease: for tools and tests that ship by hand.
    pub async fn sweep_now(&self) -> StoreResult<usize> {
        let backfilled = self.catalog.redis.backfill_unshipped().await?;
        if backfilled > 0 {
            tracing::info!(
                sessions = backfilled,
                "indexed the logs written before the unshipped index existed"
            );
        }
        let entries = self
            .catalog
            .redis
            .unshipped(SWEEP_AFTER.as_millis() as u64, SWEEP_LIMIT)
            .await?;
        let mut shipped = 0;
        for chunk in entries.chunks(SESSIONS_PER_ROUND) {
            let keys: Vec<&SessionKey> = chunk.iter().map(|e| &e.key).collect();
            let lengths = self.catalog.redis.log_lengths(&keys).await?;
            let (empty, waiting): (Vec<_>, Vec<_>) =
                chunk.iter().zip(lengths).partition(|(_, n)| *n == 0);
            let mut waiting: Vec<SessionKey> =
                waiting.into_iter().map(|(e, _)| e.key.clone()).collect();
            // In key order, as the woken path gathers them, so a chunk
            // holds neighbouring sessions; the ledger's upsert refuses one
            // session twice in a round.
            waiting.sort();
            waiting.dedup();
            if !waiting.is_empty() {
                shipped += self.ship_each(&waiting).await;
            }
            // Logs found empty leave the index, unless a commit came since.
            let empty: Vec<_> = empty.into_iter().map(|(e, _)| e).collect();
            self.catalog.redis.unindex(&empty).await?;
        }
        Ok(shipped)
    }

    /// Ships `keys` together, or one by one when that fails, to find and
    /// skip the session that fails. Returns how many records it shipped.
    pub(crate) async fn ship_each(&self, keys: &[SessionKey]) -> usize {
        if let Ok(n) = self.ship_many(keys).await {
            return n;
        }
        let mut shipped = 0;
        for key in keys {
            match self.ship(key).await {
                Ok(n) => shipped += n,
                Err(e) => {
                    tracing::warn!(session = %key, error = %e, "shipping this session's turn records failed")
                }
            }
        }
        shipped
    }

    pub(crate) async fn ship_forever(self, mut woken: mpsc::Receiver<SessionKey>) {
        let mut sweep = tokio::time::interval(SWEEP_INTERVAL);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = self.shipper.stop.subscribe();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let result = tokio::select! {
                key = woken.recv() => match key {
                    Some(key) => {
                        // Linger briefly so the commits of the next few
                        // milliseconds ship in the same round: one Redis
                        // read and one ledger transaction for all of them,
                        // instead of round trips competing with every turn.
                        tokio::time::sleep(SHIP_LINGER).await;
                        self.ship_woken(key, &mut woken).await
                    }
                    None => return,
                },
                _ = sweep.tick() => self.sweep().await.map(|_| ()),
                // Mapped to (): the guard `wait_for` answers is not Send.
                () = async { let _ = stop.wait_for(|s| *s).await; } => break,
            };
            match result {
                Ok(()) => {
                    backoff = FIRST_BACKOFF;
                    self.note_shipped(&woken);
                }
                Err(e) => {
                    // The records stay in Redis, indexed; wake-ups that
                    // arrive meanwhile queue up to WAKE_QUEUE, then drop.
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "shipping turn records to the ledger failed; will retry");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        // Stopped: one last round of what this replica committed.
        if let Ok(key) = woken.try_recv()
            && let Err(e) = self.ship_woken(key, &mut woken).await
        {
            tracing::warn!(error = %e, "the last shipping round failed; a sweeper ships it later");
        }
    }

    /// After a successful round: with no wake-up waiting, everything this
    /// process committed has shipped, as far as it knows (a dropped
    /// wake-up is the sweeper's to ship, and a commit racing this check
    /// marks itself again below).
    pub(crate) fn note_shipped(&self, woken: &mpsc::Receiver<SessionKey>) {
        let oldest = &self.shipper.oldest_unshipped_ms;
        if woken.is_empty() && oldest.load(Ordering::Relaxed) != 0 {
            oldest.store(0, Ordering::Relaxed);
            if !woken.is_empty() {
                let _ = oldest.compare_exchange(0, now_ms(), Ordering::Relaxed, Ordering::Relaxed);
            }
        }
    }

    /// Ships `first` and whatever else the queue holds now, up to a round.
    pub(crate) async fn ship_woken(
        &self,
        first: SessionKey,
        woken: &mut mpsc::Receiver<SessionKey>,
    ) -> StoreResult<()> {
        let mut keys = BTreeSet::from([first]);
        while keys.len() < WOKEN_SESSIONS_PER_ROUND {
            match woken.try_recv() {
                Ok(key) => keys.insert(key),
                Err(_) => break,
            };
        }
        let keys: Vec<_> = keys.into_iter().collect();
        self.ship_many(&keys).await.map(|_| ())
    }
}
