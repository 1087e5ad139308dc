//! Builders from small YAML fixtures, no cluster.

use baton_api::constants::{annotations, env, labels, ports};
use baton_api::{ValidAgentDeployment, parse, validate};
use baton_resources::{Credentials, DesiredState, build};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, EnvVar};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const MINIMAL: &str = "
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata: {name: bot, namespace: agents, uid: 6f1c2a8e-0d1b-4c57-9a3e-2f0f7f7e1a11}
spec: {image: example/bot:1, replicas: 2}
";

const ALL_EXTERNAL: &str = "
apiVersion: baton.dev/v1alpha1
kind: AgentDeployment
metadata: {name: bot, namespace: agents}
spec:
  image: example/bot:1
  dependencies:
    redis: {external: {secretRef: {name: my-redis}}}
    postgres: {external: {secretRef: {name: my-pg, urlKey: dsn}}}
    objectStore: {external: {secretRef: {name: my-s3}, bucket: my-bucket, forcePathStyle: false}}
";

fn creds() -> Credentials {
    Credentials {
        redis_password: "redis-pw-Q7x".into(),
        postgres_password: "pg-pw-Q7x".into(),
        object_store_access_key_id: "access".into(),
        object_store_secret_access_key: "s3-key-Q7x".into(),
        admin_token: "admin-token-for-tests-0123".into(),
    }
}

fn valid(yaml: &str) -> ValidAgentDeployment {
    validate(&parse::from_yaml(yaml).expect("fixture parses")).expect("fixture is valid")
}

/// The minimal fixture with one line of the spec replaced.
fn minimal_with(spec: &str) -> ValidAgentDeployment {
    valid(&MINIMAL.replace("spec: {image: example/bot:1, replicas: 2}", spec))
}

fn render(agd: &ValidAgentDeployment) -> DesiredState {
    build(agd, &creds(), &platform())
}

fn container<'a>(sts: &'a StatefulSet, name: &str) -> &'a Container {
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    pod.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_var<'a>(c: &'a Container, name: &str) -> &'a EnvVar {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("no env {name} in {}", c.name))
}

fn env_value<'a>(c: &'a Container, name: &str) -> &'a str {
    env_var(c, name)
        .value
        .as_deref()
        .unwrap_or_else(|| panic!("{name} has no inline value"))
}

fn config_hash(state: &DesiredState) -> String {
    let template = &state.replicas().spec.as_ref().unwrap().template;
    template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()[annotations::CONFIG_HASH]
        .clone()
}

fn metas(state: DesiredState) -> Vec<(String, ObjectMeta)> {
    state
        .into_objects()
        .into_iter()
        .map(|o| (o.kind().to_string(), o.metadata().clone()))
        .collect()
}

#[test]
fn replica_stateful_set_carries_the_sidecar_and_the_agent() {
    let state = render(&valid(MINIMAL));
    let sts = state.replicas();
    assert_eq!(sts.metadata.name.as_deref(), Some("bot"));
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let names: Vec<_> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["agent", "baton"]);
    let sidecar = container(sts, "baton");
    assert_eq!(sidecar.args.as_deref(), Some(&["sidecar".to_owned()][..]));
    let port = &sidecar.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.container_port, port.protocol.as_deref()),
        (i32::from(ports::SIDECAR_HTTP), Some("TCP"))
    );
    assert!(
        sidecar.startup_probe.is_some()
            && sidecar.readiness_probe.is_some()
            && sidecar.liveness_probe.is_some()
    );
    assert_eq!(env_value(container(sts, "agent"), env::AGENT_PORT), "8080");
}

#[test]
fn the_ledger_settings_reach_the_sidecar_only_when_they_differ_from_its_defaults() {
    let defaults = render(&minimal_with("spec: {image: example/bot:1}"));
    let sidecar = container(defaults.replicas(), "baton");
    let names: Vec<&str> = sidecar
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        !names.contains(&env::LEDGER_CONTENT) && !names.contains(&env::LEDGER_RETENTION),
        "defaults set nothing, so an upgrade rolls no pod: {names:?}"
    );
    let set = render(&minimal_with(
        "spec: {image: example/bot:1, ledger: {content: digest, retention: 30d}}",
    ));
    let sidecar = container(set.replicas(), "baton");
    assert_eq!(env_value(sidecar, env::LEDGER_CONTENT), "digest");
    assert_eq!(env_value(sidecar, env::LEDGER_RETENTION), "30d");
    assert_ne!(config_hash(&defaults), config_hash(&set), "a new revision");
}

