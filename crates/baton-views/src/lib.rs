//! The read side of Baton as its APIs answer it: one session (its state
//! version, lease and turn history), pages of sessions, the replicas and
//! what each is doing. Plain data with serde and JSON Schema, camelCase on
//! the wire; times are Unix milliseconds. The stores produce these
//! (`baton-session`), the sidecar and the dashboard serve and show them.
#![forbid(unsafe_code)]

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who holds a session's lease, while one is held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    /// The holder: a replica's name and a per-process suffix.
    pub owner: String,
    pub fence: u64,
    /// The turn it runs.
    pub turn_seq: u64,
    pub expires_at_ms: u64,
}

/// One committed turn, from the turn ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnView {
    pub turn_seq: u64,
    /// The state version it committed.
    pub version: u64,
    /// The holder that ran it.
    pub replica: String,
    pub fence: u64,
    /// SHA-256 of the input and of the reply, hex: always kept.
    pub input_digest: String,
    pub reply_digest: String,
    /// Its workspace manifest, if it had files.
    pub workspace: Option<String>,
    pub started_at_ms: u64,
    pub committed_at_ms: u64,
    /// What was said, when the ledger keeps text (`spec.ledger.content:
    /// full`, the default) and the turn is within its retention; absent
    /// for digests alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// Stopped by an interrupt, not committed: `version` is the one it
    /// started from, `committedAtMs` when it stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

/// A committed state, when asked for (`?state=true`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateView {
    pub version: u64,
    /// The agent's state as it wrote it (JSON), `null` before the first
    /// commit; a string when the stored bytes are not JSON.
    pub payload: serde_json::Value,
}

/// One session, live: its version and lease from the coordination store,
/// its recent turns from the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub tenant: String,
    pub session: String,
    pub version: u64,
    pub fence: u64,
    pub last_turn_seq: u64,
    /// The holder of the last commit.
    pub last_replica: Option<String>,
    pub updated_at_ms: u64,
    pub workspace: Option<String>,
    /// `null` when no turn holds it.
    pub lease: Option<LeaseView>,
    /// Newest first.
    pub turns: Vec<TurnView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<StateView>,
}

/// One row of the session list (from the ledger).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionSummary {
    pub tenant: String,
    pub session: String,
    pub version: u64,
    pub last_turn_seq: u64,
    pub last_replica: Option<String>,
    pub last_turn_at_ms: u64,
    pub turn_count: u64,
}

/// Where the next page of sessions starts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PageKey {
    pub tenant: String,
    pub session: String,
}

/// A page of sessions in (tenant, session) order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    pub sessions: Vec<SessionSummary>,
    /// `null` on the last page.
    pub next: Option<PageKey>,
}

/// What a replica says of itself with every heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct ReplicaInfo {
    /// The pod's (or `baton dev` replica's) name.
    pub replica: String,
    pub started_at_ms: u64,
    pub draining: bool,
    pub in_flight: u64,
    /// The `baton` build it runs.
    pub build: String,
    /// When (Unix ms) it made the oldest commit its ledger shipper has not
    /// shipped yet; absent when all have shipped (or its store has no
    /// separate ledger).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_unshipped_ms: Option<u64>,
    /// Where its sidecar's admin API answers (`--advertise-url`): the
    /// dashboard drains it there. Absent when it did not say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The data layout it writes (`baton_session::DATA_LAYOUT`); absent
    /// from builds before it was said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<u32>,
}

/// A live replica: its heartbeat is current.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaView {
    /// The holder id leases name.
    pub id: String,
    /// When its last heartbeat was written, by its clock.
    pub last_seen_ms: u64,
    /// What it said then; empty for a build that did not say.
    #[serde(flatten)]
    pub info: ReplicaInfo,
}

/// A turn a replica is running now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnInFlight {
    pub tenant: String,
    pub session: String,
    pub turn_seq: Option<u64>,
    /// Set once its lease is granted.
    pub fence: Option<u64>,
    pub running_ms: u64,
}

/// `GET /v1/admin/status` (and the drain's answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub replica: String,
    pub holder: String,
    pub draining: bool,
    pub ready: bool,
    pub in_flight: u64,
    pub turns: Vec<TurnInFlight>,
    /// As in [`ReplicaInfo::oldest_unshipped_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_unshipped_ms: Option<u64>,
    /// Every turn it answered since it started, by latency (see
    /// [`latency`]); empty from a build that does not count them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_latency: Vec<u64>,
    /// Turns the drain aborted at its timeout (their sessions went to other
    /// replicas at once).
    #[serde(default)]
    pub aborted_by_drain: u64,
    /// How long its drain took until no turn ran, once it is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_in_ms: Option<u64>,
    /// Leases of ended turns it could not give back (the store did not
    /// answer); `POST /v1/admin/handover` retries them.
    #[serde(default)]
    pub unreleased_leases: u64,
    /// The data layout its stores are written in
    /// (`baton_session::DATA_LAYOUT`); absent from builds before it was said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<u32>,
    /// The layout the stores hold (the first replica's), when it differs
    /// from [`Self::layout`] this replica refuses turns and is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_layout: Option<u32>,
}

