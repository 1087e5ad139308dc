//! The contract every `TurnStore` must meet: the Dapr state-store
//! conformance cases, mapped onto the turn protocol, plus leases, fencing,
//! idempotency, gaps, expiry and failover.

use std::time::Duration;

use baton_session::*;
use baton_testkit::wait_until_async;
use bytes::Bytes;

pub const LONG: Duration = Duration::from_secs(60);
pub const DAY: Duration = Duration::from_secs(86_400);

pub fn key(session: &str) -> SessionKey {
    SessionKey::new("acme", session).unwrap()
}

/// A live replica: it heartbeats before it begins turns, as the sidecar does.
pub async fn replica<S: TurnStore>(store: &S, id: &str) -> ReplicaId {
    let replica = ReplicaId::new(id).unwrap();
    store.heartbeat(&replica, LONG).await.unwrap();
    replica
}

pub fn begin_req(key: &SessionKey, replica: &ReplicaId, turn_seq: Option<u64>) -> BeginRequest {
    BeginRequest {
        key: key.clone(),
        replica: replica.clone(),
        turn_seq,
        cached_version: None,
        lease_ttl: LONG,
        state_ttl: DAY,
        reclaim_own_lease: false,
        input_digest: None,
    }
}

pub fn commit_req(lease: &Lease, payload: &str, reply: &str) -> CommitRequest {
    CommitRequest {
        lease: lease.clone(),
        expected_version: lease.version,
        payload: Bytes::from(payload.to_owned()),
        workspace: Some(format!("manifests/{}/{}", lease.version + 1, lease.fence)),
        reply: Bytes::from(reply.to_owned()),
        state_ttl: DAY,
        started_at_ms: 1,
        input_digest: "in".into(),
        input: None,
    }
}

pub async fn granted<S: TurnStore>(store: &S, req: &BeginRequest) -> (Lease, SessionState) {
    match store.begin(req).await.unwrap() {
        BeginOutcome::Granted { lease, state } => (lease, state),
        other => panic!("expected a grant, got {other:?}"),
    }
}

/// One whole turn: begin, commit `payload`, return the new version.
pub async fn turn<S: TurnStore>(
    store: &S,
    key: &SessionKey,
    replica: &ReplicaId,
    payload: &str,
) -> u64 {
    let (lease, _) = granted(store, &begin_req(key, replica, None)).await;
    match store
        .commit(&commit_req(&lease, payload, &format!("reply to {payload}")))
        .await
        .unwrap()
    {
        CommitOutcome::Committed { version } => version,
        other => panic!("commit failed: {other:?}"),
    }
}

// --- Dapr state-store conformance, on the turn protocol ---

pub async fn read_state_returns_the_committed_version<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("read");
    assert_eq!(store.read_state(&k).await.unwrap(), None);
    turn(&store, &k, &a, "one").await;
    // A turn in flight does not show: only committed versions do.
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let read = store.read_state(&k).await.unwrap().unwrap();
    assert_eq!((read.version, read.payload.as_ref()), (1, &b"one"[..]));
    assert!(read.workspace.unwrap().starts_with("manifests/1/"));
    store.commit(&commit_req(&lease, "two", "r")).await.unwrap();
    let read = store.read_state(&k).await.unwrap().unwrap();
    assert_eq!((read.version, read.payload.as_ref()), (2, &b"two"[..]));
    assert_eq!(
        read.workspace,
        Some(format!("manifests/2/{}", lease.fence)),
        "the workspace of the read version"
    );
}

pub async fn new_session_gets_a_version<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("new");
    assert_eq!(store.session(&k).await.unwrap(), None);
    let (lease, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref(), lease.turn_seq),
        (0, Some(&b""[..]), 1)
    );
    let outcome = store
        .commit(&commit_req(&lease, "one", "r1"))
        .await
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed { version: 1 });
    let view = store.session(&k).await.unwrap().unwrap();
    assert_eq!((view.version, view.last_turn_seq, view.lease), (1, 1, None));
    assert_eq!(view.last_replica.as_deref(), Some("a"));
}

pub async fn stale_version_is_rejected_and_nothing_written<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("stale");
    turn(&store, &k, &a, "one").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let mut stale = commit_req(&lease, "overwrite", "r");
    stale.expected_version = 0;
    assert_eq!(
        store.commit(&stale).await.unwrap(),
        CommitOutcome::Conflict { current_version: 1 }
    );
    assert!(store.abort(&lease).await.unwrap());
    let (_, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (1, Some(&b"one"[..]))
    );
}

pub async fn correct_version_succeeds_and_bumps<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("bump");
    for (i, payload) in ["one", "two", "three"].iter().enumerate() {
        assert_eq!(turn(&store, &k, &a, payload).await, i as u64 + 1);
    }
    let (_, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (3, Some(&b"three"[..]))
    );
}