#[test]
fn sidecar_environment_carries_the_session_settings_from_the_spec() {
    let agd = minimal_with(
        "spec: {image: example/bot:1, agentPort: 9000, session: {leaseTtl: 12s, stateTtl: 48h, drainTimeout: 90s, heartbeatInterval: 400ms}}",
    );
    let state = render(&agd);
    let sidecar = container(state.replicas(), "baton");
    assert_eq!(env_value(sidecar, env::LEASE_TTL), "12s");
    assert_eq!(env_value(sidecar, env::STATE_TTL), "48h");
    assert_eq!(
        env_value(sidecar, env::RENEW_INTERVAL),
        "4s",
        "defaults to leaseTtl/3"
    );
    assert_eq!(env_value(sidecar, env::DRAIN_TIMEOUT), "1m30s");
    assert_eq!(env_value(sidecar, env::HEARTBEAT_INTERVAL), "400ms");
    assert_eq!(env_value(sidecar, env::AGENT_URL), "http://127.0.0.1:9000");
    // Deployments sharing external stores are kept apart by it.
    let store_namespace = env_value(sidecar, env::STORE_NAMESPACE);
    let meta = &agd.resource.metadata;
    assert_eq!(
        store_namespace,
        format!(
            "{}.{}",
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap()
        )
    );
    let replica_id = env_var(sidecar, env::REPLICA_ID)
        .value_from
        .as_ref()
        .unwrap();
    assert_eq!(
        replica_id.field_ref.as_ref().unwrap().field_path,
        "metadata.name"
    );
    // The ConfigMap holds the same settings as the environment.
    let data = state.config_maps[0].data.as_ref().unwrap();
    assert_eq!(data[env::LEASE_TTL], "12s");
    assert_eq!(data[env::STATE_TTL], "48h");
}

#[test]
fn store_credentials_reach_the_sidecar_only_through_secrets() {
    let state = render(&valid(MINIMAL));
    let sidecar = container(state.replicas(), "baton");
    for (name, secret, key) in [
        (env::REDIS_URL, "bot-redis", "url"),
        (env::DATABASE_URL, "bot-postgres", "url"),
        (env::S3_ENDPOINT, "bot-minio", "endpoint"),
        (env::S3_ACCESS_KEY_ID, "bot-minio", "accessKeyId"),
        (env::S3_SECRET_ACCESS_KEY, "bot-minio", "secretAccessKey"),
    ] {
        let var = env_var(sidecar, name);
        assert!(var.value.is_none(), "{name} must not be inline");
        let r = var
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        assert_eq!((r.name.as_str(), r.key.as_str()), (secret, key), "{name}");
    }
    let rendered = serde_json::to_string(&state.replicas()).unwrap();
    for password in ["redis-pw-Q7x", "pg-pw-Q7x", "s3-key-Q7x"] {
        assert!(
            !rendered.contains(password),
            "a credential leaked into the StatefulSet"
        );
    }
}

#[test]
fn replicas_update_on_delete_so_the_operator_drives_rollouts() {
    let state = render(&valid(MINIMAL));
    let spec = state.replicas().spec.as_ref().unwrap();
    assert_eq!(
        spec.update_strategy.as_ref().unwrap().type_.as_deref(),
        Some("OnDelete")
    );
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.service_name.as_deref(), Some("bot-headless"));
}

#[test]
fn pods_drain_before_they_stop() {
    let agd = minimal_with("spec: {image: example/bot:1, session: {drainTimeout: 45s}}");
    let state = render(&agd);
    let sts = state.replicas();
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert!(pod.termination_grace_period_seconds.unwrap() > 45);
    // The agent waits in preStop for the sidecar's drain, which the
    // sidecar's SIGTERM starts: no hook can start a drain over the network.
    let hook = container(sts, "agent")
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap();
    assert_eq!(
        hook.http_get.as_ref().unwrap().path.as_deref(),
        Some("/drained")
    );
    assert_eq!(container(sts, "baton").lifecycle, None);
}

