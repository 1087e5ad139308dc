//! What the pages show, as the server sends it to the browser: plain data
//! built from `baton-views`' types, which compile to wasm as well.

use baton_views::{
    LeaseView, PageKey, ReplicaStatus, ReplicaView, SessionSummary, SessionView, TurnInFlight,
};
use serde::{Deserialize, Serialize};

/// Who is looking, and what they may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads every page.
    Viewer,
    /// Reads, drains replicas and takes over sessions.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// The signed-in user as a page sees it. `csrf` goes into every action
/// form; the server checks it against the cookie's sign-in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Viewer {
    pub name: String,
    pub role: Role,
    pub csrf: String,
    /// Signed in without a token (`baton dev` on loopback): the page says so.
    pub open: bool,
}

impl Viewer {
    pub fn may_act(&self) -> bool {
        self.role == Role::Operator
    }
}

/// The sessions page's filters, as in its URL's query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Filters {
    pub tenant: Option<String>,
    pub prefix: Option<String>,
    pub replica: Option<String>,
    /// Only sessions a turn holds now.
    pub leased: bool,
    /// Keyset pagination: the last row of the previous page.
    pub after: Option<PageKey>,
}

impl Filters {
    /// The query string that brings this page back (`?` included, or empty).
    pub fn query(&self) -> String {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        if let Some(t) = &self.tenant {
            pairs.push(("tenant", t));
        }
        if let Some(p) = &self.prefix {
            pairs.push(("prefix", p));
        }
        if let Some(r) = &self.replica {
            pairs.push(("replica", r));
        }
        if self.leased {
            pairs.push(("leased", "1"));
        }
        if let Some(after) = &self.after {
            pairs.push(("after_tenant", &after.tenant));
            pairs.push(("after_session", &after.session));
        }
        if pairs.is_empty() {
            return String::new();
        }
        let encoded: Vec<String> = pairs
            .into_iter()
            .map(|(k, v)| format!("{k}={}", crate::format::url_encode(v)))
            .collect();
        format!("?{}", encoded.join("&"))
    }
}

/// One row of the sessions table: the ledger's summary and the live lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRow {
    pub summary: SessionSummary,
    pub lease: Option<LeaseView>,
}

/// A page of the sessions table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionsData {
    pub rows: Vec<SessionRow>,
    pub next: Option<PageKey>,
    /// The server's clock when it read them: lease expiries count down
    /// from it.
    pub now_ms: u64,
    /// What could not be read (a replica that did not answer), shown above
    /// the table; the rows are what could.
    pub warnings: Vec<String>,
}

/// One file of a session's workspace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRow {
    pub name: String,
    pub size: u64,
    pub sha256: String,
    /// Its text when it is small UTF-8 (shown on the page), else `None`.
    pub text: Option<String>,
}

/// The session page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionData {
    pub tenant: String,
    pub session: String,
    /// `None` when the store has no state for it (never seen, or expired).
    pub view: Option<SessionView>,
    /// The workspace files of the current version.
    pub files: Vec<FileRow>,
    /// The agent's state, only when asked to reveal it (personal data).
    pub state: Option<String>,
    /// How long the lease's holder has run the turn that holds it (from
    /// the holder's sidecar; `None` when free or when it did not answer).
    pub lease_held_ms: Option<u64>,
    /// What the running turn has streamed so far; `None` when no turn
    /// runs.
    pub output: Option<LiveOutput>,
    pub now_ms: u64,
    pub warnings: Vec<String>,
}

/// The running turn's words so far, from its turn stream: provisional
/// until it commits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveOutput {
    pub turn_seq: u64,
    /// The running attempt (the lease's fence).
    pub attempt: u64,
    /// The replica that runs it (the lease's owner).
    pub owner: String,
    /// Its reply so far, the deltas joined; its end only when long
    /// (`cut`).
    pub text: String,
    pub cut: bool,
    /// The last thing the agent said it was doing (a progress event's
    /// name), if any.
    pub doing: Option<String>,
    /// Events the attempt has streamed; 0: nothing yet (or the agent
    /// answers all at once, and a JSON client asked).
    pub events: u64,
    /// Earlier attempts at this turn whose words were voided (their
    /// replica died or was fenced out).
    pub voided_attempts: u32,
}

/// What the session page's fast live channel sends: the output alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputData {
    pub output: Option<LiveOutput>,
}

impl SessionData {
    pub fn version(&self) -> u64 {
        self.view.as_ref().map_or(0, |v| v.version)
    }
}

/// One interval of a replica's recent past.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatePoint {
    /// The interval's end.
    pub at_ms: u64,
    pub turns_per_s: f64,
    /// `None` for an interval without turns.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// A replica: its heartbeat, and what its sidecar says when asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRow {
    pub view: ReplicaView,
    /// The sidecar's own status (in-flight turns); `None` when it has no
    /// advertised URL or did not answer (then `error` says which).
    pub status: Option<ReplicaStatus>,
    pub error: Option<String>,
    /// Turns/s and latency over the last minutes, oldest first.
    pub recent: Vec<RatePoint>,
}

impl ReplicaRow {
    pub fn draining(&self) -> bool {
        self.status
            .as_ref()
            .map_or(self.view.info.draining, |s| s.draining)
    }

    pub fn in_flight(&self) -> u64 {
        self.status
            .as_ref()
            .map_or(self.view.info.in_flight, |s| s.in_flight)
    }

    pub fn turns(&self) -> &[TurnInFlight] {
        self.status.as_ref().map_or(&[], |s| s.turns.as_slice())
    }

    /// What the page says of it: draining until no turn runs, then drained.
    pub fn state(&self) -> &'static str {
        match (self.draining(), self.in_flight()) {
            (true, 0) => "drained",
            (true, _) => "draining",
            (false, _) => "ready",
        }
    }
}

/// The replicas page.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicasData {
    pub replicas: Vec<ReplicaRow>,
    pub now_ms: u64,
    /// With Kubernetes access: the `AgentDeployment`s.
    pub cluster: Option<ClusterView>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    pub deployments: Vec<DeploymentRow>,
    /// Why they could not be listed.
    pub error: Option<String>,
}

/// An `AgentDeployment` as its status tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRow {
    pub namespace: String,
    pub name: String,
    pub desired: i32,
    pub replicas: i32,
    pub ready: i32,
    pub updated: i32,
    pub current_revision: String,
    pub update_revision: String,
    /// The rollout's phase and step, when one is reported.
    pub rollout: Option<String>,
    pub conditions: Vec<ConditionRow>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionRow {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    pub since_ms: u64,
}

/// One audited action: who did what to what, when, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: u64,
    pub at_ms: u64,
    pub who: String,
    pub action: String,
    pub target: String,
    pub ok: bool,
    pub detail: String,
}

impl Filters {
    /// The filters of a page's query (`value` reads one parameter); empty
    /// values count as absent.
    pub fn from_query(value: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| value(name).filter(|v| !v.is_empty());
        let after = match (get("after_tenant"), get("after_session")) {
            (Some(tenant), Some(session)) => Some(PageKey { tenant, session }),
            _ => None,
        };
        Self {
            tenant: get("tenant"),
            prefix: get("prefix"),
            replica: get("replica"),
            leased: get("leased").is_some_and(|v| v != "0"),
            after,
        }
    }
}
