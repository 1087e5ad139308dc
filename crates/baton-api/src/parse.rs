//! Reading an `AgentDeployment` from YAML or JSON text, strictly: wrong
//! types and unknown fields (a typo such as `leaseTTL` would otherwise be
//! dropped silently and the default used) are violations with their path.

use serde::Deserialize;

use crate::validate::{ValidationErrors, Violation};
use crate::{AgentDeployment, constants};

/// Largest manifest accepted; the API server's own limit is about 1.5 MiB.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

fn violation(field: impl Into<String>, message: impl Into<String>) -> ValidationErrors {
    ValidationErrors(vec![Violation {
        field: field.into(),
        message: message.into(),
    }])
}

/// Turns serde's `a.b[0].c` path into the `a.b[0].c` field notation used
/// by every other violation (serde writes `?` for unknown positions).
fn field_path(path: &serde_path_to_error::Path) -> String {
    let text = path.to_string();
    if text == "." || text.is_empty() {
        "(root)".into()
    } else {
        text
    }
}

/// Parses one `AgentDeployment` document (YAML, or JSON which is YAML).
pub fn from_yaml(text: &str) -> Result<AgentDeployment, ValidationErrors> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(violation(
            "(root)",
            format!(
                "the manifest is {} bytes; at most {MAX_MANIFEST_BYTES} are accepted",
                text.len()
            ),
        ));
    }
    let mut documents = serde_yaml::Deserializer::from_str(text);
    let Some(document) = documents.next() else {
        return Err(violation("(root)", "the manifest is empty"));
    };
    let value = serde_yaml::Value::deserialize(document)
        .map_err(|e| violation("(root)", format!("not valid YAML: {e}")))?;
    if documents.next().is_some() {
        return Err(violation(
            "(root)",
            "expected one document; split the file or pass one resource at a time",
        ));
    }
    if !value.is_mapping() {
        return Err(violation(
            "(root)",
            "expected a mapping with apiVersion, kind, metadata and spec",
        ));
    }

    let mut problems = Vec::new();
    let expected_api_version = format!("{}/{}", constants::GROUP, constants::VERSION);
    match value.get("apiVersion").and_then(|v| v.as_str()) {
        Some(v) if v == expected_api_version => {}
        other => problems.push(Violation {
            field: "apiVersion".into(),
            message: format!("{other:?} must be {expected_api_version:?}"),
        }),
    }
    match value.get("kind").and_then(|v| v.as_str()) {
        Some("AgentDeployment") => {}
        other => problems.push(Violation {
            field: "kind".into(),
            message: format!("{other:?} must be \"AgentDeployment\""),
        }),
    }
    if value.get("spec").is_none() {
        problems.push(Violation {
            field: "spec".into(),
            message: "is required".into(),
        });
    }
    if !problems.is_empty() {
        return Err(ValidationErrors(problems));
    }

    let mut unknown = Vec::new();
    // The derived type checks apiVersion and kind without keeping them;
    // they were checked above.
    let mut record = |path: serde_ignored::Path<'_>| {
        let path = path.to_string();
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    };
    let ignoring = serde_ignored::Deserializer::new(value, &mut record);
    let resource: AgentDeployment = serde_path_to_error::deserialize(ignoring).map_err(|e| {
        let message = e.inner().to_string();
        // serde names a missing field in the message of its parent; point at the field itself.
        match message
            .strip_prefix("missing field `")
            .and_then(|m| m.split_once('`'))
        {
            Some((missing, _)) => {
                let field = match field_path(e.path()).as_str() {
                    "(root)" => missing.to_owned(),
                    parent => format!("{parent}.{missing}"),
                };
                violation(field, "is required")
            }
            None => violation(field_path(e.path()), message),
        }
    })?;
    if !unknown.is_empty() {
        return Err(ValidationErrors(
            unknown
                .into_iter()
                .map(|field| Violation {
                    field,
                    message: "unknown field (check the spelling; see `baton crd` for the schema)"
                        .into(),
                })
                .collect(),
        ));
    }
    Ok(resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Vec<String> {
        from_yaml(text)
            .unwrap_err()
            .0
            .into_iter()
            .map(|v| v.field)
            .collect()
    }

    #[test]
    fn minimal_document_parses_with_defaults() {
        let agd = from_yaml(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: a}\nspec: {image: x}\n",
        )
        .unwrap();
        assert_eq!(agd.spec.replicas, 2);
        assert_eq!(agd.spec.session.lease_ttl, "30s");
    }

    #[test]
    fn wrong_type_names_the_field() {
        let f = fields(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: a}\nspec: {image: x, replicas: many}\n",
        );
        assert_eq!(f, ["spec.replicas"]);
    }

    #[test]
    fn unknown_fields_are_reported_each_with_its_path() {
        let f = fields(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nmetadata: {name: a}\nspec: {image: x, session: {leaseTTL: 5s}, replica: 3}\n",
        );
        assert_eq!(f, ["spec.session.leaseTTL", "spec.replica"]);
    }

    #[test]
    fn wrong_kind_and_version_are_both_reported() {
        let f = fields("apiVersion: apps/v1\nkind: Deployment\nspec: {}\n");
        assert_eq!(f, ["apiVersion", "kind"]);
    }

    #[test]
    fn several_documents_are_refused() {
        let f = fields(
            "apiVersion: baton.dev/v1alpha1\nkind: AgentDeployment\nspec: {image: x}\n---\na: 1\n",
        );
        assert_eq!(f, ["(root)"]);
    }
}