#[test]
fn pods_run_with_secure_defaults() {
    let state = render(&valid(MINIMAL));
    let sts = state.replicas();
    let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        pod.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    let sidecar = container(sts, "baton").security_context.as_ref().unwrap();
    assert_eq!(sidecar.read_only_root_filesystem, Some(true));
    assert_eq!(sidecar.allow_privilege_escalation, Some(false));
    assert_eq!(
        sidecar.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_owned()][..])
    );
    let agent = container(sts, "agent").security_context.as_ref().unwrap();
    assert_eq!(agent.allow_privilege_escalation, Some(false));
}

#[test]
fn every_object_has_the_recommended_labels_and_a_controller_owner_reference() {
    for yaml in [MINIMAL, ALL_EXTERNAL] {
        for (kind, meta) in metas(render(&valid(yaml))) {
            let l = meta.labels.as_ref().unwrap();
            for key in [
                labels::NAME,
                labels::INSTANCE,
                labels::COMPONENT,
                labels::MANAGED_BY,
                labels::PART_OF,
            ] {
                assert!(l.contains_key(key), "{kind} {:?} lacks {key}", meta.name);
            }
            assert_eq!(l[labels::INSTANCE], "bot");
            let owners = meta.owner_references.as_ref().unwrap();
            assert_eq!(owners.len(), 1);
            assert_eq!(owners[0].kind, "AgentDeployment");
            assert_eq!(owners[0].name, "bot");
            assert_eq!(owners[0].controller, Some(true));
            assert_eq!(meta.namespace.as_deref(), Some("agents"));
        }
    }
    let state = render(&valid(MINIMAL));
    let owner = &state.replicas().metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, "6f1c2a8e-0d1b-4c57-9a3e-2f0f7f7e1a11");
}

#[test]
fn changing_the_lease_ttl_changes_the_config_hash() {
    let base = config_hash(&render(&valid(MINIMAL)));
    assert_eq!(base.len(), 16);
    let changed = config_hash(&render(&minimal_with(
        "spec: {image: example/bot:1, replicas: 2, session: {leaseTtl: 31s}}",
    )));
    assert_ne!(base, changed);
}

#[test]
fn changing_replicas_or_the_image_does_not_change_the_config_hash() {
    let base = config_hash(&render(&valid(MINIMAL)));
    assert_eq!(
        base,
        config_hash(&render(&minimal_with(
            "spec: {image: example/bot:1, replicas: 7}"
        )))
    );
    assert_eq!(
        base,
        config_hash(&render(&minimal_with(
            "spec: {image: example/bot:2, replicas: 2}"
        )))
    );
}

#[test]
fn changing_a_managed_credential_changes_the_config_hash() {
    let agd = valid(MINIMAL);
    let base = config_hash(&build(&agd, &creds(), &platform()));
    let rotated = Credentials {
        postgres_password: "rotated".into(),
        ..creds()
    };
    assert_ne!(base, config_hash(&build(&agd, &rotated, &platform())));
}

#[test]
fn managed_dependencies_yield_their_objects() {
    let state = render(&valid(MINIMAL));
    let named = |objects: Vec<Option<String>>| objects.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(
        named(
            state
                .secrets
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect()
        ),
        ["bot-redis", "bot-postgres", "bot-minio", "bot-admin"]
    );
    assert_eq!(
        named(
            state
                .stateful_sets
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect()
        ),
        ["bot-redis", "bot-postgres", "bot-minio", "bot"]
    );
    assert_eq!(
        named(
            state
                .services
                .iter()
                .map(|s| s.metadata.name.clone())
                .collect()
        ),
        [
            "bot-redis",
            "bot-postgres",
            "bot-minio",
            "bot",
            "bot-headless"
        ]
    );
    assert_eq!(state.jobs.len(), 1, "the bucket Job");
    assert_eq!(
        state.jobs[0].metadata.name.as_deref(),
        Some("bot-minio-bucket")
    );

    let redis = &state.stateful_sets[0];
    let args = container(redis, "redis").args.clone().unwrap();
    let aof = args.windows(2).any(|w| w == ["--appendfsync", "everysec"])
        && args.windows(2).any(|w| w == ["--appendonly", "yes"]);
    assert!(aof, "redis must persist with AOF everysec: {args:?}");
    let claims = redis
        .spec
        .as_ref()
        .unwrap()
        .volume_claim_templates
        .as_ref()
        .unwrap();
    assert_eq!(
        claims[0]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["storage"]
            .0,
        "1Gi"
    );
}

