//! `baton rollout status|pause|resume|restart agd/NAME`: the rollout from a
//! terminal, as `kubectl rollout` does it for Deployments. Every command is
//! one read or one patch of the `AgentDeployment`; the operator does the rest.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use baton_api::constants::annotations;
use baton_api::{AgentDeployment, RolloutPhase};
use kube::Api;
use kube::api::{Patch, PatchParams};

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: RolloutCommand,
    /// Namespace of the AgentDeployment; the kubeconfig context's when not set.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// Kubeconfig file; the in-cluster configuration when not set.
    #[arg(long, env = "KUBECONFIG", global = true, hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
pub enum RolloutCommand {
    /// Follow the rollout until every replica runs the new revision (exit
    /// 0), it stalls (exit 1) or the timeout passes (exit 1).
    Status {
        /// `agd/NAME` (or `agentdeployment/NAME`, or `NAME`).
        resource: String,
        /// Give up after this long (e.g. 10m); 0 waits forever.
        #[arg(long, default_value = "0s", value_parser = parse_timeout)]
        timeout: Duration,
        /// Print the state once and exit, without following.
        #[arg(long)]
        no_watch: bool,
    },
    /// Stop the rollout between pods (sets spec.rollout.paused).
    Pause { resource: String },
    /// Let a paused rollout go on (clears spec.rollout.paused).
    Resume { resource: String },
    /// Replace every replica, drained one by one, with the same spec (sets
    /// the `baton.dev/restarted-at` pod annotation to now).
    Restart { resource: String },
}

fn parse_timeout(value: &str) -> Result<Duration, String> {
    if value == "0" {
        return Ok(Duration::ZERO);
    }
    baton_api::validate::parse_duration(value)
}

/// The name in `agd/NAME`, `agentdeployment/NAME`,
/// `agentdeployments.baton.dev/NAME` or `NAME`.
pub fn resource_name(resource: &str) -> anyhow::Result<&str> {
    let name = match resource.split_once('/') {
        None => resource,
        Some((kind, name)) => {
            let kind = kind.to_ascii_lowercase();
            let known = [
                "agd",
                "agentdeployment",
                "agentdeployments",
                "agentdeployment.baton.dev",
                "agentdeployments.baton.dev",
            ];
            if !known.contains(&kind.as_str()) {
                bail!("{resource:?}: only AgentDeployments roll out here (agd/NAME)");
            }
            name
        }
    };
    if name.is_empty() || name.contains('/') {
        bail!("{resource:?}: expected agd/NAME");
    }
    Ok(name)
}

pub async fn run(args: RolloutArgs) -> anyhow::Result<()> {
    let client = crate::client(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let api: Api<AgentDeployment> = Api::namespaced(client, &namespace);
    match args.command {
        RolloutCommand::Status {
            resource,
            timeout,
            no_watch,
        } => status(&api, resource_name(&resource)?, timeout, no_watch).await,
        RolloutCommand::Pause { resource } => {
            let name = resource_name(&resource)?;
            patch(
                &api,
                name,
                serde_json::json!({"spec": {"rollout": {"paused": true}}}),
            )
            .await?;
            println!("agentdeployment.baton.dev/{name} paused");
            Ok(())
        }
        RolloutCommand::Resume { resource } => {
            let name = resource_name(&resource)?;
            patch(
                &api,
                name,
                serde_json::json!({"spec": {"rollout": {"paused": false}}}),
            )
            .await?;
            println!("agentdeployment.baton.dev/{name} resumed");
            Ok(())
        }
        RolloutCommand::Restart { resource } => {
            let name = resource_name(&resource)?;
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            patch(
                &api,
                name,
                serde_json::json!({"spec": {"podAnnotations": {annotations::RESTARTED_AT: now}}}),
            )
            .await?;
            println!("agentdeployment.baton.dev/{name} restarted");
            Ok(())
        }
    }
}

async fn patch(
    api: &Api<AgentDeployment>,
    name: &str,
    body: serde_json::Value,
) -> anyhow::Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .with_context(|| format!("patching agentdeployment {name}"))?;
    Ok(())
}

/// What `status` says about one read, and whether it is the end.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Waiting(String),
    Done(String),
    Failed(String),
}

