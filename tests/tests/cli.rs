//! The `baton` command line, run as a real process: the CRD it prints, the
//! examples it validates and renders, and the invalid resources it refuses.
//!
//! Rendered manifests are checked by `kubernetes-validate --strict` against
//! the Kubernetes 1.33 schemas (PyPI, offline); `scripts/test` installs it.

use baton_e2e::baton as baton_binary;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

fn baton(args: &[&str]) -> Output {
    Command::new(baton_binary())
        .args(args)
        .current_dir(repo())
        .output()
        .expect("baton runs")
}

fn baton_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(baton_binary())
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("baton runs");
    // baton may refuse before reading everything; a closed pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(repo().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML files in {dir}");
    files
}

fn examples() -> Vec<PathBuf> {
    yaml_files("manifests/examples")
}

const CREDENTIALS: &str = "tests/fixtures/credentials.yaml";

#[test]
fn printed_crd_matches_the_committed_file() {
    let out = baton(&["crd"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let committed =
        std::fs::read_to_string(repo().join("manifests/crds/agentdeployments.baton.dev.yaml"))
            .unwrap();
    assert!(
        text(&out.stdout) == committed,
        "manifests/crds/agentdeployments.baton.dev.yaml is stale: run `cargo run -q -p baton -- crd > manifests/crds/agentdeployments.baton.dev.yaml`"
    );
}

#[test]
fn every_example_is_valid() {
    for example in examples() {
        let out = baton(&["validate", "-f", example.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}: {}",
            example.display(),
            text(&out.stderr)
        );
    }
}

/// Finds `kubernetes-validate`: `$KUBERNETES_VALIDATE`, else the PATH.
fn kubernetes_validate() -> Command {
    let program =
        std::env::var("KUBERNETES_VALIDATE").unwrap_or_else(|_| "kubernetes-validate".into());
    let probe = Command::new(&program).arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "kubernetes-validate not found: run the tests through `scripts/test`, which installs it, or set KUBERNETES_VALIDATE"
    );
    Command::new(program)
}

#[test]
fn every_rendered_example_passes_kubernetes_validate_strict() {
    let dir = tempfile::tempdir().unwrap();
    let mut rendered = vec![];
    for example in examples() {
        let out = baton(&[
            "render",
            "-f",
            example.to_str().unwrap(),
            "--credentials",
            CREDENTIALS,
        ]);
        assert!(
            out.status.success(),
            "{}: {}",
            example.display(),
            text(&out.stderr)
        );
        let path = dir.path().join(example.file_name().unwrap());
        std::fs::write(&path, &out.stdout).unwrap();
        rendered.push(path);
    }
    rendered.push(repo().join("manifests/crds/agentdeployments.baton.dev.yaml"));
    let out = kubernetes_validate()
        .args(["--strict", "-k", "1.33.0", "--quiet"])
        .args(&rendered)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubernetes-validate failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn rendered_objects_per_example() {
    let kinds = |example: &str| {
        let out = baton(&["render", "-f", example, "--credentials", CREDENTIALS]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("kind: "))
            .map(|l| l[6..].to_owned())
            .collect::<Vec<_>>()
    };
    let managed = kinds("manifests/examples/minimal.yaml");
    assert_eq!(
        managed.iter().filter(|k| *k == "StatefulSet").count(),
        4,
        "{managed:?}"
    );
    assert_eq!(
        managed.iter().filter(|k| *k == "Job").count(),
        1,
        "{managed:?}"
    );
    let external = kinds("manifests/examples/external-dependencies.yaml");
    assert_eq!(
        external,
        [
            "ServiceAccount",
            "Secret",
            "ConfigMap",
            "Service",
            "Service",
            "NetworkPolicy",
            "StatefulSet",
            "PodDisruptionBudget"
        ]
    );
    // The managed stores get a policy of their own; none at all on request.
    assert_eq!(
        managed.iter().filter(|k| *k == "NetworkPolicy").count(),
        2,
        "{managed:?}"
    );
    let out = baton(&[
        "render",
        "-f",
        "manifests/examples/minimal.yaml",
        "--credentials",
        CREDENTIALS,
        "--network-policies=false",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains("kind: NetworkPolicy"));
}

#[test]
fn render_is_byte_identical_for_the_same_input() {
    for example in examples() {
        let args = [
            "render",
            "-f",
            example.to_str().unwrap(),
            "--credentials",
            CREDENTIALS,
        ];
        let (a, b) = (baton(&args), baton(&args));
        assert!(a.status.success());
        assert_eq!(a.stdout, b.stdout, "{}", example.display());
    }
}

#[test]
fn render_without_credentials_generates_them_and_says_so() {
    let out = baton(&["render", "-f", "manifests/examples/minimal.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("# Store credentials were generated"));
}

#[test]
fn manifests_can_come_from_standard_input() {
    let manifest = std::fs::read(repo().join("manifests/examples/minimal.yaml")).unwrap();
    let out = baton_stdin(&["validate", "-f", "-"], &manifest);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// The `openAPIV3Schema` of the generated CRD, as a JSON Schema validator.
fn crd_schema() -> jsonschema::Validator {
    let crd: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("manifests/crds/agentdeployments.baton.dev.yaml"))
            .unwrap(),
    )
    .unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    jsonschema::validator_for(schema).expect("the CRD schema is a valid JSON Schema")
}

#[test]
fn every_example_validates_against_the_generated_crd_schema() {
    let schema = crd_schema();
    for example in examples() {
        let value: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&example).unwrap()).unwrap();
        let errors: Vec<String> = schema
            .iter_errors(&value)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", example.display());
    }
}

#[test]
fn the_crd_schema_itself_refuses_what_it_can_see() {
    // The OpenAPI level alone (no CEL, no Rust validation) catches these.
    let schema = crd_schema();
    for (field, bad) in [
        ("replicas", serde_json::json!(-1)),
        ("replicas", serde_json::json!(100000)),
        ("agentPort", serde_json::json!(70000)),
        ("image", serde_json::json!("")),
        ("imagePullPolicy", serde_json::json!("Sometimes")),
    ] {
        let mut value = serde_json::json!({"apiVersion": "baton.dev/v1alpha1", "kind": "AgentDeployment", "metadata": {"name": "bot"}, "spec": {"image": "x"}});
        value["spec"][field] = bad.clone();
        assert!(
            !schema.is_valid(&value),
            "spec.{field} = {bad} passed the schema"
        );
    }
    let mut value = serde_json::json!({"apiVersion": "baton.dev/v1alpha1", "kind": "AgentDeployment", "metadata": {"name": "bot"}, "spec": {"image": "x", "session": {"leaseTtl": "thirty seconds"}}});
    assert!(
        !schema.is_valid(&value),
        "an unparsable duration passed the schema pattern"
    );
    value["spec"]["session"]["leaseTtl"] = serde_json::json!("1m30s");
    assert!(schema.is_valid(&value));
}

#[test]
fn the_crd_carries_cel_rules_for_the_cross_field_constraints() {
    let crd = text(&baton(&["crd"]).stdout);
    for rule in [
        "has(self.managed) != has(self.external)",
        "duration(self.renewInterval) < duration(self.leaseTtl)",
        "duration(self.leaseTtl) >= duration('2s')",
    ] {
        assert!(crd.contains(rule), "missing CEL rule {rule}");
    }
}

/// Each file in tests/fixtures/invalid names, in `# expect:` lines, the
/// violations `baton validate` must report (field path and reason).
#[test]
fn invalid_resources_are_refused_with_the_field_and_the_rule_and_nothing_is_rendered() {
    let fixtures = yaml_files("tests/fixtures/invalid");
    assert!(
        fixtures.len() >= 15,
        "the table needs at least 15 invalid resources"
    );
    for fixture in fixtures {
        let path = fixture.to_str().unwrap();
        let expected: Vec<String> = std::fs::read_to_string(&fixture)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: ").map(str::to_owned))
            .collect();
        assert!(!expected.is_empty(), "{path} has no `# expect:` line");

        let out = baton(&["validate", "-f", path]);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{path} was accepted: {}",
            text(&out.stdout)
        );
        for line in &expected {
            assert!(
                stderr.contains(line.as_str()),
                "{path}: expected {line:?} in\n{stderr}"
            );
        }

        let out = baton(&["render", "-f", path, "--credentials", CREDENTIALS]);
        assert_eq!(out.status.code(), Some(1), "{path} was rendered");
        assert!(
            out.stdout.is_empty(),
            "{path}: render printed objects for an invalid resource"
        );
        assert!(text(&out.stderr).contains(expected[0].as_str()));
    }
}

#[test]
fn oversized_and_binary_input_is_refused_clearly() {
    let mut big = b"apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: bot}\nspec:\n  image: x\n  podAnnotations:\n".to_vec();
    while big.len() < 10 * 1024 * 1024 {
        big.extend_from_slice(format!("    k{}: {}\n", big.len(), "v".repeat(100)).as_bytes());
    }
    let out = baton_stdin(&["validate", "-f", "-"], &big);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("larger than 1048576 bytes"),
        "{}",
        text(&out.stderr)
    );

    let out = baton_stdin(&["validate", "-f", "-"], &[0xff, 0xfe, 0x00, 0x81, 0x92]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("UTF-8"), "{}", text(&out.stderr));

    let out = baton(&["validate", "-f", "does/not/exist.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("opening does/not/exist.yaml"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn yaml_bombs_do_not_blow_up() {
    // Nested aliases that expand exponentially: refused, not expanded.
    let mut bomb = String::from(
        "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: bot}\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n",
    );
    for i in 1..12 {
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n",
            p = i - 1
        ));
    }
    bomb.push_str("spec: {image: x, podLabels: *a11}\n");
    let out = baton_stdin(&["validate", "-f", "-"], bomb.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not a valid AgentDeployment"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_reference_agent_serves_the_agent_contract() {
    use std::io::{BufRead, BufReader, Read};
    let mut agent = Command::new(baton_binary())
        .args(["agent", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(agent.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let address = first
        .trim()
        .strip_prefix("baton agent listening on http://")
        .expect(&first)
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let body = serde_json::json!({
        "session": "s-1", "tenant": "acme", "turnSeq": 1, "input": "我叫小林",
        "state": null, "workspaceDir": dir.path(),
    })
    .to_string();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "POST /v1/turn HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("你好，小林！"), "{response}");
    assert!(
        std::fs::read_to_string(dir.path().join("notes.md"))
            .unwrap()
            .contains("我叫小林")
    );

    let out = baton(&["agent", "--failure-rate", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("must be between 0.0 and 1.0"),
        "{}",
        text(&out.stderr)
    );
}

/// `baton dashboard` over the embedded store: the sessions page lists what
/// was committed; missing or half-given stores are refused naming the
/// setting.
#[test]
fn the_dashboard_serves_the_sessions_of_an_embedded_store() {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("baton.db");
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use baton_session::*;
        let store = baton_store_sqlite::SqliteStore::open(&db).await.unwrap();
        let replica = ReplicaId::new("replica-0").unwrap();
        store
            .heartbeat(&replica, std::time::Duration::from_secs(60))
            .await
            .unwrap();
        let begin = BeginRequest {
            key: SessionKey::new("acme", "lin@example.com").unwrap(),
            replica,
            turn_seq: None,
            cached_version: None,
            lease_ttl: std::time::Duration::from_secs(30),
            state_ttl: std::time::Duration::from_secs(3600),
            reclaim_own_lease: false,
            input_digest: None,
        };
        let BeginOutcome::Granted { lease, .. } = store.begin(&begin).await.unwrap() else {
            panic!("not granted")
        };
        let commit = CommitRequest {
            expected_version: lease.version,
            lease,
            payload: bytes::Bytes::from_static(b"{}"),
            workspace: None,
            reply: bytes::Bytes::from_static(b"ok"),
            state_ttl: std::time::Duration::from_secs(3600),
            started_at_ms: 1,
            input_digest: "in".into(),
            input: None,
        };
        store.commit(&commit).await.unwrap();
    });

    let mut dashboard = Command::new(baton_binary())
        .args(["dashboard", "--listen", "127.0.0.1:0", "--sqlite-path"])
        .arg(&db)
        .env_remove("BATON_REDIS_URL")
        .env_remove("BATON_DATABASE_URL")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    // Kept open until the process ends: a closed pipe would fail its writes.
    let mut stdout = BufReader::new(dashboard.stdout.take().unwrap());
    stdout.read_line(&mut first).unwrap();
    let address = first
        .trim()
        .strip_prefix("baton dashboard listening on http://")
        .and_then(|rest| rest.strip_suffix("/dashboard"))
        .expect(&first)
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    write!(
        stream,
        "GET /dashboard?tenant=acme HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let _ = dashboard.kill();
    drop(stdout);
    let _ = dashboard.wait();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("lin@example.com"), "{response}");
    // Open on loopback only: elsewhere it needs a tokens file.
    let db_path = db.to_str().unwrap();
    let exposed = baton(&[
        "dashboard",
        "--listen",
        "0.0.0.0:0",
        "--sqlite-path",
        db_path,
    ]);
    assert_eq!(exposed.status.code(), Some(1));
    assert!(
        text(&exposed.stderr).contains("BATON_DASHBOARD_TOKENS_FILE"),
        "{}",
        text(&exposed.stderr)
    );

    let missing = baton(&["dashboard", "--sqlite-path", "/nonexistent/baton.db"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(text(&missing.stderr).contains("BATON_SQLITE_PATH"));
    let half = baton(&["dashboard", "--redis-url", "redis://127.0.0.1:1/"]);
    assert_eq!(half.status.code(), Some(1));
    assert!(
        text(&half.stderr).contains("BATON_REDIS_URL and BATON_DATABASE_URL"),
        "{}",
        text(&half.stderr)
    );
}

/// `--help` of the commands a new user runs first: every flag says what it
/// is for, and no credential from the environment is printed.
#[test]
fn help_describes_every_flag_and_echoes_no_secret() {
    let secrets = [
        ("BATON_S3_ACCESS_KEY_ID", "topsecret-key-id"),
        ("BATON_S3_SECRET_ACCESS_KEY", "topsecret-s3-secret"),
        ("BATON_ADMIN_TOKENS", "topsecret-admin-token"),
        ("BATON_AUTH_TOKENS", "acme=topsecret-auth-token"),
        (
            "BATON_REDIS_URL",
            "redis://:topsecret-redis@127.0.0.1:6379/",
        ),
        (
            "BATON_DATABASE_URL",
            "postgres://baton:topsecret-pg@127.0.0.1/baton",
        ),
        ("BATON_DASHBOARD_ADMIN_TOKEN", "topsecret-dashboard-admin"),
    ];
    for command in [
        &["dev", "--help"][..],
        &["sidecar", "--help"],
        &["dashboard", "--help"],
        &["operator", "--help"],
    ] {
        let output = Command::new(baton_binary())
            .args(command)
            .envs(secrets)
            .output()
            .unwrap();
        assert!(output.status.success(), "{command:?}");
        let help = String::from_utf8(output.stdout).unwrap();
        assert!(
            !help.contains("topsecret"),
            "{command:?} prints a secret:\n{help}"
        );
        // Unset and set variables look alike: `[env: NAME]`, never `NAME=`.
        assert!(!help.contains("=]"), "{command:?}:\n{help}");
        let lines: Vec<&str> = help.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let flag = line.trim_start();
            if !(flag.starts_with("--") || flag.starts_with("-h, ")) || !line.starts_with("  ") {
                continue;
            }
            let description = lines.get(i + 1).map_or("", |l| l.trim());
            assert!(
                !description.is_empty()
                    && !description.starts_with('[')
                    && !description.starts_with('-'),
                "{command:?}: {flag} has no description:\n{help}"
            );
        }
    }
}