/// `POST /v1/admin/handover`: what a drained replica gave back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Handover {
    /// Leases released now (each only if still this replica's: fenced).
    pub released: u64,
    /// Leases it still could not release (the store did not answer); they
    /// expire with the replica's heartbeat.
    pub still_held: u64,
}

/// Turn latencies as counts per bucket, which the dashboard turns into
/// turns/s and percentiles over time from two snapshots. Bucket `i` counts
/// the turns that took at most [`latency::bound_ms`]`(i)`; the last one
/// counts the rest.
pub mod latency {
    /// Buckets: 0.05 ms doubling to about 26 s, and one for slower turns.
    pub const BUCKETS: usize = 21;

    /// The upper bound of bucket `i`, in milliseconds (infinite for the last).
    pub fn bound_ms(i: usize) -> f64 {
        if i + 1 >= BUCKETS {
            f64::INFINITY
        } else {
            0.05 * f64::from(1u32 << i)
        }
    }

    /// The bucket of a turn that took `ms` milliseconds.
    pub fn bucket(ms: f64) -> usize {
        (0..BUCKETS)
            .find(|&i| ms <= bound_ms(i))
            .unwrap_or(BUCKETS - 1)
    }

    /// What happened between two snapshots `dt_ms` apart: turns/s and the
    /// p50 and p99 latency (upper bounds of their buckets, in ms), `None`
    /// when there were no turns (or the replica restarted in between).
    pub fn between(before: &[u64], after: &[u64], dt_ms: u64) -> Option<(f64, f64, f64)> {
        if before.len() != after.len() || dt_ms == 0 {
            return None;
        }
        let delta: Vec<u64> = before
            .iter()
            .zip(after)
            .map(|(b, a)| a.checked_sub(*b))
            .collect::<Option<_>>()?;
        let total: u64 = delta.iter().sum();
        if total == 0 {
            return None;
        }
        let quantile = |q: f64| {
            let wanted = (q * total as f64).ceil() as u64;
            let mut seen = 0;
            for (i, n) in delta.iter().enumerate() {
                seen += n;
                if seen >= wanted {
                    return bound_ms(i);
                }
            }
            bound_ms(BUCKETS - 1)
        };
        Some((
            total as f64 * 1000.0 / dt_ms as f64,
            quantile(0.5),
            quantile(0.99),
        ))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn rates_and_percentiles_come_from_two_snapshots() {
            assert_eq!(bucket(0.01), 0);
            assert_eq!(bucket(3.0), 6); // 0.05 * 64 = 3.2 ms
            assert_eq!(bucket(1e9), BUCKETS - 1);
            let before = vec![0; BUCKETS];
            let mut after = vec![0; BUCKETS];
            after[6] = 98; // 98 turns of at most 3.2 ms
            after[10] = 2; // 2 of at most 51.2 ms
            let (rate, p50, p99) = between(&before, &after, 2000).unwrap();
            assert_eq!(rate, 50.0);
            assert!((p50 - 3.2).abs() < 1e-9, "{p50}");
            assert!((p99 - 51.2).abs() < 1e-9, "{p99}");
            assert_eq!(between(&after, &after, 1000), None, "no turns");
            assert_eq!(between(&after, &before, 1000), None, "a restart");
        }
    }
}

/// `GET /v1/sessions/{session}/files`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileList {
    /// The state version these files belong to.
    pub version: u64,
    pub files: std::collections::BTreeMap<String, FileView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileView {
    pub size: u64,
    pub sha256: String,
}

/// `POST /v1/admin/tenants/{tenant}/sessions/{session}/takeover`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Takeover {
    pub tenant: String,
    pub session: String,
    /// The holder fenced out, `null` when none held it.
    pub revoked_owner: Option<String>,
}

/// `POST /v1/sessions/{session}/turns/{turnSeq}/interrupt` (and the admin
/// API's `.../interrupt`): the turn stopped. Nothing it did commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interrupted {
    pub tenant: String,
    pub session: String,
    pub turn_seq: u64,
    /// The attempt stopped (its lease's fence).
    pub attempt: u64,
    /// The holder that ran it.
    pub owner: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire names are the API's (camelCase), and a replica view reads
    /// a heartbeat of a build that said nothing about itself.
    #[test]
    fn wire_shapes() {
        let view = ReplicaView {
            id: "replica-0-a1b2c3".into(),
            last_seen_ms: 5,
            info: ReplicaInfo {
                replica: "replica-0".into(),
                in_flight: 2,
                ..ReplicaInfo::default()
            },
        };
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["lastSeenMs"], 5);
        assert_eq!(json["inFlight"], 2);
        assert_eq!(json["replica"], "replica-0");
        let bare: ReplicaView =
            serde_json::from_value(serde_json::json!({ "id": "x", "lastSeenMs": 1 })).unwrap();
        assert_eq!(bare.info, ReplicaInfo::default());
        let schema = schemars::schema_for!(SessionView);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("lastTurnSeq"), "{text}");
    }
}
