//! Validation of an `AgentDeployment`: the OpenAPI rules and the CEL rules of
//! the CRD, again in Rust, because API servers older than 1.25 ignore CEL and
//! `baton validate` runs with no API server at all. Every violation is
//! reported, each with its field path and the rule it breaks.
//!
//! The result is a [`ValidAgentDeployment`]: durations parsed, defaults
//! resolved, each dependency either managed or external. The builders only
//! accept that type, so they never see an unchecked resource.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use regex::Regex;

use crate::constants::{annotations, env, images, labels, ports};
use crate::names::{ChildNames, DNS_LABEL_MAX, NamedKind};
use crate::{
    AgentDeployment, BUCKET_PATTERN, DNS_SUBDOMAIN_PATTERN, DURATION_PATTERN, ExternalObjectStore,
    ExternalUrl, IMAGE_PATTERN, MAX_REPLICAS, ManagedObjectStore, ManagedRedis, ManagedStore,
    SECRET_KEY_PATTERN,
};

/// Bounds on the session timings (also encoded as CEL rules in the CRD).
pub mod bounds {
    use std::time::Duration;

    pub const LEASE_TTL_MIN: Duration = Duration::from_secs(2);
    /// The shortest `spec.ledger.retention`: shorter would delete the
    /// history of sessions still in use.
    pub const LEDGER_RETENTION_MIN: Duration = Duration::from_secs(3600);
    pub const LEASE_TTL_MAX: Duration = Duration::from_secs(3600);
    pub const STATE_TTL_MAX: Duration = Duration::from_secs(366 * 24 * 3600);
    pub const DRAIN_TIMEOUT_MIN: Duration = Duration::from_secs(1);
    pub const DRAIN_TIMEOUT_MAX: Duration = Duration::from_secs(3600);
    pub const HEARTBEAT_INTERVAL_MIN: Duration = Duration::from_millis(50);
    pub const PROGRESS_DEADLINE_MIN: Duration = Duration::from_secs(10);
    pub const PROGRESS_DEADLINE_MAX: Duration = Duration::from_secs(24 * 3600);
    /// Longest number in a duration string; keeps the arithmetic far from overflow.
    pub const DURATION_MAX_DIGITS: usize = 12;
}

/// Default size of a managed store's data volume.
pub const DEFAULT_STORAGE: &str = "1Gi";

/// One broken rule: the field (JSON path from the resource root) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every violation found in one resource, in field order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<Violation>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} validation error{}:", if n == 1 { "" } else { "s" })?;
        for v in &self.0 {
            write!(f, "\n  - {v}")?;
        }
        Ok(())
    }
}

/// Session timings, parsed and defaulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionTimings {
    pub lease_ttl: Duration,
    pub state_ttl: Duration,
    pub renew_interval: Duration,
    pub drain_timeout: Duration,
    pub heartbeat_interval: Duration,
}

/// A dependency after `managed` xor `external` was checked and defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub enum Dependency<M, E> {
    Managed(M),
    External(E),
}

/// An `AgentDeployment` that passed validation, with everything resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidAgentDeployment {
    /// The resource as given; its metadata carries the owner (name, uid).
    pub resource: AgentDeployment,
    pub name: String,
    pub names: ChildNames,
    pub timings: SessionTimings,
    /// `spec.rollout.progressDeadline`, parsed.
    pub progress_deadline: Duration,
    pub sidecar_image: String,
    pub redis: Dependency<ManagedRedis, ExternalUrl>,
    pub postgres: Dependency<ManagedStore, ExternalUrl>,
    pub object_store: Dependency<ManagedObjectStore, ExternalObjectStore>,
}

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("built-in pattern compiles")
}