#[test]
fn managed_credentials_come_from_the_input_not_from_the_builder() {
    let agd = valid(MINIMAL);
    let a = serde_json::to_string(&build(&agd, &creds(), &platform()).secrets).unwrap();
    let b = serde_json::to_string(&build(&agd, &creds(), &platform()).secrets).unwrap();
    assert_eq!(a, b, "same credentials in, same Secrets out");
    let pg = &build(&agd, &creds(), &platform()).secrets[1];
    let password = String::from_utf8(pg.data.as_ref().unwrap()["password"].0.clone()).unwrap();
    assert_eq!(password, "pg-pw-Q7x");
}

#[test]
fn the_sidecars_read_the_admin_token_the_operator_keeps() {
    let state = render(&valid(MINIMAL));
    let admin = state
        .secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("bot-admin"))
        .expect("the admin Secret");
    let token = String::from_utf8(admin.data.as_ref().unwrap()["token"].0.clone()).unwrap();
    assert_eq!(token, creds().admin_token);
    let sidecar = container(state.replicas(), "baton");
    let r = env_var(sidecar, "BATON_ADMIN_TOKENS")
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!((r.name.as_str(), r.key.as_str()), ("bot-admin", "token"));
    // No address is trusted to drain, so the node's is not needed.
    assert!(
        sidecar
            .env
            .iter()
            .flatten()
            .all(|e| e.name != "BATON_HOST_IP")
    );
    let rotated = Credentials {
        admin_token: "another-admin-token-0123".into(),
        ..creds()
    };
    assert_ne!(
        config_hash(&build(&valid(MINIMAL), &creds(), &platform())),
        config_hash(&build(&valid(MINIMAL), &rotated, &platform())),
        "a new token reaches the pods through a rollout"
    );
}

#[test]
fn external_dependencies_yield_no_objects_only_wiring() {
    let state = render(&valid(ALL_EXTERNAL));
    let secrets: Vec<_> = state
        .secrets
        .iter()
        .map(|s| s.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(secrets, ["bot-admin"], "only the admin token's Secret");
    assert!(state.jobs.is_empty());
    assert_eq!(state.stateful_sets.len(), 1, "only the replicas");
    assert_eq!(state.services.len(), 2, "only the replicas' Services");
    let sidecar = container(state.replicas(), "baton");
    let secret_of = |name| {
        let r = env_var(sidecar, name)
            .value_from
            .as_ref()
            .unwrap()
            .secret_key_ref
            .as_ref()
            .unwrap();
        (r.name.clone(), r.key.clone())
    };
    assert_eq!(secret_of(env::REDIS_URL), ("my-redis".into(), "url".into()));
    assert_eq!(secret_of(env::DATABASE_URL), ("my-pg".into(), "dsn".into()));
    assert_eq!(
        secret_of(env::S3_ENDPOINT),
        ("my-s3".into(), "endpoint".into())
    );
    assert_eq!(env_value(sidecar, env::S3_BUCKET), "my-bucket");
    assert_eq!(env_value(sidecar, env::S3_FORCE_PATH_STYLE), "false");
}

#[test]
fn one_managed_dependency_among_external_ones() {
    let agd = valid(&ALL_EXTERNAL.replace(
        "postgres: {external: {secretRef: {name: my-pg, urlKey: dsn}}}",
        "postgres: {managed: {storage: 5Gi}}",
    ));
    let state = render(&agd);
    let names: Vec<_> = state
        .stateful_sets
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(names, ["bot-postgres", "bot"]);
}

#[test]
fn services_name_their_protocols_and_select_only_their_pods() {
    let state = render(&valid(MINIMAL));
    for svc in &state.services {
        let spec = svc.spec.as_ref().unwrap();
        for port in spec.ports.iter().flatten() {
            assert_eq!(
                port.protocol.as_deref(),
                Some("TCP"),
                "{:?}",
                svc.metadata.name
            );
        }
        let selector = spec.selector.as_ref().unwrap();
        assert!(
            selector.contains_key(labels::COMPONENT),
            "{:?} selects by component",
            svc.metadata.name
        );
    }
    let headless = state
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("bot-headless"))
        .unwrap();
    assert_eq!(
        headless.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    // The bucket Job's pods must not be selected by MinIO's Service.
    let minio = state
        .services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("bot-minio"))
        .unwrap();
    let job_labels = state.jobs[0]
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    let selector = minio.spec.as_ref().unwrap().selector.clone().unwrap();
    assert!(!selector.iter().all(|(k, v)| job_labels.get(k) == Some(v)));
}

