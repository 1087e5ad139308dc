//! A container's environment as a kubelet computes it: `envFrom`, then `env`
//! in order (`value` with `$(VAR)` expansion, `valueFrom` secret, config map
//! and field references), and `$(VAR)` expansion of command and args.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

/// Why a container's configuration cannot be built yet (a kubelet reports
/// `CreateContainerConfigError` and tries again).
#[derive(Debug)]
pub(crate) struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What `fieldRef`s read besides the pod object itself.
pub(crate) struct PodFacts<'a> {
    pub pod: &'a Pod,
    pub pod_ip: Option<Ipv4Addr>,
    pub host_ip: Ipv4Addr,
}

/// Secrets and config maps of one namespace, each fetched once per
/// container start. `None` caches "not found".
pub(crate) struct Sources {
    client: kube::Client,
    namespace: String,
    secrets: HashMap<String, Option<BTreeMap<String, String>>>,
    config_maps: HashMap<String, Option<BTreeMap<String, String>>>,
}

impl Sources {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            secrets: HashMap::new(),
            config_maps: HashMap::new(),
        }
    }

    pub async fn secret(
        &mut self,
        name: &str,
    ) -> Result<Option<&BTreeMap<String, String>>, ConfigError> {
        if !self.secrets.contains_key(name) {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
            let found = api
                .get_opt(name)
                .await
                .map_err(|e| ConfigError(format!("reading secret {name:?}: {e}")))?;
            let data = found.map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect()
            });
            self.secrets.insert(name.to_owned(), data);
        }
        Ok(self.secrets[name].as_ref())
    }

    pub async fn config_map(
        &mut self,
        name: &str,
    ) -> Result<Option<&BTreeMap<String, String>>, ConfigError> {
        if !self.config_maps.contains_key(name) {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
            let found = api
                .get_opt(name)
                .await
                .map_err(|e| ConfigError(format!("reading configmap {name:?}: {e}")))?;
            let data = found.map(|c| {
                let mut data = c.data.unwrap_or_default();
                for (k, v) in c.binary_data.unwrap_or_default() {
                    data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
                }
                data
            });
            self.config_maps.insert(name.to_owned(), data);
        }
        Ok(self.config_maps[name].as_ref())
    }
}

/// The container's environment, in definition order (later definitions of
/// a name win, as in a container runtime).
pub(crate) async fn resolve(
    container: &Container,
    facts: &PodFacts<'_>,
    sources: &mut Sources,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (data, what, name, optional) = if let Some(r) = &from.secret_ref {
            let data = sources.secret(&r.name).await?.cloned();
            (data, "secret", &r.name, r.optional.unwrap_or(false))
        } else if let Some(r) = &from.config_map_ref {
            let data = sources.config_map(&r.name).await?.cloned();
            (data, "configmap", &r.name, r.optional.unwrap_or(false))
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (k, v) in data {
                    let key = format!("{prefix}{k}");
                    if is_env_name(&key) {
                        set(&mut env, key, v);
                    }
                }
            }
            None if optional => {}
            None => return Err(ConfigError(format!("{what} {name:?} not found"))),
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(from) = &var.value_from {
            if let Some(r) = &from.secret_key_ref {
                let optional = r.optional.unwrap_or(false);
                match sources.secret(&r.name).await? {
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if optional => None,
                        None => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in Secret {}/{}",
                                r.key, sources.namespace, r.name
                            )));
                        }
                    },
                    None if optional => None,
                    None => {
                        return Err(ConfigError(format!("secret {:?} not found", r.name)));
                    }
                }
            } else if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional.unwrap_or(false);
                match sources.config_map(&r.name).await? {
                    Some(data) => match data.get(&r.key) {
                        Some(v) => Some(v.clone()),
                        None if optional => None,
                        None => {
                            return Err(ConfigError(format!(
                                "couldn't find key {} in ConfigMap {}/{}",
                                r.key, sources.namespace, r.name
                            )));
                        }
                    },
                    None if optional => None,
                    None => {
                        return Err(ConfigError(format!("configmap {:?} not found", r.name)));
                    }
                }
            } else if let Some(r) = &from.field_ref {
                Some(field_value(&r.field_path, facts)?)
            } else {
                return Err(ConfigError(format!(
                    "env {}: only secretKeyRef, configMapKeyRef and fieldRef are supported by the test node",
                    var.name
                )));
            }
        } else {
            let defined: HashMap<&str, &str> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            Some(expand(var.value.as_deref().unwrap_or_default(), &defined))
        };
        // An optional reference to a missing key leaves the variable unset.
        if let Some(value) = value {
            set(&mut env, var.name.clone(), value);
        }
    }
    Ok(env)
}

fn set(env: &mut Vec<(String, String)>, key: String, value: String) {
    env.retain(|(k, _)| *k != key);
    env.push((key, value));
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The value of a downward-API `fieldRef`.
pub(crate) fn field_value(path: &str, facts: &PodFacts<'_>) -> Result<String, ConfigError> {
    let meta = &facts.pod.metadata;
    let spec = facts.pod.spec.as_ref();
    let quoted = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_owned)
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => {
            facts.pod_ip.map(|ip| ip.to_string()).unwrap_or_default()
        }
        "status.hostIP" | "status.hostIPs" => facts.host_ip.to_string(),
        _ => {
            if let Some(key) = quoted("metadata.labels['") {
                meta.labels
                    .as_ref()
                    .and_then(|l| l.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = quoted("metadata.annotations['") {
                meta.annotations
                    .as_ref()
                    .and_then(|a| a.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(ConfigError(format!(
                    "fieldRef {path:?} is not supported by the test node"
                )));
            }
        }
    };
    Ok(value)
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an
/// undefined reference stays as written, `$$` is a literal `$`.
pub(crate) fn expand(input: &str, defined: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(close) => {
                    let name = &body[..close];
                    match defined.get(name) {
                        Some(value) => out.push_str(value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[close + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &[(&'a str, &'a str)]) -> HashMap<&'a str, &'a str> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let defined = vars(&[("A", "1"), ("PW", "s3cret")]);
        assert_eq!(
            expand("--requirepass $(PW)", &defined),
            "--requirepass s3cret"
        );
        assert_eq!(expand("$(A)$(A)-$(B)", &defined), "11-$(B)");
        assert_eq!(expand("$$(A) costs $5", &defined), "$(A) costs $5");
        assert_eq!(expand("$(A", &defined), "$(A");
        assert_eq!(expand("plain", &defined), "plain");
        assert_eq!(expand("", &defined), "");
    }

    #[test]
    fn field_refs_read_the_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p-0", "namespace": "ns", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1", "containers": []}
        }))
        .unwrap();
        let facts = PodFacts {
            pod: &pod,
            pod_ip: Some(Ipv4Addr::new(10, 244, 1, 2)),
            host_ip: Ipv4Addr::new(10, 244, 1, 1),
        };
        let v = |p: &str| field_value(p, &facts).unwrap();
        assert_eq!(v("metadata.name"), "p-0");
        assert_eq!(v("metadata.namespace"), "ns");
        assert_eq!(v("spec.nodeName"), "n1");
        assert_eq!(v("status.podIP"), "10.244.1.2");
        assert_eq!(v("status.hostIP"), "10.244.1.1");
        assert_eq!(v("metadata.labels['app']"), "x");
        assert!(field_value("status.phase", &facts).is_err());
    }
}
