//! The agent contract: what the sidecar sends the user's agent container for
//! every turn (`POST {BATON_AGENT_URL}/v1/turn`) and what it expects back.
//! An agent in any language implements these two JSON shapes; nothing else.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Path of the agent's turn endpoint.
pub const TURN_PATH: &str = "/v1/turn";

/// One turn, as the agent receives it. `S` is how the state is held: an
/// agent reads it as a `serde_json::Value` (or its own type); the sidecar,
/// which only passes it through, as raw JSON text (`&RawValue`), so a large
/// state is never parsed into a tree and printed back on every turn.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRequest<S = serde_json::Value> {
    pub session: String,
    pub tenant: String,
    pub turn_seq: u64,
    pub input: String,
    /// The session state as the agent last returned it; `null` at first.
    #[serde(default)]
    pub state: S,
    /// The session's workspace, materialised before the call; what the
    /// agent leaves there is stored with the turn.
    pub workspace_dir: PathBuf,
}

/// The agent's answer: the reply for the user and the new session state.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnResponse<S = serde_json::Value> {
    pub reply: String,
    pub state: S,
}
