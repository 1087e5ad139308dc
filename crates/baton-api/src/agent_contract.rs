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

/// Version 2 of the contract: the agent may answer the turn with
/// `Content-Type: text/event-stream` instead of JSON, so its reply reaches
/// the user as it is written. The stream is a series of Server-Sent Events:
///
/// - `event: delta`, `data: {"text": "..."}`: the next piece of the reply;
/// - `event: progress`, `data: {"name": "...", ...}`: something the agent
///   is doing (a tool call starting, say), relayed to the client as is;
/// - `event: final`, `data: {"reply": "...", "state": ...}`: the turn's
///   answer, exactly the version 1 JSON body; the sidecar commits it;
/// - `event: error`, `data: {"message": "..."}`: the agent gave up.
///
/// A stream that ends without `final`, or with `error`, or that carries an
/// event of another name, fails the turn (AGENT_FAILED): nothing commits.
/// Whatever was streamed is provisional until the commit: the client is
/// told which attempt committed. The sidecar asks with
/// `Accept: text/event-stream, application/json`; an agent that answers
/// JSON (version 1) keeps working unchanged.
pub mod stream {
    use serde::{Deserialize, Serialize};

    /// The content type of a streamed answer.
    pub const CONTENT_TYPE: &str = "text/event-stream";
    /// What the sidecar says it accepts from the agent.
    pub const ACCEPT: &str = "text/event-stream, application/json";

    pub const DELTA: &str = "delta";
    pub const PROGRESS: &str = "progress";
    pub const FINAL: &str = "final";
    pub const ERROR: &str = "error";

    /// Longest progress event name, in bytes.
    pub const MAX_PROGRESS_NAME_BYTES: usize = 64;

    /// The data of a `delta` event.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Delta {
        pub text: String,
    }

    /// The data of an `error` event.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct AgentError {
        pub message: String,
    }
}