#[test]
fn pod_disruption_budget_allows_one_replica_down() {
    let state = render(&valid(MINIMAL));
    let pdb = state.pod_disruption_budgets[0].spec.as_ref().unwrap();
    assert_eq!(
        pdb.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
}

#[test]
fn own_service_account_unless_one_is_given() {
    assert!(render(&valid(MINIMAL)).service_account.is_some());
    let state = render(&minimal_with(
        "spec: {image: example/bot:1, serviceAccountName: team-sa}",
    ));
    assert!(state.service_account.is_none());
    let pod = state
        .replicas()
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .clone()
        .unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("team-sa"));
}

#[test]
fn user_pod_labels_and_annotations_are_kept_beside_batons_own() {
    let state = render(&minimal_with(
        "spec: {image: example/bot:1, podLabels: {team: a}, podAnnotations: {note: b}}",
    ));
    let meta = state
        .replicas()
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .clone()
        .unwrap();
    assert_eq!(meta.labels.as_ref().unwrap()["team"], "a");
    assert_eq!(meta.labels.as_ref().unwrap()[labels::INSTANCE], "bot");
    assert_eq!(meta.annotations.as_ref().unwrap()["note"], "b");
    assert!(
        meta.annotations
            .as_ref()
            .unwrap()
            .contains_key(annotations::CONFIG_HASH)
    );
}

#[test]
fn objects_come_out_in_apply_order() {
    let kinds: Vec<String> = metas(render(&valid(MINIMAL)))
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let first = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    let last = |k: &str| kinds.iter().rposition(|x| x == k).unwrap();
    assert_eq!(first("ServiceAccount"), 0);
    assert!(last("Secret") < first("ConfigMap"));
    assert!(last("ConfigMap") < first("Service"));
    assert!(last("Service") < first("StatefulSet"));
    assert!(last("StatefulSet") < first("Job"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("PodDisruptionBudget")
    );
}

/// The operator's defaults: NetworkPolicies admitting `baton-system`'s admin clients.
fn platform() -> baton_resources::Platform {
    baton_resources::Platform {
        network_policies: Some(baton_resources::AdminClients {
            namespace: "baton-system".into(),
        }),
    }
}

#[test]
fn the_admin_api_has_a_port_of_its_own_which_the_dashboard_is_told() {
    let state = render(&valid(MINIMAL));
    let sidecar = container(state.replicas(), "baton");
    assert_eq!(env_value(sidecar, env::LISTEN), "0.0.0.0:7070");
    assert_eq!(env_value(sidecar, env::ADMIN_LISTEN), "0.0.0.0:7071");
    assert_eq!(
        env_value(sidecar, env::ADVERTISE_URL),
        "http://$(BATON_POD_IP):7071",
        "the dashboard calls the advertised URL's admin routes"
    );
    let ports: Vec<_> = sidecar
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.container_port))
        .collect();
    assert_eq!(ports, [("http", 7070), ("admin", 7071)]);
}

fn policy<'a>(
    state: &'a DesiredState,
    name: &str,
) -> &'a k8s_openapi::api::networking::v1::NetworkPolicySpec {
    state
        .network_policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .and_then(|p| p.spec.as_ref())
        .unwrap_or_else(|| panic!("no NetworkPolicy {name}"))
}