/// The verdict on one read of the resource (pure, for the tests).
pub fn verdict(agd: &AgentDeployment) -> Verdict {
    let name = agd.metadata.name.as_deref().unwrap_or("?");
    let Some(status) = agd.status.as_ref() else {
        return Verdict::Waiting("waiting for the operator to report a status".into());
    };
    if status.observed_generation < agd.metadata.generation {
        return Verdict::Waiting("waiting for the operator to see the latest spec".into());
    }
    let Some(rollout) = status.rollout.as_ref() else {
        return Verdict::Waiting("waiting for the operator to report the rollout".into());
    };
    let line = format!(
        "{} of {} replicas run revision {}",
        rollout.updated,
        rollout.total,
        rollout.revision.as_deref().unwrap_or("?")
    );
    match rollout.phase {
        RolloutPhase::Complete => Verdict::Done(format!(
            "agentdeployment \"{name}\" successfully rolled out ({line})"
        )),
        RolloutPhase::Stalled => Verdict::Failed(format!(
            "agentdeployment \"{name}\" rollout stalled: {}",
            rollout.message.as_deref().unwrap_or("see its conditions")
        )),
        _ => Verdict::Waiting(format!(
            "Waiting for rollout to finish: {}",
            rollout.summary()
        )),
    }
}

async fn status(
    api: &Api<AgentDeployment>,
    name: &str,
    timeout: Duration,
    no_watch: bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let agd = api
            .get(name)
            .await
            .with_context(|| format!("reading agentdeployment {name}"))?;
        match verdict(&agd) {
            Verdict::Done(line) => {
                println!("{line}");
                return Ok(());
            }
            Verdict::Failed(line) => bail!("{line}"),
            Verdict::Waiting(line) => {
                if line != last {
                    println!("{line}");
                    last = line;
                }
                if no_watch {
                    return Ok(());
                }
            }
        }
        if !timeout.is_zero() && started.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for the rollout of {name}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_api::{AgentDeploymentStatus, RolloutStatus, RolloutStep};

    #[test]
    fn resources_are_named_as_kubectl_names_them() {
        assert_eq!(resource_name("agd/demo").unwrap(), "demo");
        assert_eq!(resource_name("AgentDeployment/demo").unwrap(), "demo");
        assert_eq!(
            resource_name("agentdeployments.baton.dev/demo").unwrap(),
            "demo"
        );
        assert_eq!(resource_name("demo").unwrap(), "demo");
        let e = resource_name("deployment/demo").unwrap_err().to_string();
        assert!(e.contains("agd/NAME"), "{e}");
        assert!(resource_name("agd/").is_err());
        assert!(resource_name("agd/a/b").is_err());
    }

    fn agd(generation: i64, observed: i64, rollout: Option<RolloutStatus>) -> AgentDeployment {
        let mut agd = AgentDeployment::new(
            "demo",
            serde_json::from_value(serde_json::json!({"image": "x"})).unwrap(),
        );
        agd.metadata.generation = Some(generation);
        agd.status = Some(AgentDeploymentStatus {
            observed_generation: Some(observed),
            rollout,
            ..AgentDeploymentStatus::default()
        });
        agd
    }

    #[test]
    fn status_waits_for_the_latest_spec_then_follows_the_phase() {
        let progressing = RolloutStatus {
            phase: RolloutPhase::Progressing,
            updated: 1,
            total: 3,
            pod: Some("demo-1".into()),
            step: Some(RolloutStep::Draining),
            ..RolloutStatus::default()
        };
        let complete = RolloutStatus {
            phase: RolloutPhase::Complete,
            updated: 3,
            total: 3,
            revision: Some("demo-abc".into()),
            ..RolloutStatus::default()
        };
        assert!(matches!(
            verdict(&agd(2, 1, Some(complete.clone()))),
            Verdict::Waiting(_)
        ));
        let Verdict::Waiting(line) = verdict(&agd(2, 2, Some(progressing))) else {
            panic!()
        };
        assert!(
            line.contains("1/3") && line.contains("demo-1 Draining"),
            "{line}"
        );
        let Verdict::Done(line) = verdict(&agd(2, 2, Some(complete))) else {
            panic!()
        };
        assert!(
            line.contains("successfully rolled out") && line.contains("demo-abc"),
            "{line}"
        );
        let stalled = RolloutStatus {
            phase: RolloutPhase::Stalled,
            message: Some("pod demo-2 is not ready".into()),
            ..RolloutStatus::default()
        };
        assert!(
            matches!(verdict(&agd(2, 2, Some(stalled))), Verdict::Failed(m) if m.contains("demo-2"))
        );
    }
}
