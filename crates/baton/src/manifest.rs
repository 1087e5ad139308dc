//! Reading manifests from files and writing objects as YAML.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use baton_api::parse::{MAX_MANIFEST_BYTES, from_yaml};
use baton_api::{AgentDeployment, ValidAgentDeployment, validate};
use baton_resources::meta::PLACEHOLDER_UID;
use baton_resources::{Credentials, build};
use kube::CustomResourceExt;

/// Reads a file, or standard input for `-`, refusing oversized input
/// before reading all of it.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    let limit = MAX_MANIFEST_BYTES as u64 + 1;
    let mut text = String::new();
    let reader: Box<dyn Read> = if path.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?)
    };
    reader
        .take(limit)
        .read_to_string(&mut text)
        .with_context(|| format!("reading {} (is it UTF-8 text?)", path.display()))?;
    if text.len() > MAX_MANIFEST_BYTES {
        bail!(
            "{} is larger than {MAX_MANIFEST_BYTES} bytes",
            path.display()
        );
    }
    Ok(text)
}

/// Reads, parses and validates one AgentDeployment manifest.
pub fn load(path: &Path) -> anyhow::Result<(AgentDeployment, ValidAgentDeployment)> {
    let text = read_text(path)?;
    let invalid = |e| anyhow::anyhow!("{} is not a valid AgentDeployment: {e}", path.display());
    let resource = from_yaml(&text).map_err(invalid)?;
    let valid = validate(&resource).map_err(invalid)?;
    Ok((resource, valid))
}

pub fn crd_yaml() -> anyhow::Result<String> {
    crate::yaml::document(&AgentDeployment::crd())
}

/// Every object of the deployment as multi-document YAML, in apply order.
pub fn render(
    valid: &ValidAgentDeployment,
    creds: &Credentials,
    platform: &baton_resources::Platform,
    generated: bool,
) -> anyhow::Result<String> {
    let mut out = format!(
        "# Objects the Baton operator applies for AgentDeployment {:?}.\n",
        valid.name
    );
    if valid.resource.metadata.uid.is_none() {
        out.push_str(&format!(
            "# ownerReferences carry the placeholder uid {PLACEHOLDER_UID}: the resource gets its uid when it is created.\n"
        ));
    }
    if generated {
        out.push_str("# Store credentials were generated for this render; pass --credentials to reuse existing ones.\n");
    }
    for object in build(valid, creds, platform).into_objects() {
        out.push_str(&crate::yaml::document(&object)?);
    }
    Ok(out)
}
