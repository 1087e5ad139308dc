//! The committed CRD's CEL rules, evaluated client-side (kube's `cel`
//! feature, schema defaults applied first as an API server does), agree with
//! the Rust validation: clusters that run CEL and `baton validate` (and the
//! operator, on clusters that ignore CEL) refuse the same resources.

use std::sync::LazyLock;

use baton_api::{parse, validate};
use kube::core::cel::{CompiledSchema, compile_schema, validate_compiled};

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path),
    )
    .unwrap()
}

static SCHEMA: LazyLock<CompiledSchema> = LazyLock::new(|| {
    let crd: serde_json::Value =
        serde_yaml::from_str(&repo_file("manifests/crds/agentdeployments.baton.dev.yaml")).unwrap();
    let compiled = compile_schema(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]);
    assert!(
        !compiled.has_errors(),
        "CEL rules do not compile: {:?}",
        compiled.compilation_errors()
    );
    compiled
});

/// CEL's verdict on a manifest as written (not as Rust parsed it).
fn cel_errors(manifest: &str) -> Option<String> {
    let object: serde_json::Value = serde_yaml::from_str(manifest).unwrap();
    validate_compiled(&SCHEMA, &object, None)
        .err()
        .map(|e| format!("{e:?}"))
}

#[test]
fn examples_pass_the_cel_rules() {
    for example in [
        "minimal",
        "managed-dependencies",
        "external-dependencies",
        "custom-session",
    ] {
        let manifest = repo_file(&format!("manifests/examples/{example}.yaml"));
        assert_eq!(cel_errors(&manifest), None, "{example}");
    }
}

#[test]
fn cross_field_fixtures_fail_the_cel_rules_too() {
    for (fixture, message) in [
        (
            "renew-not-shorter-than-lease",
            "renewInterval must be greater than 0 and shorter than leaseTtl",
        ),
        ("lease-too-short", "leaseTtl must be between 2s and 1h"),
        ("retention-too-short", "retention must be at least 1h"),
        (
            "progress-deadline-too-short",
            "progressDeadline must be between 10s and 24h",
        ),
        (
            "heartbeat-not-shorter-than-lease",
            "heartbeatInterval must be at least 50ms and shorter than leaseTtl",
        ),
        (
            "managed-and-external",
            "set exactly one of managed or external",
        ),
        (
            "neither-managed-nor-external",
            "set exactly one of managed or external",
        ),
    ] {
        let manifest = repo_file(&format!("tests/fixtures/invalid/{fixture}.yaml"));
        assert!(
            validate(&parse::from_yaml(&manifest).unwrap()).is_err(),
            "{fixture}: Rust validation accepted it"
        );
        let errors =
            cel_errors(&manifest).unwrap_or_else(|| panic!("{fixture}: the CEL rules accepted it"));
        assert!(errors.contains(message), "{fixture}: {errors}");
    }
}

/// Over a grid of session timings, CEL and the Rust validation give the
/// same verdict.
#[test]
fn cel_and_rust_agree_on_session_timings() {
    let leases = ["1s", "2s", "30s", "1h", "61m"];
    let renews = [None, Some("0s"), Some("1s"), Some("30s")];
    let heartbeats = ["10ms", "50ms", "2s"];
    let state_ttls = ["1s", "24h", "8785h"];
    let drains = ["500ms", "60s", "2h"];
    let mut checked = 0;
    for lease in leases {
        for renew in renews {
            for heartbeat in heartbeats {
                for state_ttl in state_ttls {
                    for drain in drains {
                        let renew_line = renew
                            .map(|r| format!(", renewInterval: {r}"))
                            .unwrap_or_default();
                        let text = format!(
                            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {{name: bot}}\nspec:\n  image: x\n  \
                             session: {{leaseTtl: {lease}, heartbeatInterval: {heartbeat}, stateTtl: {state_ttl}, drainTimeout: {drain}{renew_line}}}\n"
                        );
                        let rust_ok = validate(&parse::from_yaml(&text).unwrap()).is_ok();
                        let cel = cel_errors(&text);
                        assert_eq!(
                            rust_ok,
                            cel.is_none(),
                            "disagreement on {text}: CEL says {cel:?}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 540);
}

/// CEL and the Rust validation agree on `spec.ledger.retention`.
#[test]
fn cel_and_rust_agree_on_the_ledger_retention() {
    for retention in [
        "30m", "59m59s", "1h", "720h", "1d", "30d", "0d", "05d", "99999d",
    ] {
        let text = format!(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {{name: bot}}\nspec:\n  image: x\n  ledger: {{content: digest, retention: {retention}}}\n"
        );
        let rust_ok = validate(&parse::from_yaml(&text).unwrap()).is_ok();
        let cel = cel_errors(&text);
        assert_eq!(
            rust_ok,
            cel.is_none(),
            "disagreement on {retention}: CEL says {cel:?}"
        );
    }
}
