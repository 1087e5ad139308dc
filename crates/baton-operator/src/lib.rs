//! `baton operator`: reconciles `AgentDeployment`s into replica
//! StatefulSets, managed stores and status, on any Kubernetes cluster.
//!
//! The shape is the usual one for a controller: watches fill caches and
//! trigger reconciles ([`caches`]). A reconcile is observe → decide →
//! execute: [`observe`] reads the resource and everything it depends on
//! (caches, external Secrets, the sidecars of its pods) into one value,
//! [`decide`] turns that into every action as a pure function (built on
//! [`children`], [`status`], [`rollout`] and the builders of
//! `baton-resources`), and [`reconcile`] performs them: server-side apply
//! of what changed, prunes, drains, events, the status. Only the leader of a
//! `coordination.k8s.io` Lease writes ([`leader`]).
#![forbid(unsafe_code)]

pub mod apply;
pub mod caches;
pub mod children;
pub mod context;
pub mod decide;
mod http;
pub mod leader;
pub mod metrics;
pub mod observation;
pub mod observe;
pub mod rbac;
pub mod reconcile;
pub mod rollout;
pub mod rollout_cli;
pub mod rollout_io;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use baton_api::AgentDeployment;
use baton_api::constants::labels;
use futures::StreamExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::error_boundary::DeserializeGuard;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, controller, watcher};
use kube::{Client, ResourceExt};
use tracing::info;

use crate::caches::Scope;
use crate::context::Context;
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// Flags and environment of `baton operator`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct OperatorArgs {
    #[command(subcommand)]
    pub command: Option<OperatorCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum OperatorCommand {
    /// Print the operator's least-privilege RBAC (ServiceAccount, role,
    /// binding) as YAML.
    Rbac {
        /// Namespace the operator runs in (its ServiceAccount and Lease).
        #[arg(long, default_value = "baton-system")]
        operator_namespace: String,
        /// A Role for this namespace only (for `--namespace`), instead of a ClusterRole.
        #[arg(long)]
        namespace: Option<String>,
        /// Print only the rules, as the Helm chart reads them
        /// (`charts/baton/files/operator-rbac.yaml`).
        #[arg(long, conflicts_with_all = ["operator_namespace", "namespace"])]
        rules: bool,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Watch only this namespace; every namespace when not set.
    #[arg(long, env = "BATON_WATCH_NAMESPACE", hide_env_values = true)]
    pub namespace: Option<String>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "BATON_METRICS_LISTEN",
        default_value = "0.0.0.0:8080",
        hide_env_values = true
    )]
    pub metrics_listen: SocketAddr,
    /// Kubeconfig file; the in-cluster configuration when not set.
    #[arg(long, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Take part in leader election (turn off only when a single instance runs).
    #[arg(long, env = "BATON_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set, hide_env_values = true)]
    pub leader_elect: bool,
    /// Namespace of the leader election Lease (the operator's own).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "default",
        hide_env_values = true
    )]
    pub leader_election_namespace: String,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "baton-operator")]
    pub leader_election_id: String,
    /// This instance's identity in the Lease and in events; the pod name in a cluster.
    #[arg(long, env = "POD_NAME", hide_env_values = true)]
    pub identity: Option<String>,
    /// Give every AgentDeployment NetworkPolicies: the sidecars' turn port
    /// open to all, their admin port and the managed stores only to pods
    /// labelled `baton.dev/admin-client: "true"` in the operator's own
    /// namespace (`POD_NAMESPACE`: the operator and the dashboard).
    #[arg(long, env = "BATON_NETWORK_POLICIES", default_value_t = true, action = clap::ArgAction::Set, hide_env_values = true)]
    pub network_policies: bool,
    /// Sidecar image for AgentDeployments that do not set spec.sidecar.image.
    #[arg(long, env = "BATON_SIDECAR_IMAGE", hide_env_values = true)]
    pub sidecar_image: Option<String>,
    /// How often an unchanged resource is checked again (a check that finds
    /// nothing to do writes nothing); e.g. 10m, 30s.
    #[arg(long, env = "BATON_RESYNC_INTERVAL", default_value = "10m", value_parser = parse_interval, hide_env_values = true)]
    pub resync_interval: Duration,
    /// How many resources are reconciled at once (one resource is never
    /// reconciled twice at once). Each reconcile holds the objects it
    /// builds and sends, so this bounds the operator's memory when many
    /// resources change together.
    #[arg(long, env = "BATON_MAX_CONCURRENT_RECONCILES", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..), hide_env_values = true)]
    pub max_concurrent_reconciles: u16,
}

