//! YAML output that Kubernetes tooling reads back as written.
//!
//! serde_yaml writes YAML 1.2, where `yes`, `on` and `off` are plain
//! strings; kubectl and most Kubernetes tooling read YAML 1.1, where they
//! are booleans. Redis's `--appendonly yes` would reach the API server as
//! `true`. yaml-rust2's emitter quotes every such string, so objects go
//! through serde_json into it.

use serde::Serialize;
use serde_json::Value;
use yaml_rust2::YamlEmitter;
use yaml_rust2::yaml::{Hash, Yaml};

fn to_yaml(value: Value) -> Yaml {
    match value {
        Value::Null => Yaml::Null,
        Value::Bool(b) => Yaml::Boolean(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Yaml::Integer(i),
            None => Yaml::Real(n.to_string()),
        },
        Value::String(s) => Yaml::String(s),
        Value::Array(items) => Yaml::Array(items.into_iter().map(to_yaml).collect()),
        Value::Object(map) => {
            let mut hash = Hash::new();
            for (k, v) in map {
                hash.insert(Yaml::String(k), to_yaml(v));
            }
            Yaml::Hash(hash)
        }
    }
}

/// One YAML document, starting with `---`, ending with a newline.
pub fn document(object: &impl Serialize) -> anyhow::Result<String> {
    let yaml = to_yaml(serde_json::to_value(object)?);
    let mut out = String::new();
    let mut emitter = YamlEmitter::new(&mut out);
    emitter.multiline_strings(true);
    emitter.dump(&yaml)?;
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_1_1_booleans_and_numbers_in_strings_are_quoted() {
        let out = document(&serde_json::json!({"args": ["--appendonly", "yes", "on", "0755", "1e3"], "count": 3, "flag": true})).unwrap();
        for quoted in ["\"yes\"", "\"on\"", "\"0755\"", "\"1e3\""] {
            assert!(out.contains(quoted), "{quoted} not quoted in\n{out}");
        }
        assert!(
            out.contains("count: 3") && out.contains("flag: true"),
            "{out}"
        );
    }
}
