//! The Helm chart (`charts/baton`) without a cluster: `helm lint --strict`,
//! `helm template` with default and non-default values, every render checked
//! by `kubernetes-validate --strict` against the Kubernetes version the
//! operator tests run, and `values.schema.json` refusing wrong values with
//! the key's path. The install on a real control plane is `chart_install.rs`.
//!
//! Needs `helm` and `kubernetes-validate` on PATH (`scripts/setup-test-deps`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/baton")
}

/// The Kubernetes version the rendered objects must be valid for: the one
/// the operator tests run (scripts/setup-kubernetes).
fn kubernetes_version() -> String {
    let version = std::env::var("BATON_K8S_VERSION").unwrap_or_else(|_| "v1.34.2".into());
    let mut parts = version.trim_start_matches('v').split('.');
    format!(
        "{}.{}.0",
        parts.next().unwrap_or("1"),
        parts.next().unwrap_or("34")
    )
}

fn helm(args: &[&str]) -> std::process::Output {
    Command::new("helm")
        .args(args)
        .output()
        .expect("helm on PATH (scripts/setup-test-deps)")
}

/// `helm template` with `--set` pairs; panics with helm's message on failure.
fn render(sets: &[&str]) -> String {
    let out = render_result(sets);
    match out {
        Ok(yaml) => yaml,
        Err(e) => panic!("helm template {sets:?} failed:\n{e}"),
    }
}

