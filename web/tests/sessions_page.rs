//! The sessions page rendered on the server from a real store (the
//! embedded SQLite one): what it lists, its filters, hostile ids shown as
//! text, and a bad filter refused with a message naming it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use baton_session::sqlite::SqliteStore;
use baton_session::*;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

async fn commit_turns(store: &SqliteStore, tenant: &str, session: &str, turns: u64) {
    let key = SessionKey::new(tenant, session).unwrap();
    let replica = ReplicaId::new("replica-0").unwrap();
    store
        .heartbeat(&replica, Duration::from_secs(60))
        .await
        .unwrap();
    for _ in 0..turns {
        let begin = BeginRequest {
            key: key.clone(),
            replica: replica.clone(),
            turn_seq: None,
            cached_version: None,
            lease_ttl: Duration::from_secs(30),
            state_ttl: Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        };
        let BeginOutcome::Granted { lease, .. } = store.begin(&begin).await.unwrap() else {
            panic!("not granted");
        };
        let commit = CommitRequest {
            expected_version: lease.version,
            lease,
            payload: Bytes::from_static(b"{}"),
            workspace: None,
            reply: Bytes::from_static(b"ok"),
            state_ttl: Duration::from_secs(3600),
            started_at_ms: 1,
            input_digest: "in".into(),
        };
        assert!(matches!(
            store.commit(&commit).await.unwrap(),
            CommitOutcome::Committed { .. }
        ));
    }
}

async fn page(router: &axum::Router, uri: &str) -> (StatusCode, String) {
    let response = router
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn the_sessions_page_lists_filters_and_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("baton.db"))
        .await
        .unwrap();
    commit_turns(&store, "acme", "alpha", 3).await;
    commit_turns(&store, "acme", "<script>alert(1)</script>", 1).await;
    commit_turns(&store, "globex", "beta", 2).await;
    let router = baton_web::server::router(Arc::new(store));

    let (status, html) = page(&router, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("<table id=\"sessions\">"), "{html}");
    for text in ["alpha", "beta", "acme", "globex", "replica-0"] {
        assert!(html.contains(text), "{text} missing: {html}");
    }
    // The hostile id is text on the page, never markup.
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"), "{html}");
    // alpha: three turns, version 3.
    assert!(
        html.contains("<td class=\"id\">alpha</td><td class=\"version\">3</td>"),
        "{html}"
    );

    let (_, html) = page(&router, "/?tenant=globex").await;
    assert!(html.contains("beta") && !html.contains("alpha"), "{html}");
    let (_, html) = page(&router, "/?tenant=acme&prefix=al").await;
    assert!(html.contains("alpha") && !html.contains("alert"), "{html}");
    let (_, html) = page(&router, "/?tenant=nobody").await;
    assert!(html.contains("No sessions."), "{html}");

    // A tenant no id can be: refused on the page, naming the field.
    let (status, html) = page(&router, "/?tenant=%01").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("class=\"error\""), "{html}");
    assert!(html.contains("tenant:"), "{html}");
}

#[test]
fn an_empty_page_says_so() {
    use leptos::prelude::*;
    let html =
        view! { <baton_web::SessionTable page=baton_views::SessionPage::default()/> }.to_html();
    assert!(html.contains("No sessions."), "{html}");
}