pub async fn create_if_absent_only_once<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("create");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert!(matches!(
        store.begin(&begin_req(&k, &b, None)).await.unwrap(),
        BeginOutcome::Busy { .. }
    ));
    store
        .commit(&commit_req(&lease, "first", "r"))
        .await
        .unwrap();
    // A second writer that also believed the session new cannot create it again.
    let (lease_b, state) = granted(&store, &begin_req(&k, &b, None)).await;
    assert_eq!(state.version, 1);
    let mut create_again = commit_req(&lease_b, "second", "r");
    create_again.expected_version = 0;
    assert_eq!(
        store.commit(&create_again).await.unwrap(),
        CommitOutcome::Conflict { current_version: 1 }
    );
}

pub async fn replaying_an_old_commit_fails<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("replay");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let first = commit_req(&lease, "one", "r");
    assert_eq!(
        store.commit(&first).await.unwrap(),
        CommitOutcome::Committed { version: 1 }
    );
    assert_eq!(
        store.commit(&first).await.unwrap(),
        CommitOutcome::LeaseLost
    );
    turn(&store, &k, &a, "two").await;
    assert_eq!(
        store.commit(&first).await.unwrap(),
        CommitOutcome::LeaseLost
    );
    assert_eq!(store.session(&k).await.unwrap().unwrap().version, 2);
}

// --- leases and fencing ---

pub async fn concurrent_begins_grant_exactly_one_lease<S: TurnStore + Clone + 'static>(store: S) {
    let k = key("race");
    let mut replicas = vec![];
    for i in 0..24 {
        replicas.push(replica(&store, &format!("r{i}")).await);
    }
    let tasks: Vec<_> = replicas
        .into_iter()
        .map(|r| {
            let (store, req) = (store.clone(), begin_req(&k, &r, None));
            tokio::spawn(async move { store.begin(&req).await.unwrap() })
        })
        .collect();
    let outcomes = futures::future::join_all(tasks).await;
    let grants = outcomes
        .iter()
        .filter(|o| matches!(o.as_ref().unwrap(), BeginOutcome::Granted { .. }))
        .count();
    let busy = outcomes
        .iter()
        .filter(|o| matches!(o.as_ref().unwrap(), BeginOutcome::Busy { .. }))
        .count();
    assert_eq!((grants, busy), (1, 23));
}

pub async fn release_by_a_non_owner_is_a_no_op<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("release");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let impostor = Lease {
        replica: b.clone(),
        fence: lease.fence - 1,
        ..lease.clone()
    };
    assert!(!store.abort(&impostor).await.unwrap());
    let view = store.session(&k).await.unwrap().unwrap();
    assert_eq!(
        view.lease.map(|l| (l.owner, l.fence)),
        Some(("a".to_owned(), lease.fence))
    );
    assert!(
        matches!(store.begin(&begin_req(&k, &b, None)).await.unwrap(), BeginOutcome::Busy { owner, .. } if owner == "a")
    );
    assert!(store.abort(&lease).await.unwrap());
    assert!(
        !store.abort(&lease).await.unwrap(),
        "a second release is a no-op too"
    );
}

pub async fn renew_by_a_non_owner_fails<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("renew");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let impostor = Lease {
        fence: lease.fence + 1,
        ..lease.clone()
    };
    assert!(!store.renew(&impostor, LONG).await.unwrap());
    assert!(store.renew(&lease, LONG).await.unwrap());
}

pub async fn fences_only_grow<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("fences");
    let mut last = 0;
    for _ in 0..5 {
        let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
        assert!(lease.fence > last, "{} after {last}", lease.fence);
        last = lease.fence;
        store.abort(&lease).await.unwrap();
    }
    store.revoke(&k).await.unwrap();
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert!(lease.fence > last);
}