#[test]
fn network_policies_open_the_turn_port_to_all_and_the_rest_to_admin_clients() {
    let state = render(&valid(MINIMAL));
    let names: Vec<_> = state
        .network_policies
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(names, ["bot", "bot-stores"]);
    let replicas = policy(&state, "bot");
    assert_eq!(
        replicas
            .pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[labels::COMPONENT],
        "agent"
    );
    assert_eq!(
        replicas.policy_types.as_deref(),
        Some(&["Ingress".to_owned()][..])
    );
    let rules = replicas.ingress.as_ref().unwrap();
    let port_of = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
        let ports = rule.ports.as_ref().unwrap();
        assert_eq!(ports.len(), 1);
        ports[0].port.clone().unwrap()
    };
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    // The turn port: every source.
    assert_eq!(port_of(&rules[0]), IntOrString::Int(7070));
    assert!(rules[0].from.is_none());
    // The admin port: pods marked admin clients in the operator's namespace.
    assert_eq!(port_of(&rules[1]), IntOrString::Int(7071));
    let from = &rules[1].from.as_ref().unwrap()[0];
    assert_eq!(
        from.namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()["kubernetes.io/metadata.name"],
        "baton-system"
    );
    assert_eq!(
        from.pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[baton_resources::network::ADMIN_CLIENT_LABEL],
        "true"
    );
    // No rule names the agent's port: only the sidecar, over the pod's
    // loopback, reaches it.
    assert_eq!(rules.len(), 2);

    let stores = policy(&state, "bot-stores");
    let selector = stores.pod_selector.as_ref().unwrap();
    assert_eq!(
        selector.match_labels.as_ref().unwrap()[labels::INSTANCE],
        "bot"
    );
    let components = selector.match_expressions.as_ref().unwrap()[0]
        .values
        .clone()
        .unwrap();
    assert_eq!(components, ["coordination-store", "ledger", "object-store"]);
    let from = stores.ingress.as_ref().unwrap()[0].from.as_ref().unwrap();
    assert_eq!(
        from[0]
            .pod_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[labels::INSTANCE],
        "bot",
        "the deployment's own pods"
    );
    assert!(from[0].namespace_selector.is_none(), "in its own namespace");
    assert!(
        from[1].namespace_selector.is_some(),
        "and the admin clients"
    );
}

#[test]
fn external_stores_get_no_store_policy_and_the_policies_can_be_turned_off() {
    let state = render(&valid(ALL_EXTERNAL));
    assert_eq!(state.network_policies.len(), 1);
    let off = build(
        &valid(MINIMAL),
        &creds(),
        &baton_resources::Platform::default(),
    );
    assert!(off.network_policies.is_empty());
    assert!(
        !off.into_objects()
            .iter()
            .any(|o| o.kind() == baton_resources::ChildKind::NetworkPolicy)
    );
}

#[test]
fn objects_come_out_in_the_apply_order_of_their_kinds() {
    for fixture in [MINIMAL, ALL_EXTERNAL] {
        let kinds: Vec<_> = render(&valid(fixture))
            .into_objects()
            .iter()
            .map(baton_resources::ChildObject::kind)
            .collect();
        assert!(kinds.is_sorted(), "{kinds:?}");
        assert_eq!(
            kinds.first(),
            Some(&baton_resources::ChildKind::ServiceAccount)
        );
        assert_eq!(
            kinds.last(),
            Some(&baton_resources::ChildKind::PodDisruptionBudget)
        );
    }
}

#[test]
fn a_slow_managed_store_is_not_killed_before_it_first_answers() {
    let state = render(&valid(MINIMAL));
    for sts in state.stateful_sets.iter().filter(|s| {
        s.metadata.name.as_deref().is_some_and(|n| {
            n.ends_with("-redis") || n.ends_with("-postgres") || n.ends_with("-minio")
        })
    }) {
        let name = sts.metadata.name.clone().unwrap_or_default();
        let container = &sts
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        let liveness = container.liveness_probe.as_ref().expect("a liveness probe");
        let startup = container.startup_probe.as_ref().expect("a startup probe");
        // The same check, patient: 5 minutes before the first pass.
        assert_eq!(startup.http_get, liveness.http_get, "{name}");
        assert_eq!(startup.tcp_socket, liveness.tcp_socket, "{name}");
        let patience = startup.period_seconds.unwrap() * startup.failure_threshold.unwrap();
        assert!(patience >= 300, "{name}: {patience} s");
    }
}
