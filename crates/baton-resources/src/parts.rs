//! Small pieces of pod specs used by several builders.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Capabilities, EnvVar, EnvVarSource, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, Probe, SeccompProfile, SecretKeySelector,
    SecurityContext, ServicePort, TCPSocketAction, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub fn env_value(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        value_from: None,
    }
}

pub fn env_from_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: field_path.to_owned(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// An environment variable read from a Secret key: credentials never appear inline.
pub fn env_from_secret(name: &str, secret: &str, key: &str, optional: bool) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: optional.then_some(true),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Pod security context: non-root, default seccomp profile.
pub fn pod_security(uid: i64) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        run_as_group: Some(uid),
        fs_group: Some(uid),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// Container security context: no privilege escalation, every capability dropped.
pub fn container_security(read_only_root: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: read_only_root.then_some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..SecurityContext::default()
    }
}

pub fn tcp_probe(port: u16, period_seconds: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::Int(i32::from(port)),
            host: None,
        }),
        period_seconds: Some(period_seconds),
        ..Probe::default()
    }
}

/// A TCP Service port; the protocol is explicit because server-side apply
/// on older API servers needs it as part of the list key.
pub fn service_port(name: &str, port: u16, target: &str) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port: i32::from(port),
        target_port: Some(IntOrString::String(target.to_owned())),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// The `data` volume claim template of a single-instance store.
pub fn data_volume_claim(size: &Quantity, storage_class: Option<&String>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: storage_class.cloned(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), size.clone())])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Secret data from string pairs.
pub fn secret_data<'a>(
    pairs: impl IntoIterator<Item = (&'a str, String)>,
) -> BTreeMap<String, ByteString> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
        .collect()
}
