//! The dashboard's cluster view on a real control plane: `baton dashboard
//! --kubernetes` lists the `AgentDeployment`s with their replicas,
//! revisions and conditions, and records each action as an event on its
//! deployment's `AgentDeployment`. No operator runs here: the test writes
//! the status one would.

use baton_e2e::operator_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use baton_testkit::poll_async_every;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use operator_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_agent_deployments_and_records_actions_as_events() {
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, "dashboard").await;
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    let status = r#"{"status":{"replicas":2,"readyReplicas":1,"updatedReplicas":2,
        "currentRevision":"rev-old","updateRevision":"rev-new",
        "conditions":[{"type":"Ready","status":"False","reason":"ReplicasNotReady",
          "message":"1 of 2 replicas <ready>","lastTransitionTime":"2026-12-05T10:00:00Z"}]}}"#;
    kubectl_ok(
        cp,
        &[
            "patch",
            "agentdeployment",
            "support-bot",
            "-n",
            &ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        ],
        None,
    );

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    baton_store_sqlite::SqliteStore::open(&db).await.unwrap();
    let (_dashboard, base) = start_dashboard(cp, &ns, dir.path(), &[]);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let get = |path: String| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move { http.get(&url).send().await.unwrap().text().await.unwrap() }
    };

    let page = get("/dashboard/replicas".into()).await;
    assert!(
        page.contains(&format!("data-name=\"{ns}/support-bot\"")),
        "{page}"
    );
    for text in [
        "ReplicasNotReady",
        "1 of 2 replicas &lt;ready&gt;",
        "rev-old",
        "rev-new",
    ] {
        assert!(page.contains(text), "{text}: {page}");
    }

    // An action (a drain of a replica that does not exist: it fails, and
    // is audited all the same) becomes an event on the AgentDeployment.
    let confirm = get("/dashboard/confirm?action=drain&replica=replica-9".into()).await;
    let at = confirm
        .find("name=\"csrf\" value=\"")
        .expect("a csrf field")
        + 19;
    let csrf = &confirm[at..at + 64];
    let answer = http
        .post(format!("{base}/dashboard/actions/drain"))
        .form(&[("replica", "replica-9"), ("csrf", csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303);
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let event = poll_async_every(POLL, CONVERGE, "the audit event", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("DashboardDrainFailed"))
    })
    .await;
    assert_eq!(
        event.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("support-bot")
    );
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("drain by dev (loopback): replica-9"),
        "{note}"
    );
    assert!(note.contains("no live replica"), "{note}");
}

/// With `--kubernetes` and no `--sidecar-networks`, the dashboard sends its
/// admin token only to the admin address (pod IP, port 7071) of one of its
/// deployment's pods, as the EndpointSlices of the deployment's headless
/// Service list them: a heartbeat (store data anyone with store access can
/// write) pointing elsewhere gets no call. No node runs here: the test
/// writes the EndpointSlice the endpoint controller would, for a pod IP no
/// sidecar answers at (so a call made there "did not answer", or is refused
/// by whatever the machine's network puts there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_calls_only_the_admin_ports_of_its_deployments_pods() {
    use baton_session::{ReplicaId, TurnStore as _};
    let cp = control_plane();
    let client = cp.admin_client().await;
    let ns = namespace(&client, "vouch").await;
    apply_yaml(cp, &ns, &example("minimal.yaml"));
    apply_yaml(
        cp,
        &ns,
        r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: support-bot-headless-test
  labels: {kubernetes.io/service-name: support-bot-headless}
addressType: IPv4
endpoints:
  - addresses: ["10.250.0.77"]
ports:
  - {name: http, port: 7070, protocol: TCP}
  - {name: admin, port: 7071, protocol: TCP}
"#,
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    let store = baton_store_sqlite::SqliteStore::open(&db).await.unwrap();
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let trap_url = format!("http://{}", trap.local_addr().unwrap());
    for (replica, url) in [
        ("support-bot-0", "http://10.250.0.77:7071".to_owned()),
        ("support-bot-1", trap_url.clone()),
        ("support-bot-2", "http://10.250.0.77:7070".to_owned()),
    ] {
        store
            .heartbeat_with(
                &ReplicaId::new(format!("{replica}-holder")).unwrap(),
                baton_session::ReplicaInfo {
                    replica: replica.into(),
                    url: Some(url),
                    ..Default::default()
                },
                std::time::Duration::from_secs(600),
            )
            .await
            .unwrap();
    }
    let (_dashboard, base) = start_dashboard(
        cp,
        &ns,
        dir.path(),
        &[("BATON_DASHBOARD_ADMIN_TOKEN", "admin-token-0123456789")],
    );
    // The replicas page asks every live replica's sidecar for its status;
    // once the watch has the EndpointSlice, support-bot-0 is called.
    let page = poll_async_every(POLL, CONVERGE, "support-bot-0 called", || async {
        let page = reqwest::get(format!("{base}/dashboard/replicas"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        // Nothing listens there: no answer, or a refusal from whatever
        // the machine's network puts at that address.
        let called =
            page.contains("support-bot-0 did not answer") || page.contains("support-bot-0 refused");
        called.then_some(page)
    })
    .await;
    assert!(!page.contains("support-bot-0 advertises"), "{page}");
    assert!(
        page.contains(&format!("support-bot-1 advertises {trap_url}")),
        "{page}"
    );
    assert!(
        page.contains("support-bot-2 advertises http://10.250.0.77:7070"),
        "the pod's address on another port is not its admin API: {page}"
    );
    assert!(
        page.contains("not the admin port of one of its deployment"),
        "{page}"
    );
    match trap.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the dashboard connected to the advertised address: {other:?}"),
    }
}

/// `baton dashboard --kubernetes` on the embedded store in `dir` (its
/// `baton.db` and `objects`), for `ns`'s support-bot, with `env` added and
/// no sidecar networks; the process and its base URL.
fn start_dashboard(
    cp: &baton_testkit::kube::ControlPlane,
    ns: &str,
    dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (KillOnDrop, String) {
    let mut child = Command::new(baton())
        .args(["dashboard", "--listen", "127.0.0.1:0", "--kubernetes"])
        .arg("--sqlite-path")
        .arg(dir.join("baton.db"))
        .arg("--objects-dir")
        .arg(dir.join("objects"))
        .arg(format!("--store-namespace={ns}.support-bot"))
        .env("KUBECONFIG", cp.kubeconfig())
        .envs(env.iter().copied())
        .env_remove("BATON_DASHBOARD_SIDECAR_NETWORKS")
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_DATABASE_URL")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    let base = first
        .trim()
        .strip_prefix("baton dashboard listening on ")
        .and_then(|rest| rest.strip_suffix("/dashboard"))
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    let dashboard = KillOnDrop {
        child,
        _stdout: stdout,
    };
    (dashboard, base)
}

/// Kills the child process when dropped, a failed assertion included.
struct KillOnDrop {
    child: std::process::Child,
    /// Open while the process runs, so its output never meets a closed pipe.
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