static DURATION_RE: LazyLock<Regex> = LazyLock::new(|| regex(DURATION_PATTERN));
static DNS_SUBDOMAIN_RE: LazyLock<Regex> = LazyLock::new(|| regex(DNS_SUBDOMAIN_PATTERN));
static SECRET_KEY_RE: LazyLock<Regex> = LazyLock::new(|| regex(SECRET_KEY_PATTERN));
static BUCKET_RE: LazyLock<Regex> = LazyLock::new(|| regex(BUCKET_PATTERN));
static IMAGE_RE: LazyLock<Regex> = LazyLock::new(|| regex(IMAGE_PATTERN));
static DNS_LABEL_RE: LazyLock<Regex> = LazyLock::new(|| regex(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));
static DNS_1035_LABEL_RE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^[a-z]([-a-z0-9]*[a-z0-9])?$"));
static LABEL_NAME_RE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"));
static LABEL_VALUE_RE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"));
static ENV_NAME_RE: LazyLock<Regex> = LazyLock::new(|| regex(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"));
static QUANTITY_RE: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$")
});
static POSITIVE_QUANTITY_RE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^\+?0*[1-9][0-9]*(\.[0-9]*)?(([KMGTPE]i)|[kMGTPE])?$"));

/// Collects violations while walking the resource.
#[derive(Default)]
struct Checker {
    violations: Vec<Violation>,
}

impl Checker {
    fn fail(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.violations.push(Violation {
            field: field.into(),
            message: message.into(),
        });
    }

    fn require(&mut self, ok: bool, field: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.fail(field, message());
        }
    }

    fn image(&mut self, field: &str, image: &str) {
        self.require(
            !image.is_empty() && image.len() <= 4096 && IMAGE_RE.is_match(image),
            field,
            || {
                "must be a non-empty image reference without whitespace (at most 4096 characters)"
                    .into()
            },
        );
    }

    fn dns_subdomain(&mut self, field: &str, value: &str) {
        self.require(
            !value.is_empty() && value.len() <= 253 && DNS_SUBDOMAIN_RE.is_match(value),
            field,
            || format!("{value:?} must be a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"),
        );
    }

    /// Parses a duration string; `None` (with a violation) when unparsable.
    fn duration(&mut self, field: &str, value: &str) -> Option<Duration> {
        match parse_duration(value) {
            Ok(d) => Some(d),
            Err(why) => {
                self.fail(field, why);
                None
            }
        }
    }

    fn quantity(&mut self, field: &str, q: &Quantity) {
        self.require(q.0.len() <= 64 && QUANTITY_RE.is_match(&q.0), field, || {
            format!("{:?} is not a Kubernetes quantity (e.g. 500m, 1Gi, 2)", q.0)
        });
    }

    fn resources(&mut self, field: &str, resources: Option<&ResourceRequirements>) {
        let Some(r) = resources else { return };
        for (part, map) in [("limits", &r.limits), ("requests", &r.requests)] {
            for (name, q) in map.iter().flatten() {
                self.quantity(&format!("{field}.{part}.{name}"), q);
            }
        }
    }

    fn label_key(&mut self, field: &str, key: &str) {
        let (prefix, name) = match key.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, key),
        };
        let prefix_ok =
            prefix.is_none_or(|p| !p.is_empty() && p.len() <= 253 && DNS_SUBDOMAIN_RE.is_match(p));
        let name_ok = name.len() <= DNS_LABEL_MAX && LABEL_NAME_RE.is_match(name);
        self.require(prefix_ok && name_ok, field, || {
            format!("key {key:?} must be a qualified name: an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit")
        });
    }

    fn label_value(&mut self, field: &str, value: &str) {
        self.require(
            value.len() <= DNS_LABEL_MAX && LABEL_VALUE_RE.is_match(value),
            field,
            || format!("value {value:?} must be a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with a letter or digit"),
        );
    }

    fn tolerations(&mut self, tolerations: &[Toleration]) {
        for (i, t) in tolerations.iter().enumerate() {
            let field = format!("spec.tolerations[{i}]");
            if let Some(op) = t.operator.as_deref() {
                self.require(
                    matches!(op, "Exists" | "Equal"),
                    &format!("{field}.operator"),
                    || format!("{op:?} must be one of Exists, Equal"),
                );
            }
            if let Some(effect) = t.effect.as_deref() {
                self.require(
                    matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute"),
                    &format!("{field}.effect"),
                    || format!("{effect:?} must be one of NoSchedule, PreferNoSchedule, NoExecute"),
                );
            }
            if let Some(key) = t.key.as_deref().filter(|k| !k.is_empty()) {
                self.label_key(&format!("{field}.key"), key);
            }
        }
    }

    fn managed_store(&mut self, field: &str, store: &ManagedStore) {
        if let Some(image) = &store.image {
            self.image(&format!("{field}.image"), image);
        }
        if let Some(q) = &store.storage {
            self.require(
                q.0.len() <= 64 && POSITIVE_QUANTITY_RE.is_match(&q.0),
                &format!("{field}.storage"),
                || format!("{:?} must be a positive size such as 1Gi or 500M", q.0),
            );
        }
        if let Some(class) = &store.storage_class_name {
            self.dns_subdomain(&format!("{field}.storageClassName"), class);
        }
        self.resources(&format!("{field}.resources"), store.resources.as_ref());
    }

    fn external_url(&mut self, field: &str, external: &ExternalUrl) {
        self.dns_subdomain(
            &format!("{field}.secretRef.name"),
            &external.secret_ref.name,
        );
        self.secret_key(
            &format!("{field}.secretRef.urlKey"),
            &external.secret_ref.url_key,
        );
    }

    fn secret_key(&mut self, field: &str, key: &str) {
        self.require(
            !key.is_empty() && key.len() <= 253 && SECRET_KEY_RE.is_match(key),
            field,
            || format!("{key:?} must be a Secret key: letters, digits, '-', '_' and '.'"),
        );
    }

    fn bucket(&mut self, field: &str, bucket: &str) {
        self.require(
            BUCKET_RE.is_match(bucket) && !bucket.contains(".."),
            field,
            || format!("{bucket:?} must be an S3 bucket name: 3-63 lowercase letters, digits, '.' and '-', starting and ending with a letter or digit"),
        );
    }

    /// Resolves `managed` xor `external`; an omitted dependency is managed
    /// with defaults.
    fn dependency<M: Clone + Default, E: Clone>(
        &mut self,
        field: &str,
        given: Option<(&Option<M>, &Option<E>)>,
    ) -> Option<Dependency<M, E>> {
        match given {
            None => Some(Dependency::Managed(M::default())),
            Some((Some(m), None)) => Some(Dependency::Managed(m.clone())),
            Some((None, Some(e))) => Some(Dependency::External(e.clone())),
            Some((Some(_), Some(_))) => {
                self.fail(field, "set exactly one of managed or external, not both");
                None
            }
            Some((None, None)) => {
                self.fail(field, "set exactly one of managed or external (omit the dependency for a managed one with defaults)");
                None
            }
        }
    }
}