fn parse_interval(value: &str) -> Result<Duration, String> {
    let interval = baton_api::validate::parse_duration(value)?;
    if interval < Duration::from_secs(1) {
        return Err("must be at least 1s".into());
    }
    Ok(interval)
}

pub(crate) async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and no in-cluster configuration")?,
    };
    Ok(Client::try_from(config)?)
}

fn default_identity() -> String {
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "baton".into());
    format!("{}-{}", host.trim(), std::process::id())
}

/// Runs the operator until SIGTERM or Ctrl-C (Ok), or until it loses the
/// leader Lease (Err: exit, and a restart rejoins the election, as client-go
/// controllers do).
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_ref()).await?;
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(http::Health::default());
    let listener = http::bind(args.metrics_listen).await?;
    info!(address = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    tokio::spawn(http::serve(listener, health.clone(), metrics.clone()));

    let version = client
        .apiserver_version()
        .await
        .context("reaching the API server")?;
    info!(version = %version.git_version, %identity, "connected to the API server");
    health.ready.store(true, Ordering::Relaxed);

    if !args.leader_elect {
        metrics.leader.set(1);
        let controller = run_controller(
            client.clone(),
            &args,
            identity.clone(),
            metrics.clone(),
            Leadership::unconditional(),
        );
        return tokio::select! {
            result = controller => result,
            () = shutdown_signal() => Ok(()),
        };
    }
    leader::lead(
        client.clone(),
        &args.leader_election_namespace,
        &args.leader_election_id,
        &identity,
        &metrics,
        |leadership| run_controller(client, &args, identity.clone(), metrics.clone(), leadership),
    )
    .await
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    info!("shutting down");
}

async fn run_controller(
    client: Client,
    args: &RunArgs,
    identity: String,
    metrics: Arc<Metrics>,
    leadership: Leadership,
) -> anyhow::Result<()> {
    let scope = match &args.namespace {
        Some(ns) => Scope::Namespace(ns.clone()),
        None => Scope::All,
    };
    let resources = scope.api::<DeserializeGuard<AgentDeployment>>(&client);
    let (caches, streams) = caches::start(&client, &scope);
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "baton-operator".into(),
            instance: Some(identity),
        },
    );
    let ctx = Arc::new(Context {
        client,
        caches,
        recorder,
        metrics,
        default_sidecar_image: args.sidecar_image.clone(),
        settings: decide::Settings {
            platform: baton_resources::Platform {
                network_policies: args
                    .network_policies
                    .then(|| baton_resources::AdminClients {
                        namespace: args.leader_election_namespace.clone(),
                    }),
            },
            resync: args.resync_interval,
        },
        verified: Default::default(),
        failures: Default::default(),
        sidecars: Default::default(),
        leadership,
    });
    info!(scope = ?scope, "reconciling AgentDeployments");
    Controller::new(resources, watcher::Config::default().any_semantic())
        .with_config(controller::Config::default().concurrency(args.max_concurrent_reconciles))
        .owns_stream(streams.service_accounts)
        .owns_stream(streams.secrets)
        .owns_stream(streams.config_maps)
        .owns_stream(streams.services)
        .owns_stream(streams.stateful_sets)
        .owns_stream(streams.jobs)
        .owns_stream(streams.network_policies)
        .owns_stream(streams.pod_disruption_budgets)
        // Pods belong to the StatefulSet, not to us: map them by their instance label.
        .watches_stream(streams.pods, |pod| {
            let namespace = pod.namespace()?;
            let name = pod.labels().get(labels::INSTANCE)?.clone();
            Some(ObjectRef::<DeserializeGuard<AgentDeployment>>::new(&name).within(&namespace))
        })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|_| async {})
        .await;
    Ok(())
}
