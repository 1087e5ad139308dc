//! Where a session's keys and the indexes live in Redis: the key layout,
//! per store namespace, and the encodings of the index members. On a Redis
//! Cluster, sessions and the indexes that name them live in buckets (see
//! `slots.rs`).

use baton_session::id_encoding::{decode_key_part, key_part};
use baton_session::ids::SessionKey;

use crate::RESULTS_RETAINED;
use baton_redis_cluster::slots::{BUCKETS, bucket_of, tag_of_bucket};

/// Key names of one session, all under one hash tag. The state hash also
/// holds the lease and the idempotency records (see `begin.lua`).
#[derive(Clone, Debug)]
pub struct SessionKeys {
    pub state: String,
    pub payload: String,
    pub log: String,
    /// Set by every ledgered commit and never expired: the ledger may know
    /// this session (see `known.rs`).
    pub known: String,
    /// What every key of the session starts with.
    pub(super) base: String,
    /// The session's bucket (always 0 on a single server).
    pub(super) bucket: u16,
}

impl SessionKeys {
    /// The keys of `key` in the default key space (see [`KeySpace`]).
    pub fn new(key: &SessionKey) -> Self {
        KeySpace::default().session(key)
    }

    pub(super) fn in_space(space: &KeySpace, key: &SessionKey) -> Self {
        // Encoded ids hold no ':' or braces (see id_encoding.rs), so the
        // tag is unambiguous and an id cannot move it. Concatenated, not
        // format!ted: this runs several times per turn, and the formatting
        // machinery showed in the sidecar's profile.
        let member = unshipped_member(key);
        let (base, bucket) = space.base_of_member(&member);
        Self {
            state: [base.as_str(), ":state"].concat(),
            payload: [base.as_str(), ":payload"].concat(),
            log: [base.as_str(), ":log"].concat(),
            known: [base.as_str(), ":known"].concat(),
            base,
            bucket,
        }
    }

    /// The stream of `turn_seq` (see `streams.rs`).
    pub fn stream(&self, turn_seq: u64) -> String {
        format!("{}:stream:{turn_seq}", self.base)
    }

    /// Where a commit under `fence` stages its payload before `commit.lua`
    /// renames it into place.
    pub fn staged(&self, fence: u64) -> String {
        format!("{}:staged:{fence}", self.base)
    }
}

/// The state hash's field that holds `turn_seq`'s idempotency record: a
/// ring of RESULTS_RETAINED slots, so a commit overwrites the record that
/// leaves the window instead of deleting it (one `redis.call` fewer). The
/// prefix `i` is not the `r<turnSeq>` of the layout before the ring, so a
/// replica of either layout reads the other's records as absent (STALE, a
/// refusal), never as a wrong result.
pub(super) fn record_slot(turn_seq: u64) -> String {
    format!("i{}", turn_seq % RESULTS_RETAINED)
}

/// The field beside `record_slot` that holds `"<turnSeq>:<input digest>"`
/// of the record there. A field of its own, not part of the record, so
/// builds that predate it read records as before; the turnSeq in it tells
/// whether a build that did not write it left it from an older turn.
pub(super) fn digest_slot(turn_seq: u64) -> String {
    format!("d{}", turn_seq % RESULTS_RETAINED)
}

/// Where one deployment's keys live. Deployments that share a Redis (two
/// `AgentDeployment`s on one external Redis) each get a store namespace,
/// and every key of theirs starts with `baton@<namespace>` (encoded like an
/// id); the empty namespace is `baton`, the layout before namespaces, so
/// existing data keeps its keys. `@` follows `baton` in no key of the
/// default space, so no namespace's keys meet another's.
///
/// On a Redis Cluster (`clustered`) every key of a session carries its
/// bucket's hash tag rather than its id (`slots.rs`), and each bucket has
/// its own unshipped index and known-index watermark beside its sessions.
#[derive(Clone, Debug)]
pub struct KeySpace {
    pub(super) prefix: String,
    clustered: bool,
}

impl Default for KeySpace {
    fn default() -> Self {
        Self {
            prefix: "baton".into(),
            clustered: false,
        }
    }
}

impl KeySpace {
    pub fn new(namespace: &str) -> Self {
        if namespace.is_empty() {
            return Self::default();
        }
        Self {
            prefix: ["baton@", &key_part(namespace)].concat(),
            clustered: false,
        }
    }

    /// The same space laid out for a Redis Cluster.
    pub fn clustered(self) -> Self {
        Self {
            clustered: true,
            ..self
        }
    }

    pub fn is_clustered(&self) -> bool {
        self.clustered
    }

    /// How many buckets the sessions are spread over: 1 on a single server.
    pub fn buckets(&self) -> u16 {
        if self.clustered { BUCKETS } else { 1 }
    }

    /// The bucket of `key`'s session (0 on a single server).
    pub fn bucket_of_key(&self, key: &SessionKey) -> u16 {
        if self.clustered {
            bucket_of(&unshipped_member(key))
        } else {
            0
        }
    }