/// Parses a Kubernetes-style duration (`30s`, `1m30s`, `250ms`, `24h`).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    let longest_number = value
        .split(|c: char| !c.is_ascii_digit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    if value.len() > 64 || !DURATION_RE.is_match(value) {
        return Err(format!(
            "{value:?} is not a duration: use numbers with units ns, us, ms, s, m, h, such as 30s, 1m30s, 24h"
        ));
    }
    if longest_number > bounds::DURATION_MAX_DIGITS {
        return Err(format!("{value:?} is out of range"));
    }
    value
        .parse::<kube::core::Duration>()
        .map(Duration::from)
        .map_err(|e| format!("{value:?} is not a duration: {e}"))
}

/// A retention (`spec.ledger.retention`, `--ledger-retention`): a duration
/// as [`parse_duration`] reads it, or a whole number of days (`30d`).
pub fn parse_retention(value: &str) -> Result<Duration, String> {
    if let Some(days) = value.strip_suffix('d')
        && !days.is_empty()
        && days.len() <= 5
        && !days.starts_with('0')
        && days.bytes().all(|b| b.is_ascii_digit())
    {
        let days: u64 = days
            .parse()
            .map_err(|_| format!("{value:?} is out of range"))?;
        return Ok(Duration::from_secs(days * 24 * 3600));
    }
    parse_duration(value).map_err(|e| format!("{e}, or days such as 30d"))
}