pub async fn an_expired_lease_is_free<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("expiry");
    // Long enough that the BUSY check below (one round trip) still finds the
    // lease on a machine stalled for a few hundred milliseconds.
    let lease_ttl = Duration::from_secs(1);
    let short = BeginRequest {
        lease_ttl,
        ..begin_req(&k, &a, None)
    };
    let (lease, _) = granted(&store, &short).await;
    match store.begin(&begin_req(&k, &b, None)).await.unwrap() {
        BeginOutcome::Busy { owner, retry_after } => {
            assert_eq!(owner, "a");
            assert!(retry_after <= lease_ttl, "{retry_after:?}");
        }
        other => panic!("expected BUSY, got {other:?}"),
    }
    wait_until_async(Duration::from_secs(5), "the lease to expire", || async {
        matches!(
            store.begin(&begin_req(&k, &b, None)).await.unwrap(),
            BeginOutcome::Granted { .. }
        )
    })
    .await;
    assert_eq!(
        store
            .commit(&commit_req(&lease, "late", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
}

pub async fn a_dead_replicas_lease_is_free_once_its_heartbeat_stops<S: TurnStore>(store: S) {
    let a = replica(&store, "dying").await;
    let b = replica(&store, "b").await;
    let k = key("failover");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert!(matches!(
        store.begin(&begin_req(&k, &b, None)).await.unwrap(),
        BeginOutcome::Busy { .. }
    ));
    // `a`'s last heartbeat, short, and only now: however slow the setup
    // above, it ran while `a` was surely alive.
    store
        .heartbeat(&a, Duration::from_millis(400))
        .await
        .unwrap();
    // `a` stops heartbeating; its 60 s lease must not hold the session for 60 s.
    wait_until_async(
        Duration::from_secs(5),
        "the dead replica's lease to be taken over",
        || async {
            matches!(
                store.begin(&begin_req(&k, &b, None)).await.unwrap(),
                BeginOutcome::Granted { .. }
            )
        },
    )
    .await;
    assert_eq!(
        store
            .commit(&commit_req(&lease, "zombie", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
}

/// A grant whose answer never reached its replica (a timeout, a reset
/// connection) leaves a lease that replica does not know it has. Asked with
/// `reclaim_own_lease` (the sidecar runs no other turn of the session), the
/// next begin of that same holder takes it over at once, under a new
/// fence; without it, or from another holder, the lease still counts.
pub async fn an_orphaned_lease_of_ones_own_is_reclaimed_at_once<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("orphan");
    turn(&store, &k, &a, "one").await;
    // The grant happened; its answer was "lost".
    let (lost, _) = granted(&store, &begin_req(&k, &a, Some(2))).await;
    for (who, reclaim) in [(&a, false), (&b, true)] {
        let req = BeginRequest {
            reclaim_own_lease: reclaim,
            ..begin_req(&k, who, Some(2))
        };
        match store.begin(&req).await.unwrap() {
            BeginOutcome::Busy { owner, .. } => assert_eq!(owner, "a"),
            other => panic!("{who} (reclaim {reclaim}) got {other:?}"),
        }
    }
    let reclaim = BeginRequest {
        reclaim_own_lease: true,
        ..begin_req(&k, &a, Some(2))
    };
    let (lease, state) = granted(&store, &reclaim).await;
    assert!(
        lease.fence > lost.fence,
        "{} <= {}",
        lease.fence,
        lost.fence
    );
    assert_eq!((lease.turn_seq, state.version), (2, 1));
    // The orphan's fence is out: had its turn gone on, it could not commit.
    assert_eq!(
        store
            .commit(&commit_req(&lost, "orphan", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
    assert_eq!(
        store.commit(&commit_req(&lease, "two", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
}

pub async fn revoke_fences_out_the_holder<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("takeover");
    turn(&store, &k, &a, "one").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(store.revoke(&k).await.unwrap().as_deref(), Some("a"));
    let (new_lease, state) = granted(&store, &begin_req(&k, &b, None)).await;
    assert!(new_lease.fence > lease.fence);
    assert_eq!(state.version, 1);
    assert_eq!(
        store
            .commit(&commit_req(&lease, "old holder", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost
    );
    assert!(!store.renew(&lease, LONG).await.unwrap());
    assert_eq!(
        store
            .commit(&commit_req(&new_lease, "new holder", "r"))
            .await
            .unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
    assert_eq!(store.revoke(&key("nobody-home")).await.unwrap(), None);
}

pub async fn an_interrupt_fences_out_the_running_turn_and_tells_it_why<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("interrupted");
    turn(&store, &k, &a, "one").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(lease.turn_seq, 2);
    assert_eq!(store.check_lease(&lease).await.unwrap(), LeaseCheck::Held);
    // Another turn than the one running: nothing happens.
    assert_eq!(store.interrupt(&k, Some(3)).await.unwrap(), None);
    assert_eq!(store.check_lease(&lease).await.unwrap(), LeaseCheck::Held);

    let stopped = store
        .interrupt(&k, Some(2))
        .await
        .unwrap()
        .expect("the running turn");
    assert_eq!(
        (stopped.owner.as_str(), stopped.fence, stopped.turn_seq),
        ("a", lease.fence, 2)
    );
    assert_eq!(
        store.check_lease(&lease).await.unwrap(),
        LeaseCheck::Interrupted
    );
    assert_eq!(
        store
            .commit(&commit_req(&lease, "interrupted", "r"))
            .await
            .unwrap(),
        CommitOutcome::LeaseLost,
        "an interrupted turn commits nothing"
    );
    assert!(!store.renew(&lease, LONG).await.unwrap());
    // Nothing runs any more: a second interrupt finds nothing.
    assert_eq!(store.interrupt(&k, None).await.unwrap(), None);

    // The next turn runs as turn 2 again, with a larger fence.
    let (next, state) = granted(&store, &begin_req(&k, &b, None)).await;
    assert!(next.fence > lease.fence);
    assert_eq!((next.turn_seq, state.version), (2, 1));
    assert_eq!(store.check_lease(&next).await.unwrap(), LeaseCheck::Held);
    assert_eq!(
        store.check_lease(&lease).await.unwrap(),
        LeaseCheck::Interrupted,
        "the interrupted turn still learns why"
    );
    // A takeover is not an interrupt.
    store.revoke(&k).await.unwrap();
    assert_eq!(store.check_lease(&next).await.unwrap(), LeaseCheck::Lost);
    assert_eq!(
        store.interrupt(&key("nobody-home"), None).await.unwrap(),
        None
    );
}

// --- idempotency and sequencing ---

pub async fn a_reader_that_wants_a_turns_stream_is_heard_at_its_lease_check<
    S: TurnStore + turn_stream::TurnStreams,
>(
    store: S,
) {
    let a = replica(&store, "a").await;
    let k = key("wanted");
    turn(&store, &k, &a, "one").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(store.check_lease(&lease).await.unwrap(), LeaseCheck::Held);
    // Another turn than the running one: nothing is marked.
    assert!(!store.want_events(&k, 1).await.unwrap());
    assert!(!store.want_events(&k, 3).await.unwrap());
    assert!(!store.want_events(&key("nobody-home"), 1).await.unwrap());
    assert_eq!(store.check_lease(&lease).await.unwrap(), LeaseCheck::Held);
    assert!(store.want_events(&k, 2).await.unwrap());
    assert_eq!(
        store.check_lease(&lease).await.unwrap(),
        LeaseCheck::Followed
    );
    // The mark goes with its turn: the next one starts unwanted.
    assert_eq!(
        store.commit(&commit_req(&lease, "two", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
    let (next, _) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(next.turn_seq, 3);
    assert_eq!(store.check_lease(&next).await.unwrap(), LeaseCheck::Held);
    // A wanted turn that is taken over is lost all the same.
    assert!(store.want_events(&k, 3).await.unwrap());
    store.revoke(&k).await.unwrap();
    assert_eq!(store.check_lease(&next).await.unwrap(), LeaseCheck::Lost);
}

pub async fn a_duplicate_turn_seq_returns_the_stored_result<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("dup");
    let (lease, _) = granted(&store, &begin_req(&k, &a, Some(1))).await;
    store
        .commit(&commit_req(&lease, "one", "the first reply"))
        .await
        .unwrap();
    turn(&store, &k, &a, "two").await;
    let retry = store.begin(&begin_req(&k, &b, Some(1))).await.unwrap();
    let expected = TurnResult {
        turn_seq: 1,
        version: 1,
        reply: Bytes::from("the first reply"),
    };
    assert_eq!(retry, BeginOutcome::Duplicate(expected));
    // No lease was taken by the duplicate: the next turn proceeds at once.
    let (lease, state) = granted(&store, &begin_req(&k, &b, Some(3))).await;
    assert_eq!((lease.turn_seq, state.version), (3, 2));
}

/// A turnSeq is an idempotency key: retried with the same input it gets
/// the stored result; reused with another input it is refused (the IETF
/// Idempotency-Key draft and Stripe answer 422), and nothing is run or
/// written. A caller that sends no digest compares nothing.
pub async fn a_turn_seq_reused_with_another_input_is_refused<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("reused");
    let asking = |input: Option<&str>| BeginRequest {
        input_digest: input.map(|i| turn_record::digest(i.as_bytes())),
        ..begin_req(&k, &a, Some(1))
    };
    let (lease, _) = granted(&store, &asking(Some("hello"))).await;
    let commit = CommitRequest {
        input_digest: turn_record::digest(b"hello"),
        ..commit_req(&lease, "one", "hi there")
    };
    store.commit(&commit).await.unwrap();
    match store.begin(&asking(Some("hello"))).await.unwrap() {
        BeginOutcome::Duplicate(r) => assert_eq!(&r.reply[..], b"hi there"),
        other => panic!("the same input: {other:?}"),
    }
    assert_eq!(
        store.begin(&asking(Some("goodbye"))).await.unwrap(),
        BeginOutcome::TurnSeqReused { turn_seq: 1 }
    );
    assert!(matches!(
        store.begin(&asking(None)).await.unwrap(),
        BeginOutcome::Duplicate(_)
    ));
    let state = store.read_state(&k).await.unwrap().unwrap();
    assert_eq!((state.version, &state.payload[..]), (1, &b"one"[..]));
    // The next turnSeq is a new turn, whatever its input.
    let (lease, _) = granted(
        &store,
        &BeginRequest {
            input_digest: Some(turn_record::digest(b"goodbye")),
            ..begin_req(&k, &a, Some(2))
        },
    )
    .await;
    assert_eq!(lease.turn_seq, 2);
}

pub async fn a_duplicate_wins_over_busy<S: TurnStore>(store: S) {
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("dup-busy");
    turn(&store, &k, &a, "one").await;
    let _running = granted(&store, &begin_req(&k, &a, Some(2))).await;
    assert!(matches!(
        store.begin(&begin_req(&k, &b, Some(1))).await.unwrap(),
        BeginOutcome::Duplicate(_)
    ));
    assert!(matches!(
        store.begin(&begin_req(&k, &b, Some(2))).await.unwrap(),
        BeginOutcome::Busy { .. }
    ));
}

pub async fn a_gap_in_turn_seq_is_refused<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("gap");
    assert_eq!(
        store.begin(&begin_req(&k, &a, Some(3))).await.unwrap(),
        BeginOutcome::Gap { next_turn_seq: 1 }
    );
    turn(&store, &k, &a, "one").await;
    assert_eq!(
        store.begin(&begin_req(&k, &a, Some(5))).await.unwrap(),
        BeginOutcome::Gap { next_turn_seq: 2 }
    );
    assert!(
        store.session(&k).await.unwrap().unwrap().lease.is_none(),
        "a GAP takes no lease"
    );
}

pub async fn results_older_than_the_window_are_stale<S: TurnStore>(store: S, window: u64) {
    let a = replica(&store, "a").await;
    let k = key("window");
    for i in 0..window + 2 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    assert_eq!(
        store.begin(&begin_req(&k, &a, Some(1))).await.unwrap(),
        BeginOutcome::Stale {
            last_turn_seq: window + 2
        }
    );
    assert!(matches!(
        store.begin(&begin_req(&k, &a, Some(3))).await.unwrap(),
        BeginOutcome::Duplicate(_)
    ));
}

pub async fn a_cached_version_skips_the_payload<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("cache");
    turn(&store, &k, &a, "one").await;
    let req = BeginRequest {
        cached_version: Some(1),
        ..begin_req(&k, &a, None)
    };
    let (lease, state) = granted(&store, &req).await;
    assert_eq!((state.version, state.payload), (1, None));
    store.abort(&lease).await.unwrap();
    let req = BeginRequest {
        cached_version: Some(0),
        ..begin_req(&k, &a, None)
    };
    let (_, state) = granted(&store, &req).await;
    assert_eq!(state.payload.as_deref(), Some(&b"one"[..]));
}

pub async fn state_expires_after_its_ttl<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("ttl");
    // The deployment's state TTL, used by begin and commit alike.
    let ttl = Duration::from_millis(300);
    let begin = BeginRequest {
        state_ttl: ttl,
        ..begin_req(&k, &a, None)
    };
    let (lease, _) = granted(&store, &begin).await;
    let req = CommitRequest {
        state_ttl: ttl,
        ..commit_req(&lease, "brief", "r")
    };
    assert!(matches!(
        store.commit(&req).await.unwrap(),
        CommitOutcome::Committed { version: 1 }
    ));
    wait_until_async(Duration::from_secs(5), "the state to expire", || async {
        store.session(&k).await.unwrap().is_none()
    })
    .await;
    let (_, state) = granted(&store, &begin).await;
    assert_eq!(
        (state.payload.as_deref(), state.workspace),
        (Some(&b""[..]), None),
        "the state is gone"
    );
}

/// A caller that holds version L's payload and says so (`cached_version`)
/// must not be told to keep using it once the state expired: the state it
/// gets back is the empty one, under a version other than L. A backend that
/// keeps a session's counters past its TTL (`keeps_counters`: with the
/// ledger, SQLite) answers L + 1 and the next turnSeq: versions, fences and
/// turnSeqs never go backwards. Redis alone keeps nothing and starts again.
pub async fn a_cached_version_is_not_reused_after_the_state_expires<S: TurnStore>(
    store: S,
    keeps_counters: bool,
) {
    let a = replica(&store, "a").await;
    let k = key("cache-ttl");
    let ttl = Duration::from_millis(300);
    let begin = BeginRequest {
        state_ttl: ttl,
        ..begin_req(&k, &a, None)
    };
    let (first, _) = granted(&store, &begin).await;
    let cached = match store
        .commit(&CommitRequest {
            state_ttl: ttl,
            ..commit_req(&first, "what the caller holds", "r")
        })
        .await
        .unwrap()
    {
        CommitOutcome::Committed { version } => version,
        other => panic!("commit failed: {other:?}"),
    };
    wait_until_async(Duration::from_secs(5), "the state to expire", || async {
        store.session(&k).await.unwrap().is_none()
    })
    .await;
    let with_cache = BeginRequest {
        cached_version: Some(cached),
        ..begin.clone()
    };
    let (lease, state) = granted(&store, &with_cache).await;
    assert_eq!(
        (state.payload.as_deref(), state.workspace.as_deref()),
        (Some(&b""[..]), None),
        "the caller must get the empty state, not keep its cached payload"
    );
    assert_ne!(
        state.version, cached,
        "the emptied state answers under the version the caller cached"
    );
    assert_eq!(lease.version, state.version);
    if keeps_counters {
        assert_eq!(
            (state.version, lease.turn_seq),
            (cached + 1, first.turn_seq + 1),
            "a new version; the next turnSeq"
        );
        assert!(lease.fence > first.fence, "fences only grow");
    } else {
        assert_eq!((state.version, lease.turn_seq), (0, 1), "a new session");
    }
    // The turn continues from the reset state like any other.
    assert_eq!(
        store
            .commit(&CommitRequest {
                state_ttl: ttl,
                ..commit_req(&lease, "after the reset", "r")
            })
            .await
            .unwrap(),
        CommitOutcome::Committed {
            version: state.version + 1
        }
    );
}

/// A grant keeps the state alive for at least the lease, and a renewal for
/// at least its extension: a long turn can commit on a session whose state
/// TTL is shorter than the turn.
pub async fn a_running_turn_outlives_the_state_ttl<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let ttl = Duration::from_millis(300);
    let short = |k: &SessionKey| BeginRequest {
        state_ttl: ttl,
        ..begin_req(k, &a, None)
    };
    let commit = |lease: &Lease, payload: &str| CommitRequest {
        state_ttl: ttl,
        ..commit_req(lease, payload, "r")
    };
    let (running, idle) = (key("running"), key("idle"));
    // `running` last, and granted again right after its commit: only that one
    // round trip has to fit in the 300 ms (creating a session can cost more).
    for k in [&idle, &running] {
        let (lease, _) = granted(&store, &short(k)).await;
        store.commit(&commit(&lease, "one")).await.unwrap();
    }
    // The lease (60 s) outlasts the state TTL (300 ms).
    let (lease, state) = granted(&store, &short(&running)).await;
    assert_eq!(state.version, 1);
    // The idle session, committed as long ago with the same TTL, expires.
    wait_until_async(
        Duration::from_secs(5),
        "the idle state to expire",
        || async { store.session(&idle).await.unwrap().is_none() },
    )
    .await;
    assert!(store.renew(&lease, LONG).await.unwrap());
    assert_eq!(
        store.commit(&commit(&lease, "two")).await.unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
    let kept = store.read_state(&running).await.unwrap().expect("state");
    assert_eq!((kept.version, &kept.payload[..]), (2, &b"two"[..]));
}

pub async fn tenants_are_separate<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let one = SessionKey::new("tenant-one", "s-1").unwrap();
    let two = SessionKey::new("tenant-two", "s-1").unwrap();
    turn(&store, &one, &a, "one's state").await;
    let (_, state) = granted(&store, &begin_req(&two, &a, None)).await;
    assert_eq!(
        (state.version, state.payload.as_deref()),
        (0, Some(&b""[..]))
    );
}

pub async fn workspace_refs_travel_with_the_state<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("ws");
    let (lease, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(state.workspace, None);
    let req = commit_req(&lease, "one", "r");
    store.commit(&req).await.unwrap();
    let (_, state) = granted(&store, &begin_req(&k, &a, None)).await;
    assert_eq!(state.workspace, req.workspace);
}

// --- the catalog the dashboard reads ---

pub async fn sessions_list_in_key_order_page_by_page<S: TurnStore + SessionCatalog>(store: S) {
    let a = replica(&store, "a").await;
    let b = replica(&store, "b-1").await;
    let keys = [
        ("acme", "a1", &a),
        ("acme", "a2", &a),
        ("acme", "b1", &a),
        ("other", "a1", &b),
    ];
    for (tenant, session, holder) in keys {
        turn(
            &store,
            &SessionKey::new(tenant, session).unwrap(),
            holder,
            "x",
        )
        .await;
    }
    let all = ListQuery {
        limit: 100,
        ..ListQuery::default()
    };
    wait_until_async(
        Duration::from_secs(10),
        "every session to be listed",
        || async {
            store
                .list_sessions(&all)
                .await
                .map(|p| p.sessions.len())
                .unwrap_or(0)
                == 4
        },
    )
    .await;
    let names = |page: &SessionPage| {
        page.sessions
            .iter()
            .map(|s| s.key.to_string())
            .collect::<Vec<_>>()
    };

    let first = store
        .list_sessions(&ListQuery {
            limit: 2,
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(names(&first), ["acme/a1", "acme/a2"]);
    let second = store
        .list_sessions(&ListQuery {
            limit: 2,
            after: first.next.clone(),
            ..ListQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(names(&second), ["acme/b1", "other/a1"]);
    assert_eq!(second.next, None);

    let acme = ListQuery {
        tenant: Some(TenantId::new("acme").unwrap()),
        limit: 100,
        ..ListQuery::default()
    };
    assert_eq!(
        names(&store.list_sessions(&acme).await.unwrap()),
        ["acme/a1", "acme/a2", "acme/b1"]
    );
    let prefixed = ListQuery {
        prefix: Some("a".into()),
        ..acme.clone()
    };
    assert_eq!(
        names(&store.list_sessions(&prefixed).await.unwrap()),
        ["acme/a1", "acme/a2"]
    );
    let wildcard = ListQuery {
        prefix: Some("_".into()),
        ..acme
    };
    assert!(
        store
            .list_sessions(&wildcard)
            .await
            .unwrap()
            .sessions
            .is_empty(),
        "'_' is not a wildcard"
    );
    let on_b = ListQuery {
        replica: Some("b".into()),
        ..all.clone()
    };
    assert_eq!(
        names(&store.list_sessions(&on_b).await.unwrap()),
        ["other/a1"],
        "the replica filter matches the holder id's start"
    );
    let clamped = store.list_sessions(&ListQuery::default()).await.unwrap();
    assert_eq!(clamped.sessions.len(), 1, "a zero limit is clamped to one");

    let row = &store.list_sessions(&all).await.unwrap().sessions[0];
    assert_eq!(
        (
            row.version,
            row.last_turn_seq,
            row.turn_count,
            row.last_replica.as_deref()
        ),
        (1, 1, 1, Some("a"))
    );
}

pub async fn turn_history_is_newest_first<S: TurnStore + SessionCatalog>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("history");
    for i in 1..=3 {
        turn(&store, &k, &a, &format!("t{i}")).await;
    }
    wait_until_async(
        Duration::from_secs(10),
        "three turns in the history",
        || async { store.turns(&k, 10).await.map(|t| t.len()).unwrap_or(0) == 3 },
    )
    .await;
    let turns = store.turns(&k, 2).await.unwrap();
    assert_eq!(
        turns
            .iter()
            .map(|t| (t.turn_seq, t.version))
            .collect::<Vec<_>>(),
        [(3, 3), (2, 2)]
    );
    assert!(
        turns
            .iter()
            .all(|t| t.replica == "a" && t.fence > 0 && t.reply_digest.len() == 64)
    );
}

pub async fn the_history_keeps_what_was_said_and_forgets_past_the_retention<
    S: TurnStore + SessionCatalog + LedgerRetention,
>(
    store: S,
) {
    let a = replica(&store, "a").await;
    let k = key("said");
    let said = "my name is <b>Lin</b> \"用户\"\n";
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let mut full = commit_req(&lease, "{}", "Hi <i>Lin</i>");
    full.input = Some(said.to_owned());
    store.commit(&full).await.unwrap();
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    store
        .commit(&commit_req(&lease, "{}", "digests alone"))
        .await
        .unwrap();
    wait_until_async(
        Duration::from_secs(10),
        "two turns in the history",
        || async { store.turns(&k, 10).await.map(|t| t.len()).unwrap_or(0) == 2 },
    )
    .await;
    let turns = store.turns(&k, 10).await.unwrap();
    assert_eq!(
        (turns[0].input.as_deref(), turns[0].reply.as_deref()),
        (None, None),
        "a turn committed with digests alone"
    );
    assert_eq!(
        (turns[1].input.as_deref(), turns[1].reply.as_deref()),
        (Some(said), Some("Hi <i>Lin</i>")),
        "kept as said"
    );
    assert_eq!(
        turns[1].input_digest, "in",
        "the digests stay beside the text"
    );
    assert!(turns.iter().all(|t| !t.interrupted));

    // A turn an interrupt stopped: in the history, below nothing newer.
    let now = baton_session::turn_record::now_ms();
    let stopped = TurnRecord {
        tenant: k.tenant.to_string(),
        session: k.session.to_string(),
        turn_seq: 3,
        version: 2,
        replica: "a".into(),
        fence: 99,
        input_digest: "stop".into(),
        reply_digest: String::new(),
        workspace: None,
        started_at_ms: now - 10,
        committed_at_ms: now,
        input: Some("never mind".into()),
        reply: None,
        interrupted: true,
    };
    store.record_interrupted(&stopped).await.unwrap();
    store.record_interrupted(&stopped).await.unwrap(); // once per attempt
    let turns = store.turns(&k, 10).await.unwrap();
    assert_eq!(
        turns
            .iter()
            .map(|t| (t.turn_seq, t.interrupted))
            .collect::<Vec<_>>(),
        [(3, true), (2, false), (1, false)]
    );
    assert_eq!(turns[0], stopped);

    // Nothing is older than an hour: nothing goes.
    assert_eq!(
        store
            .forget_turns_before(now - 3_600_000, 10)
            .await
            .unwrap(),
        0
    );
    // Everything is older than a moment from now: it goes, a batch (per
    // table) at a time.
    assert_eq!(store.forget_turns_before(now + 60_000, 1).await.unwrap(), 2);
    assert_eq!(
        store.forget_turns_before(now + 60_000, 10).await.unwrap(),
        1
    );
    assert!(store.turns(&k, 10).await.unwrap().is_empty());
    // The session itself is untouched.
    let view = store.inspect(&k).await.unwrap().expect("the session");
    assert_eq!((view.version, view.last_turn_seq), (2, 2));
}

pub async fn replicas_are_listed_while_they_heartbeat<S: TurnStore + SessionCatalog>(store: S) {
    replica(&store, "steady").await;
    let fading = replica(&store, "fading").await;
    let ids = |r: Vec<ReplicaView>| r.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(store.replicas().await.unwrap()), ["fading", "steady"]);
    // Its last heartbeat, short.
    store
        .heartbeat(&fading, Duration::from_millis(300))
        .await
        .unwrap();
    wait_until_async(
        Duration::from_secs(5),
        "the fading replica to drop out",
        || async { ids(store.replicas().await.unwrap()) == ["steady"] },
    )
    .await;
}

// --- bad input ---

pub async fn oversized_commits_are_refused_and_nothing_is_overwritten<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("big");
    turn(&store, &k, &a, "small").await;
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let huge = CommitRequest {
        payload: Bytes::from(vec![b'x'; MAX_PAYLOAD_BYTES + 1]),
        ..commit_req(&lease, "", "r")
    };
    match store.commit(&huge).await {
        Err(StoreError::TooLarge { what, limit, .. }) => {
            assert_eq!((what, limit), ("the state payload", MAX_PAYLOAD_BYTES))
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let long_reply = CommitRequest {
        reply: Bytes::from(vec![b'x'; MAX_REPLY_BYTES + 1]),
        ..commit_req(&lease, "ok", "")
    };
    assert!(matches!(
        store.commit(&long_reply).await,
        Err(StoreError::TooLarge {
            what: "the reply",
            ..
        })
    ));
    // Nothing was written and the lease still holds: the turn can finish properly.
    assert_eq!(
        store
            .commit(&commit_req(&lease, "fine", "r"))
            .await
            .unwrap(),
        CommitOutcome::Committed { version: 2 }
    );
}

pub async fn a_commit_cannot_move_its_turn_seq<S: TurnStore>(store: S) {
    let a = replica(&store, "a").await;
    let k = key("forged");
    let (lease, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let forged = Lease {
        turn_seq: lease.turn_seq + 5,
        ..lease.clone()
    };
    assert_eq!(
        store.commit(&commit_req(&forged, "x", "r")).await.unwrap(),
        CommitOutcome::LeaseLost
    );
    assert_eq!(
        store.commit(&commit_req(&lease, "y", "r")).await.unwrap(),
        CommitOutcome::Committed { version: 1 }
    );
    assert_eq!(store.session(&k).await.unwrap().unwrap().last_turn_seq, 1);
}

// --- turn streams ---

fn event(
    kind: turn_stream::EventKind,
    lease: &Lease,
    n: u64,
    data: &str,
) -> turn_stream::StreamEvent {
    turn_stream::StreamEvent {
        kind,
        attempt: lease.fence,
        n,
        data: data.to_owned(),
    }
}

/// A turn's stream keeps one attempt's events in order, resumes after any
/// of them, and takes nothing from an attempt a newer one has written after
/// (it was fenced out), nor anything twice.
pub async fn a_turns_stream_keeps_its_order_and_refuses_an_older_attempt<
    S: TurnStore + turn_stream::TurnStreams,
>(
    store: S,
) {
    use turn_stream::EventKind::{Delta, Progress, Turn};
    let (a, b) = (replica(&store, "a").await, replica(&store, "b").await);
    let k = key("streamed");
    let (first, _) = granted(&store, &begin_req(&k, &a, None)).await;
    let opening = [
        event(Turn, &first, 0, r#"{"turnSeq":1}"#),
        event(Delta, &first, 1, r#"{"text":"Hel"}"#),
    ];
    assert!(store.append_events(&k, 1, &opening).await.unwrap());
    assert_eq!(store.read_events(&k, 1, None, 100).await.unwrap(), opening);
    assert_eq!(
        store
            .read_events(&k, 1, Some((first.fence, 0)), 100)
            .await
            .unwrap(),
        opening[1..]
    );
    // The same events again (a retried append), or one already passed:
    // refused, nothing doubled.
    assert!(!store.append_events(&k, 1, &opening[1..]).await.unwrap());
    let more = [
        event(Delta, &first, 2, r#"{"text":"lo"}"#),
        event(Progress, &first, 3, r#"{"name":"tool"}"#),
    ];
    assert!(store.append_events(&k, 1, &more).await.unwrap());
    assert_eq!(store.read_events(&k, 1, None, 100).await.unwrap().len(), 4);
    assert_eq!(
        store.read_events(&k, 1, None, 3).await.unwrap().len(),
        3,
        "the limit"
    );

    // Taken over: the new attempt writes, and the old one adds nothing after.
    store.revoke(&k).await.unwrap();
    let (second, _) = granted(&store, &begin_req(&k, &b, Some(1))).await;
    assert!(second.fence > first.fence);
    assert!(
        store
            .append_events(&k, 1, &[event(Turn, &second, 0, r#"{"turnSeq":1}"#)])
            .await
            .unwrap()
    );
    assert!(
        !store
            .append_events(&k, 1, &[event(Delta, &first, 4, r#"{"text":"late"}"#)])
            .await
            .unwrap(),
        "a fenced-out attempt appended after the newer one"
    );
    let all = store.read_events(&k, 1, None, 100).await.unwrap();
    let positions: Vec<(u64, u64)> = all.iter().map(|e| e.position()).collect();
    assert_eq!(
        positions,
        [
            (first.fence, 0),
            (first.fence, 1),
            (first.fence, 2),
            (first.fence, 3),
            (second.fence, 0)
        ]
    );
    assert_eq!(
        store
            .read_events(&k, 1, Some((first.fence, 3)), 100)
            .await
            .unwrap(),
        all[4..]
    );
    // Other turns and other sessions have streams of their own.
    assert!(
        store
            .read_events(&k, 2, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .read_events(&key("other"), 1, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
    let globex = SessionKey::new("globex", "streamed").unwrap();
    assert!(
        store
            .read_events(&globex, 1, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}