    /// The bucket an unshipped-index member's session is in.
    pub fn bucket_of_member(&self, member: &str) -> u16 {
        if self.clustered { bucket_of(member) } else { 0 }
    }

    /// The keys of one session.
    pub fn session(&self, key: &SessionKey) -> SessionKeys {
        SessionKeys::in_space(self, key)
    }

    /// What every key of the session `member` names starts with, and its
    /// bucket: `<prefix>:{<tenant>:<session>}` on a single server,
    /// `<prefix>:{<bucket tag>}:<tenant>:<session>` on a cluster.
    fn base_of_member(&self, member: &str) -> (String, u16) {
        if self.clustered {
            let bucket = bucket_of(member);
            let base = [&self.prefix, ":{", tag_of_bucket(bucket), "}:", member].concat();
            (base, bucket)
        } else {
            ([&self.prefix, ":{", member, "}"].concat(), 0)
        }
    }

    /// A key that is `suffix` after `<prefix>:` on a single server and
    /// lives in bucket `bucket` on a cluster.
    fn in_bucket(&self, bucket: u16, suffix: &str) -> String {
        if self.clustered {
            [&self.prefix, ":{", tag_of_bucket(bucket), "}:", suffix].concat()
        } else {
            [&self.prefix, ":", suffix].concat()
        }
    }

    /// A replica's liveness key (its value: when it last beat).
    pub(super) fn heartbeat(&self, replica: &str) -> String {
        if self.clustered {
            // Beside its info key, in one slot: one pipeline writes both.
            format!("{}:{{hb:{replica}}}:hb", self.prefix)
        } else {
            format!("{}:hb:{replica}", self.prefix)
        }
    }

    /// On a cluster, the copy of a replica's heartbeat kept in bucket
    /// `home` (one per master: see `RedisStore::is_alive`).
    pub(super) fn heartbeat_copy(&self, home: u16, replica: &str) -> String {
        self.in_bucket(home, &format!("hb:{replica}"))
    }

    /// What a replica says of itself, beside its heartbeat key (with the
    /// same TTL): a key of its own, so builds that read heartbeat keys as
    /// numbers still do.
    pub(super) fn heartbeat_info(&self, replica: &str) -> String {
        if self.clustered {
            format!("{}:{{hb:{replica}}}:info", self.prefix)
        } else {
            format!("{}:hbinfo:{replica}", self.prefix)
        }
    }

    /// Sessions whose logs may hold unshipped records, those of bucket
    /// `bucket`: member `<tenant>:<session>` (each [`key_part`]-encoded),
    /// score the time of the last commit that added it (ms, with a random
    /// fraction so that two commits in one millisecond still leave
    /// different scores; see `unindex.lua`).
    pub fn unshipped(&self, bucket: u16) -> String {
        self.in_bucket(bucket, "unshipped")
    }

    /// The known index's watermark of bucket `bucket`: the Redis run it is
    /// complete for (see `known.rs`).
    pub fn known_complete(&self, bucket: u16) -> String {
        self.in_bucket(bucket, "known:complete")
    }

    /// Replicas by heartbeat expiry (ms): member the holder id.
    /// The data layout the replicas of this namespace write.
    pub(super) fn layout(&self) -> String {
        format!("{}:layout", self.prefix)
    }

    pub(super) fn replicas(&self) -> String {
        format!("{}:replicas", self.prefix)
    }

    /// The sweeper lease: at most one shipper sweeps at a time.
    pub fn sweeper(&self) -> String {
        format!("{}:sweeper", self.prefix)
    }

    /// The key `suffix` (":state", ":known", ...) of the session an
    /// unshipped-index member names.
    pub(super) fn key_of_member(&self, member: &str, suffix: &str) -> String {
        [self.base_of_member(member).0.as_str(), suffix].concat()
    }

    /// The workspace collector's lease: at most one collects at a time.
    pub fn collector(&self) -> String {
        format!("{}:collector", self.prefix)
    }

    /// Set once the logs written before the index existed were indexed.
    pub(super) fn backfilled(&self) -> String {
        format!("{}:unshipped:backfilled", self.prefix)
    }
}

/// The unshipped index of the default key space on a single server.
pub const UNSHIPPED_INDEX: &str = "baton:unshipped";

/// The member of `key` in [`UNSHIPPED_INDEX`].
pub(super) fn unshipped_member(key: &SessionKey) -> String {
    [
        &*key_part(key.tenant.as_str()),
        ":",
        &*key_part(key.session.as_str()),
    ]
    .concat()
}

/// The session an [`UNSHIPPED_INDEX`] member names.
pub(super) fn session_of_member(member: &str) -> Option<SessionKey> {
    let (tenant, session) = member.split_once(':')?;
    SessionKey::new(&decode_key_part(tenant)?, &decode_key_part(session)?).ok()
}