fn render_result(sets: &[&str]) -> Result<String, String> {
    let chart = chart();
    let mut args = vec![
        "template",
        "baton",
        chart.to_str().unwrap(),
        "--namespace",
        "baton-system",
    ];
    for set in sets {
        args.push("--set");
        args.push(set);
    }
    let out = helm(&args);
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize as _;

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// `kubernetes-validate --strict` on `yaml` (written to a file).
fn validate(name: &str, yaml: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--quiet", "-k", &kubernetes_version()])
        .arg(&file)
        .output()
        .expect("kubernetes-validate on PATH (scripts/setup-test-deps)");
    assert!(
        out.status.success(),
        "{name}: kubernetes-validate --strict -k {} refused the render:\n{}{}",
        kubernetes_version(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn env_of<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str())
}

#[test]
fn lint_is_clean_in_strict_mode() {
    let chart = chart();
    let out = helm(&["lint", "--strict", chart.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "helm lint --strict:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn default_render_is_valid_and_hardened() {
    let yaml = render(&[]);
    validate("default", &yaml);
    let docs = documents(&yaml);
    let operator = find(&docs, "Deployment", "baton-operator").expect("operator Deployment");
    assert_eq!(operator["spec"]["replicas"].as_i64(), Some(2));
    let pod = &operator["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"].as_str(), Some("baton-operator"));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(security["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(security["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert!(container["livenessProbe"]["httpGet"].is_mapping());
    assert!(container["readinessProbe"]["httpGet"].is_mapping());
    assert!(container["resources"]["requests"].is_mapping());
    // One image for everything: the sidecar default is the chart's image.
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("ghcr.io/baton-dev/baton:{version}");
    assert_eq!(container["image"].as_str(), Some(image.as_str()));
    assert_eq!(
        env_of(container, "BATON_SIDECAR_IMAGE"),
        Some(image.as_str())
    );
    assert_eq!(env_of(container, "BATON_LEADER_ELECT"), Some("true"));
    assert_eq!(env_of(container, "BATON_WATCH_NAMESPACE"), None);
    // Service accounts do not hand out tokens unless the pod asks.
    let account = find(&docs, "ServiceAccount", "baton-operator").unwrap();
    assert_eq!(
        account["automountServiceAccountToken"].as_bool(),
        Some(false)
    );

    // Cluster-wide rights, exactly the operator's rule table.
    let role = find(&docs, "ClusterRole", "baton-operator").expect("ClusterRole");
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart().join("files/operator-rbac.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(role["rules"], rules["rules"]);
    assert!(find(&docs, "PodDisruptionBudget", "baton-operator").is_some());
    assert!(find(&docs, "Role", "baton-operator").is_none());
    // Leases only in its own namespace: no right to kube-system's leader
    // leases or the nodes' leases in kube-node-lease.
    let cluster_wide = serde_yaml::to_string(&role["rules"]).unwrap();
    assert!(!cluster_wide.contains("leases"), "{cluster_wide}");
    let lease = find(&docs, "Role", "baton-operator-leader-election").expect("lease Role");
    assert_eq!(
        lease["metadata"]["namespace"].as_str(),
        Some("baton-system")
    );
    assert_eq!(lease["rules"], rules["leaderElectionRules"]);

    // The dashboard: on, without sign-in it stays on the pod's loopback,
    // so there is no Service to reach it by.
    let dashboard = find(&docs, "Deployment", "baton-dashboard").expect("dashboard");
    let dash = &dashboard["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env_of(dash, "BATON_DASHBOARD_LISTEN"),
        Some("127.0.0.1:7080")
    );
    assert!(find(&docs, "Service", "baton-dashboard").is_none());
    assert!(
        !kinds(&docs)
            .iter()
            .any(|k| k.starts_with("ServiceMonitor/"))
    );
    assert!(!kinds(&docs).iter().any(|k| k.starts_with("Ingress/")));
    // Its audit log outlives the pod: a file on a claim of its own.
    assert_eq!(
        env_of(dash, "BATON_DASHBOARD_AUDIT_LOG"),
        Some("/var/lib/baton-dashboard/audit.jsonl")
    );
    let claim = find(&docs, "PersistentVolumeClaim", "baton-dashboard-audit").expect("audit claim");
    assert_eq!(
        claim["spec"]["resources"]["requests"]["storage"].as_str(),
        Some("1Gi")
    );
    assert_eq!(
        dashboard["spec"]["strategy"]["type"].as_str(),
        Some("Recreate")
    );
    let volumes = serde_yaml::to_string(&dashboard["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(volumes.contains("baton-dashboard-audit"), "{volumes}");
    // Without persistence: no claim, no file.
    let docs = documents(&render(&["dashboard.auditLog.persistence.enabled=false"]));
    assert!(find(&docs, "PersistentVolumeClaim", "baton-dashboard-audit").is_none());
    let dashboard = find(&docs, "Deployment", "baton-dashboard").unwrap();
    let dash = &dashboard["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(dash, "BATON_DASHBOARD_AUDIT_LOG"), None);
}

#[test]
fn namespaced_render_grants_roles_in_the_watched_namespace_only() {
    // The dashboard follows the operator's namespace unless told otherwise.
    let yaml = render(&["operator.watchNamespace=agents"]);
    validate("namespaced", &yaml);
    let docs = documents(&yaml);
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"].as_str().is_some_and(|k| k.starts_with("Cluster"))),
        "no cluster-wide objects: {:?}",
        kinds(&docs)
    );
    let role = find(&docs, "Role", "baton-operator").expect("Role");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("agents"));
    let lease = find(&docs, "Role", "baton-operator-leader-election").expect("lease Role");
    assert_eq!(
        lease["metadata"]["namespace"].as_str(),
        Some("baton-system")
    );
    assert_eq!(
        lease["rules"][0]["resources"][0].as_str(),
        Some("leases"),
        "{lease:?}"
    );
    let operator = find(&docs, "Deployment", "baton-operator").unwrap();
    let container = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env_of(container, "BATON_WATCH_NAMESPACE"), Some("agents"));
    let dashboard = find(&docs, "Role", "baton-dashboard").expect("dashboard Role");
    assert_eq!(dashboard["metadata"]["namespace"].as_str(), Some("agents"));
}

#[test]
fn dashboard_on_external_stores_reads_them_from_a_secret() {
    let yaml = render(&["dashboard.stores.existingSecret=support-bot-stores"]);
    validate("dashboard-external-stores", &yaml);
    let docs = documents(&yaml);
    let dashboard = find(&docs, "Deployment", "baton-dashboard").expect("dashboard");
    let container = &dashboard["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["envFrom"][0]["secretRef"]["name"].as_str(),
        Some("support-bot-stores"),
        "{container:?}"
    );
    // Without it the dashboard lists AgentDeployments only.
    let docs = documents(&render(&[]));
    let dashboard = find(&docs, "Deployment", "baton-dashboard").unwrap();
    assert!(dashboard["spec"]["template"]["spec"]["containers"][0]["envFrom"].is_null());
    // A Secret name that cannot be one is refused by the schema.
    let error = render_result(&["dashboard.stores.existingSecret=Not_A_Name"]).unwrap_err();
    assert!(
        error.contains("/dashboard/stores/existingSecret"),
        "{error}"
    );
}

#[test]
fn dashboard_off_renders_no_dashboard_object() {
    let yaml = render(&["dashboard.enabled=false"]);
    validate("dashboard-off", &yaml);
    let docs = documents(&yaml);
    let dashboard: Vec<String> = kinds(&docs)
        .into_iter()
        .filter(|k| k.contains("dashboard"))
        .collect();
    assert!(dashboard.is_empty(), "{dashboard:?}");
    assert!(find(&docs, "Deployment", "baton-operator").is_some());
}

#[test]
fn public_dashboard_with_ingress_and_monitoring() {
    let yaml = render(&[
        "dashboard.auth.existingSecret=dashboard-tokens",
        "dashboard.ingress.enabled=true",
        "dashboard.ingress.host=baton.internal",
        "dashboard.ingress.tlsSecretName=baton-tls",
        "operator.metrics.serviceMonitor.enabled=true",
        "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "fullnameOverride=agents",
    ]);
    let docs = documents(&yaml);
    // kubernetes-validate knows no ServiceMonitor: validate the rest, and
    // the ServiceMonitor's shape here.
    let monitor = find(&docs, "ServiceMonitor", "agents-operator").expect("ServiceMonitor");
    assert_eq!(
        monitor["spec"]["endpoints"][0]["port"].as_str(),
        Some("metrics")
    );
    let rest: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"].as_str() != Some("ServiceMonitor"))
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect();
    validate("public", &rest.join("---\n"));

    let dashboard = find(&docs, "Deployment", "agents-dashboard").unwrap();
    let pod = &dashboard["spec"]["template"]["spec"];
    let dash = &pod["containers"][0];
    assert_eq!(env_of(dash, "BATON_DASHBOARD_LISTEN"), Some("0.0.0.0:7080"));
    assert_eq!(
        env_of(dash, "BATON_DASHBOARD_TOKENS_FILE"),
        Some("/etc/baton/dashboard/tokens.yaml")
    );
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"].as_str(),
        Some("dashboard-tokens")
    );
    assert!(
        dash["image"]
            .as_str()
            .unwrap()
            .ends_with("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    );
    assert!(find(&docs, "Service", "agents-dashboard").is_some());
    let ingress = find(&docs, "Ingress", "agents-dashboard").expect("Ingress");
    assert_eq!(
        ingress["spec"]["tls"][0]["secretName"].as_str(),
        Some("baton-tls")
    );
}

/// Helm names the offending value by its JSON pointer (`/operator/replicas`).
#[test]
fn wrong_values_are_refused_naming_the_key() {
    for (set, expected) in [
        ("operator.replicas=two", "/operator/replicas"),
        ("operator.replicas=0", "/operator/replicas"),
        ("operator.replica=2", "replica"),
        ("operator.logFormat=xml", "/operator/logFormat"),
        ("operator.resyncInterval=soon", "/operator/resyncInterval"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("image.digest=latest", "/image/digest"),
        ("dashboard.port=80", "/dashboard/port"),
        ("dashboard.enabled=maybe", "/dashboard/enabled"),
        (
            "operator.watchNamespace=Not_A_Namespace",
            "/operator/watchNamespace",
        ),
    ] {
        let error = render_result(&[set]).expect_err(set);
        assert!(
            error.contains("values don't meet the specifications of the schema")
                && error.contains(expected),
            "--set {set}: {error}"
        );
    }
    // A rule the schema cannot express: the template says what to do.
    let error = render_result(&["dashboard.ingress.enabled=true"]).expect_err("ingress");
    assert!(
        error.contains("dashboard.ingress.enabled: needs dashboard.auth.existingSecret"),
        "{error}"
    );
}

#[test]
fn install_bundle_is_the_default_render_and_valid() {
    let bundle = std::fs::read_to_string(repo().join("manifests/install.yaml")).unwrap();
    validate("install", &bundle);
    let docs = documents(&bundle);
    let namespace = find(&docs, "Namespace", "baton-system").expect("Namespace first");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str(),
        Some("restricted")
    );
    let crd = find(
        &docs,
        "CustomResourceDefinition",
        "agentdeployments.baton.dev",
    )
    .expect("the CRD");
    let committed: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("manifests/crds/agentdeployments.baton.dev.yaml"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(crd, &committed, "the bundle's CRD is manifests/crds'");
    // The rest is exactly the chart with its defaults (scripts/generate
    // --check in CI compares the text; this compares the objects).
    let rendered = documents(&render(&[]));
    let bundled: Vec<&Value> = docs
        .iter()
        .filter(|d| {
            !matches!(
                d["kind"].as_str(),
                Some("Namespace" | "CustomResourceDefinition")
            )
        })
        .collect();
    assert_eq!(bundled.len(), rendered.len(), "{:?}", kinds(&docs));
    for (a, b) in bundled.iter().zip(&rendered) {
        assert_eq!(*a, b);
    }
}