/// Formats a duration the way [`parse_duration`] reads it back and a person
/// writes it: `24h`, `1m30s`, `30s`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() != 0 || d.is_zero() {
        return format!("{d:?}");
    }
    let secs = d.as_secs();
    let mut out = String::new();
    for (unit, size) in [("h", 3600), ("m", 60), ("s", 1)] {
        let n = secs / size % if size == 3600 { u64::MAX } else { 60 };
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

/// Validates the resource and resolves it, or returns every violation.
pub fn validate(resource: &AgentDeployment) -> Result<ValidAgentDeployment, ValidationErrors> {
    let mut c = Checker::default();
    let spec = &resource.spec;

    // metadata
    let name = resource.metadata.name.clone().unwrap_or_default();
    let names = ChildNames::new(&name);
    if name.is_empty() {
        c.fail("metadata.name", "is required");
    } else if !DNS_1035_LABEL_RE.is_match(&name) {
        c.fail(
            "metadata.name",
            format!("{name:?} must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit"),
        );
    }
    if let Some(ns) = resource.metadata.namespace.as_deref() {
        c.require(
            ns.len() <= DNS_LABEL_MAX && DNS_LABEL_RE.is_match(ns),
            "metadata.namespace",
            || format!("{ns:?} must be a DNS label of at most 63 characters"),
        );
    }

    // workload
    c.image("spec.image", &spec.image);
    c.require(
        (0..=MAX_REPLICAS).contains(&spec.replicas),
        "spec.replicas",
        || format!("{} must be between 0 and {MAX_REPLICAS}", spec.replicas),
    );
    c.require(
        (1..=65535).contains(&spec.agent_port),
        "spec.agentPort",
        || format!("{} must be a port between 1 and 65535", spec.agent_port),
    );
    c.require(
        spec.agent_port != i32::from(ports::SIDECAR_HTTP),
        "spec.agentPort",
        || {
            format!(
                "{} is the sidecar's port; choose another",
                ports::SIDECAR_HTTP
            )
        },
    );
    let mut env_names = BTreeSet::new();
    for (i, var) in spec.env.iter().enumerate() {
        let field = format!("spec.env[{i}].name");
        if var.name.is_empty() || var.name.len() > 256 || !ENV_NAME_RE.is_match(&var.name) {
            c.fail(&field, format!("{:?} must be an environment variable name: letters, digits, '_', '-' and '.', not starting with a digit", var.name));
        } else if var.name.starts_with(env::RESERVED_PREFIX) {
            c.fail(
                &field,
                format!(
                    "{:?}: names starting with {} are reserved for Baton",
                    var.name,
                    env::RESERVED_PREFIX
                ),
            );
        } else if !env_names.insert(var.name.as_str()) {
            c.fail(&field, format!("{:?} is set twice", var.name));
        }
    }
    c.resources("spec.resources", spec.resources.as_ref());
    if let Some(sa) = &spec.service_account_name {
        c.dns_subdomain("spec.serviceAccountName", sa);
    }
    label_map(&mut c, "spec.nodeSelector", &spec.node_selector, &[]);
    c.tolerations(&spec.tolerations);
    label_map(
        &mut c,
        "spec.podLabels",
        &spec.pod_labels,
        &labels::RESERVED,
    );
    for key in spec.pod_annotations.keys() {
        let field = format!("spec.podAnnotations[{key:?}]");
        c.label_key(&field, key);
        c.require(
            !key.starts_with(annotations::RESERVED_PREFIX) || key == annotations::RESTARTED_AT,
            &field,
            || {
                format!(
                    "keys under {} are reserved for Baton (except {}, which `baton rollout restart` sets)",
                    annotations::RESERVED_PREFIX,
                    annotations::RESTARTED_AT
                )
            },
        );
    }
    let annotation_bytes: usize = spec
        .pod_annotations
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    c.require(
        annotation_bytes <= 128 * 1024,
        "spec.podAnnotations",
        || format!("{annotation_bytes} bytes in total; annotations must stay under 128 KiB"),
    );

    let timings = session_timings(&mut c, &spec.session);

    // dependencies
    let deps = &spec.dependencies;
    let redis = c.dependency(
        "spec.dependencies.redis",
        deps.redis.as_ref().map(|d| (&d.managed, &d.external)),
    );
    let postgres = c.dependency(
        "spec.dependencies.postgres",
        deps.postgres.as_ref().map(|d| (&d.managed, &d.external)),
    );
    let object_store = c.dependency(
        "spec.dependencies.objectStore",
        deps.object_store
            .as_ref()
            .map(|d| (&d.managed, &d.external)),
    );
    match &redis {
        Some(Dependency::Managed(m)) => {
            c.managed_store("spec.dependencies.redis.managed", &m.store)
        }
        Some(Dependency::External(e)) => c.external_url("spec.dependencies.redis.external", e),
        None => {}
    }
    match &postgres {
        Some(Dependency::Managed(m)) => c.managed_store("spec.dependencies.postgres.managed", m),
        Some(Dependency::External(e)) => c.external_url("spec.dependencies.postgres.external", e),
        None => {}
    }
    match &object_store {
        Some(Dependency::Managed(m)) => {
            c.managed_store("spec.dependencies.objectStore.managed", &m.store);
            c.bucket("spec.dependencies.objectStore.managed.bucket", &m.bucket);
        }
        Some(Dependency::External(e)) => {
            c.dns_subdomain(
                "spec.dependencies.objectStore.external.secretRef.name",
                &e.secret_ref.name,
            );
            c.bucket("spec.dependencies.objectStore.external.bucket", &e.bucket);
        }
        None => {}
    }

    // sidecar and rollout
    if let Some(image) = &spec.sidecar.image {
        c.image("spec.sidecar.image", image);
    }
    c.resources("spec.sidecar.resources", spec.sidecar.resources.as_ref());
    let progress_deadline = c.duration(
        "spec.rollout.progressDeadline",
        &spec.rollout.progress_deadline,
    );
    if let Some(d) = progress_deadline {
        c.require(
            (bounds::PROGRESS_DEADLINE_MIN..=bounds::PROGRESS_DEADLINE_MAX).contains(&d),
            "spec.rollout.progressDeadline",
            || {
                format!(
                    "{} must be between {} and {}",
                    format_duration(d),
                    format_duration(bounds::PROGRESS_DEADLINE_MIN),
                    format_duration(bounds::PROGRESS_DEADLINE_MAX)
                )
            },
        );
    }
    c.require(
        (1..=MAX_REPLICAS).contains(&spec.rollout.max_unavailable),
        "spec.rollout.maxUnavailable",
        || {
            format!(
                "{} must be between 1 and {MAX_REPLICAS}",
                spec.rollout.max_unavailable
            )
        },
    );

    if let Some(retention) = &spec.ledger.retention {
        match parse_retention(retention) {
            Ok(d) => c.require(
                d >= bounds::LEDGER_RETENTION_MIN,
                "spec.ledger.retention",
                || {
                    format!(
                        "{retention} must be at least {}",
                        format_duration(bounds::LEDGER_RETENTION_MIN)
                    )
                },
            ),
            Err(e) => c.fail("spec.ledger.retention", e),
        }
    }

    // Derived names must be valid for their kinds; only check the ones that exist.
    if !name.is_empty() {
        let mut derived = vec![
            (names.replicas(), NamedKind::StatefulSet),
            (names.headless_service(), NamedKind::Service),
        ];
        if matches!(redis, Some(Dependency::Managed(_))) {
            derived.push((names.redis(), NamedKind::StatefulSet));
        }
        if matches!(postgres, Some(Dependency::Managed(_))) {
            derived.push((names.postgres(), NamedKind::StatefulSet));
        }
        if matches!(object_store, Some(Dependency::Managed(_))) {
            derived.push((names.minio(), NamedKind::StatefulSet));
            derived.push((names.bucket_job(), NamedKind::Job));
        }
        if let Some((child, kind)) = derived
            .iter()
            .filter(|(child, kind)| child.len() > kind.max_len())
            .max_by_key(|(child, kind)| child.len() - kind.max_len())
        {
            let limit = name.len() - (child.len() - kind.max_len());
            c.fail(
                "metadata.name",
                format!(
                    "{name:?} is {} characters; at most {limit} fit, because the derived {} name {child:?} must be at most {} characters",
                    name.len(),
                    kind.as_str(),
                    kind.max_len()
                ),
            );
        }
    }

    match (timings, redis, postgres, object_store, progress_deadline) {
        (
            Some(timings),
            Some(redis),
            Some(postgres),
            Some(object_store),
            Some(progress_deadline),
        ) if c.violations.is_empty() => Ok(ValidAgentDeployment {
            resource: resource.clone(),
            name,
            names,
            timings,
            progress_deadline,
            sidecar_image: spec
                .sidecar
                .image
                .clone()
                .unwrap_or_else(|| images::SIDECAR.into()),
            redis,
            postgres,
            object_store,
        }),
        _ => Err(ValidationErrors(c.violations)),
    }
}

fn label_map(c: &mut Checker, field: &str, map: &BTreeMap<String, String>, reserved: &[&str]) {
    for (key, value) in map {
        let entry = format!("{field}[{key:?}]");
        c.label_key(&entry, key);
        c.label_value(&entry, value);
        c.require(!reserved.contains(&key.as_str()), &entry, || {
            "this label is reserved: Baton's selectors use it".into()
        });
    }
}

fn session_timings(c: &mut Checker, s: &crate::SessionSpec) -> Option<SessionTimings> {
    let lease_ttl = c.duration("spec.session.leaseTtl", &s.lease_ttl);
    let state_ttl = c.duration("spec.session.stateTtl", &s.state_ttl);
    let drain_timeout = c.duration("spec.session.drainTimeout", &s.drain_timeout);
    let heartbeat_interval = c.duration("spec.session.heartbeatInterval", &s.heartbeat_interval);
    let renew_interval = match &s.renew_interval {
        Some(r) => c.duration("spec.session.renewInterval", r),
        None => lease_ttl.map(|l| l / 3),
    };
    let show = |d: Duration| format_duration(d);

    if let Some(l) = lease_ttl {
        c.require(
            (bounds::LEASE_TTL_MIN..=bounds::LEASE_TTL_MAX).contains(&l),
            "spec.session.leaseTtl",
            || {
                format!(
                    "{} must be between {} and {}",
                    show(l),
                    show(bounds::LEASE_TTL_MIN),
                    show(bounds::LEASE_TTL_MAX)
                )
            },
        );
    }
    if let Some(st) = state_ttl {
        c.require(st <= bounds::STATE_TTL_MAX, "spec.session.stateTtl", || {
            format!(
                "{} must be at most {}",
                show(st),
                show(bounds::STATE_TTL_MAX)
            )
        });
        if let Some(l) = lease_ttl {
            c.require(st >= l, "spec.session.stateTtl", || {
                format!("{} must be at least leaseTtl ({})", show(st), show(l))
            });
        }
    }
    if let Some(d) = drain_timeout {
        c.require(
            (bounds::DRAIN_TIMEOUT_MIN..=bounds::DRAIN_TIMEOUT_MAX).contains(&d),
            "spec.session.drainTimeout",
            || {
                format!(
                    "{} must be between {} and {}",
                    show(d),
                    show(bounds::DRAIN_TIMEOUT_MIN),
                    show(bounds::DRAIN_TIMEOUT_MAX)
                )
            },
        );
    }
    if let (Some(r), Some(l)) = (renew_interval, lease_ttl) {
        c.require(!r.is_zero() && r < l, "spec.session.renewInterval", || {
            format!(
                "{} must be greater than 0 and shorter than leaseTtl ({})",
                show(r),
                show(l)
            )
        });
    }
    if let Some(h) = heartbeat_interval {
        c.require(
            h >= bounds::HEARTBEAT_INTERVAL_MIN,
            "spec.session.heartbeatInterval",
            || {
                format!(
                    "{} must be at least {}",
                    show(h),
                    show(bounds::HEARTBEAT_INTERVAL_MIN)
                )
            },
        );
        if let Some(l) = lease_ttl {
            c.require(h < l, "spec.session.heartbeatInterval", || {
                format!("{} must be shorter than leaseTtl ({})", show(h), show(l))
            });
        }
    }
    Some(SessionTimings {
        lease_ttl: lease_ttl?,
        state_ttl: state_ttl?,
        renew_interval: renew_interval?,
        drain_timeout: drain_timeout?,
        heartbeat_interval: heartbeat_interval?,
    })
}
