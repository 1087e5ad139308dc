//! Properties over generated resources: rendering is deterministic, and
//! every valid resource name yields valid child names.

use baton_api::names::STATEFUL_SET_NAME_MAX;
use baton_api::{parse, validate};
use baton_resources::{ChildObject, Credentials, build};
use proptest::prelude::*;

fn creds() -> Credentials {
    Credentials {
        redis_password: "r".into(),
        postgres_password: "p".into(),
        object_store_access_key_id: "a".into(),
        object_store_secret_access_key: "s".into(),
        admin_token: "admin-token-for-tests-0123".into(),
    }
}

fn is_dns_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn dependency() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        Just("managed: {}"),
        Just("external: {secretRef: {name: ext}}")
    ]
}

fn manifest() -> impl Strategy<Value = String> {
    (
        "[a-z]([-a-z0-9]{0,60}[a-z0-9])?",
        0..=1000i32,
        2..=3600u32,
        dependency(),
        dependency(),
        any::<bool>(),
    )
        .prop_map(|(name, replicas, lease_secs, redis, postgres, s3_managed)| {
            let object_store = if s3_managed {
                "managed: {bucket: some-bucket}"
            } else {
                "external: {secretRef: {name: ext-s3}, bucket: some-bucket}"
            };
            format!(
                "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {{name: {name}}}\n\
                 spec:\n  image: example/agent:1\n  replicas: {replicas}\n  session: {{leaseTtl: {lease_secs}s, stateTtl: 2h}}\n  \
                 dependencies:\n    redis: {{{redis}}}\n    postgres: {{{postgres}}}\n    objectStore: {{{object_store}}}\n"
            )
        })
}

fn child_names(objects: &[ChildObject]) -> Vec<(bool, String)> {
    objects
        .iter()
        .map(|o| {
            (
                o.kind() == baton_resources::ChildKind::StatefulSet,
                o.name().to_owned(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rendering_is_deterministic(text in manifest()) {
        let resource = parse::from_yaml(&text).unwrap();
        if let Ok(agd) = validate(&resource) {
            let first = serde_json::to_string(&build(&agd, &creds(), &platform()).into_objects()).unwrap();
            let again = validate(&parse::from_yaml(&text).unwrap()).unwrap();
            let second = serde_json::to_string(&build(&again, &creds(), &platform()).into_objects()).unwrap();
            prop_assert_eq!(first, second);
        }
    }

    #[test]
    fn valid_names_give_valid_child_names(text in manifest()) {
        let resource = parse::from_yaml(&text).unwrap();
        match validate(&resource) {
            Ok(agd) => {
                for (is_stateful_set, name) in child_names(&build(&agd, &creds(), &platform()).into_objects()) {
                    prop_assert!(is_dns_label(&name), "{} is not a DNS label", name);
                    if is_stateful_set {
                        prop_assert!(name.len() <= STATEFUL_SET_NAME_MAX, "StatefulSet {} too long", name);
                    }
                }
            }
            // The generator only makes names that are DNS labels; the only
            // reason to refuse one is that a derived name would be too long.
            Err(errors) => {
                prop_assert!(errors.0.iter().all(|v| v.field == "metadata.name"), "{}", errors);
                prop_assert!(errors.0.iter().all(|v| v.message.contains("at most")), "{}", errors);
            }
        }
    }
}

/// The operator's defaults: NetworkPolicies admitting `baton-system`'s admin clients.
fn platform() -> baton_resources::Platform {
    baton_resources::Platform {
        network_policies: Some(baton_resources::AdminClients {
            namespace: "baton-system".into(),
        }),
    }
}
