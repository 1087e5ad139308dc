//! The client against a real HTTP server on loopback that records what it
//! was sent: the token, the actor, the path and query, and each way a call
//! can fail.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use baton_admin_client::{AdminClient, AdminError, Target};
use baton_views::{ReplicaStatus, Takeover};

type Seen = Arc<Mutex<Vec<String>>>;

/// Answers every request by its path: `status` a replica status, `slow`
/// after 2 s, `refuse` 401 with an error body, `garbage` a 200 that is not
/// JSON; each request is recorded as `METHOD URI token=… actor=…`.
async fn answer(State(seen): State<Seen>, request: Request) -> axum::response::Response {
    // Everything needed from the request, owned: a borrow of it (its body
    // is not Sync) must not live across the await below.
    let (line, path) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_owned()
        };
        let line = format!(
            "{} {} auth={} actor={}",
            request.method(),
            request.uri(),
            header("authorization"),
            header("x-baton-actor")
        );
        (line, request.uri().path().to_owned())
    };
    seen.lock().unwrap().push(line);
    let status = serde_json::to_string(&ReplicaStatus {
        replica: "r-0".into(),
        holder: "r-0/1".into(),
        draining: true,
        ready: false,
        in_flight: 2,
        turns: Vec::new(),
        oldest_unshipped_ms: None,
        turn_latency: Vec::new(),
        aborted_by_drain: 0,
        drained_in_ms: None,
        unreleased_leases: 0,
        layout: None,
        store_layout: None,
    })
    .unwrap();
    let taken = serde_json::to_string(&Takeover {
        tenant: "t/1".into(),
        session: "s 2".into(),
        revoked_owner: Some("r-1".into()),
    })
    .unwrap();
    match path.as_str() {
        p if p.starts_with("/slow") => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            status.into_response()
        }
        p if p.starts_with("/refuse") => (
            StatusCode::UNAUTHORIZED,
            r#"{"error":"the admin token is wrong","outcome":"UNAUTHORIZED"}"#,
        )
            .into_response(),
        p if p.starts_with("/garbage") => "not json".into_response(),
        p if p.ends_with("/takeover") => taken.into_response(),
        _ => status.into_response(),
    }
}

async fn server() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new().fallback(answer).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

fn target(base: &str) -> Target<'_> {
    Target {
        base,
        token: Some("s3cret"),
        actor: Some("alice (dashboard)\u{7}"),
        timeout: Duration::from_millis(500),
    }
}

#[tokio::test]
async fn calls_carry_the_token_and_a_printable_actor_to_the_admin_paths() {
    let (base, seen) = server().await;
    let client = AdminClient::new(Duration::from_secs(5));
    let status = client.drain(target(&base), true).await.unwrap();
    assert!(status.draining);
    assert_eq!(status.in_flight, 2);
    client.status(target(&base)).await.unwrap();
    let taken = client.takeover(target(&base), "t/1", "s 2").await.unwrap();
    assert_eq!(taken.revoked_owner.as_deref(), Some("r-1"));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            "POST /v1/admin/drain?wait=true auth=Bearer s3cret actor=alice (dashboard)?",
            "GET /v1/admin/status auth=Bearer s3cret actor=alice (dashboard)?",
            "POST /v1/admin/tenants/t%2F1/sessions/s%202/takeover auth=Bearer s3cret actor=alice (dashboard)?",
        ]
    );
}

#[tokio::test]
async fn each_failure_is_its_own_error() {
    let (base, _) = server().await;
    let client = AdminClient::new(Duration::from_secs(5));
    let at = |path: &str| format!("{base}/{path}");

    let refused = client.status(target(&at("refuse"))).await.unwrap_err();
    assert!(
        matches!(&refused, AdminError::Refused { status: 401, reason } if reason == "the admin token is wrong"),
        "{refused:?}"
    );
    assert_eq!(
        refused.to_string(),
        "refused (401): the admin token is wrong"
    );

    let slow = client.status(target(&at("slow"))).await.unwrap_err();
    assert!(matches!(slow, AdminError::TimedOut), "{slow:?}");

    let garbage = client.status(target(&at("garbage"))).await.unwrap_err();
    assert!(matches!(garbage, AdminError::Unexpected(_)), "{garbage:?}");

    // A port nothing listens on.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let unreachable = client.status(target(&closed)).await.unwrap_err();
    assert!(
        matches!(unreachable, AdminError::Unreachable),
        "{unreachable:?}"
    );

    let bad = client
        .status(target("ftp://127.0.0.1:1"))
        .await
        .unwrap_err();
    assert!(matches!(bad, AdminError::BadUrl(_)), "{bad:?}");
}
