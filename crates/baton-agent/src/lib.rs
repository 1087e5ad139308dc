//! The reference agent, behind the agent contract the sidecar calls:
//! `POST /v1/turn` with `{session, tenant, turnSeq, input, state,
//! workspaceDir}` → `{reply, state}`.
//!
//! It keeps nothing in the process: its memory is the `state` the sidecar
//! passes in and stores back, and its files are in `workspaceDir`, which the
//! sidecar materialises before the call and snapshots after it. Every turn
//! appends a line to `notes.md` there. A configurable delay and failure rate
//! (and `/sleep <ms>`, `/fail`) let tests make long and failing turns.
//!
//! To a caller that accepts `text/event-stream` (the sidecar does) it
//! streams its reply (contract version 2) when asked with `/stream <chunks>
//! <ms> [text]`, or every reply when configured to (`baton dev` is): a
//! `progress` event, the reply in `delta` pieces, then `final`.
//! `/stream-cut` stops before `final`, as an agent that crashed would.
#![forbid(unsafe_code)]

pub mod memory;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::convert::Infallible;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use baton_api::agent_contract::stream;
use futures::StreamExt;

use memory::{Memory, Streaming, respond};
use serde_json::value::RawValue;

pub use baton_api::agent_contract::{TurnRequest, TurnResponse};

#[derive(Clone, Debug, Default)]
pub struct AgentConfig {
    /// Do not append turns to `notes.md`: an echo-speed agent for
    /// benchmarks, whose turns change no file.
    pub no_notes: bool,
    /// Added to every turn.
    pub delay: Duration,
    /// Share of turns that fail (0.0–1.0), decided by a seeded generator so a
    /// run can be replayed.
    pub failure_rate: f64,
    pub seed: u64,
    /// Stream every reply in this many pieces to a caller that accepts a
    /// stream; 0 streams only the replies asked for with `/stream`.
    pub stream_chunks: usize,
    /// The pause between two streamed pieces.
    pub stream_interval: Duration,
}

struct Agent {
    config: AgentConfig,
    rng: AtomicU64,
    /// Turns this process ran (each call of the contract), for tests that
    /// check a retried turn never runs the agent twice.
    turns_run: AtomicU64,
    /// Streamed answers whose caller closed the request before the last
    /// event, for tests of an interrupt: the sidecar must close it.
    streams_abandoned: Arc<AtomicU64>,
}

impl Agent {
    /// Deterministic per-process draw in [0, 1).
    fn draw(&self) -> f64 {
        let mut x = self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (x ^ (x >> 31)) as f64 / u64::MAX as f64
    }
}

/// Errors the agent answers with, as `{error}` and a status.
struct AgentError(StatusCode, String);

impl IntoResponse for AgentError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

/// `root/name`, refusing absolute paths and `..` (a hostile `/write`).
fn inside(root: &Path, name: &str) -> Result<PathBuf, AgentError> {
    let relative = Path::new(name);
    let plain = !name.is_empty()
        && relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(AgentError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("file name {name:?} must be a plain relative path"),
        ));
    }
    Ok(root.join(relative))
}

fn io_error(e: std::io::Error) -> AgentError {
    AgentError(StatusCode::INTERNAL_SERVER_ERROR, format!("workspace: {e}"))
}

/// Runs the turn in its own task: like many real agents (a model call in
/// flight), it finishes what it started even when the caller stopped
/// waiting, and writes its files late. Tests rely on that to check that a
/// late writer cannot touch a later turn's files.
async fn turn(
    State(agent): State<Arc<Agent>>,
    headers: HeaderMap,
    Json(req): Json<TurnRequest<Box<RawValue>>>,
) -> Result<Response, AgentError> {
    let (answer, asked) = tokio::spawn(run_turn(agent.clone(), req))
        .await
        .unwrap_or_else(|e| Err(AgentError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())))?;
    let configured = (agent.config.stream_chunks > 0).then_some(Streaming {
        chunks: agent.config.stream_chunks,
        interval: agent.config.stream_interval,
        cut: false,
    });
    Ok(match asked.or(configured) {
        Some(plan) if accepts_stream(&headers) => {
            stream_answer(answer, plan, agent.streams_abandoned.clone()).into_response()
        }
        _ => Json(answer).into_response(),
    })
}

/// Whether the caller takes a streamed answer.
fn accepts_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains(stream::CONTENT_TYPE))
}

/// The answer as contract version 2 events: `progress`, the reply in
/// pieces, `final` (left out by `/stream-cut`).
fn stream_answer(
    answer: TurnResponse<Memory>,
    plan: Streaming,
    abandoned: Arc<AtomicU64>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let json = |value: serde_json::Value| Event::default().data(value.to_string());
    let mut events = vec![json(serde_json::json!({ "name": "thinking" })).event(stream::PROGRESS)];
    events.extend(
        pieces(&answer.reply, plan.chunks)
            .into_iter()
            .map(|text| json(serde_json::json!({ "text": text })).event(stream::DELTA)),
    );
    if !plan.cut {
        let final_answer = serde_json::to_value(&answer).unwrap_or_default();
        events.push(json(final_answer).event(stream::FINAL));
    }
    let interval = plan.interval;
    let mut unsent = Unsent {
        left: events.len(),
        abandoned,
    };
    Sse::new(
        futures::stream::iter(events.into_iter().enumerate())
            .then(move |(i, event)| async move {
                // A pause before each piece after the first, as a model writes.
                if i > 1 && !interval.is_zero() {
                    tokio::time::sleep(interval).await;
                }
                Ok(event)
            })
            .inspect(move |_| unsent.sent_one()),
    )
}

/// Counts a streamed answer dropped (its caller went away) before its last
/// event was sent.
struct Unsent {
    left: usize,
    abandoned: Arc<AtomicU64>,
}

impl Unsent {
    /// A method, so that the closure calling it owns all of `self` (a
    /// closure that names only a field captures only the field).
    fn sent_one(&mut self) {
        self.left = self.left.saturating_sub(1);
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if self.left > 0 {
            self.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `text` in `n` pieces of about equal length (in characters).
fn pieces(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let size = chars.len().div_ceil(n.max(1)).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

async fn run_turn(
    agent: Arc<Agent>,
    req: TurnRequest<Box<RawValue>>,
) -> Result<(TurnResponse<Memory>, Option<Streaming>), AgentError> {
    let memory: Memory = match req.state.get() {
        "null" => Memory::default(),
        state => serde_json::from_str(state).map_err(|e| {
            AgentError(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("state is not this agent's: {e}"),
            )
        })?,
    };
    agent.turns_run.fetch_add(1, Ordering::Relaxed);
    let outcome = respond(&memory, &req.input);
    let delay = agent.config.delay + outcome.delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if outcome.fail || (agent.config.failure_rate > 0.0 && agent.draw() < agent.config.failure_rate)
    {
        return Err(AgentError(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the agent failed this turn (on purpose)".into(),
        ));
    }

    let dir = &req.workspace_dir;
    // The sidecar creates the directory before the call; a caller without
    // a sidecar (`baton bench --direct-agent`) may not have. Only a turn
    // that writes needs it: an echo-speed turn touches no file at all.
    if !outcome.files.is_empty() || !agent.config.no_notes {
        tokio::fs::create_dir_all(dir).await.map_err(io_error)?;
    }
    for (name, content) in &outcome.files {
        let path = inside(dir, name)?;
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(io_error)?;
        }
        tokio::fs::write(&path, content).await.map_err(io_error)?;
    }
    if !agent.config.no_notes {
        let notes = dir.join("notes.md");
        let mut text = tokio::fs::read_to_string(&notes).await.unwrap_or_default();
        text.push_str(&format!("- turn {}: {}\n", req.turn_seq, req.input.trim()));
        tokio::fs::write(&notes, text).await.map_err(io_error)?;
    }

    tracing::debug!(session = %req.session, tenant = %req.tenant, turn_seq = req.turn_seq, "turn");
    Ok((
        TurnResponse {
            reply: outcome.reply,
            state: outcome.memory,
        },
        outcome.stream,
    ))
}

/// The agent's HTTP routes.
pub fn router(config: AgentConfig) -> Router {
    let agent = Arc::new(Agent {
        rng: AtomicU64::new(config.seed),
        turns_run: AtomicU64::new(0),
        streams_abandoned: Arc::default(),
        config,
    });
    Router::new()
        .route(baton_api::agent_contract::TURN_PATH, post(turn))
        .route(
            "/v1/stats",
            get(|State(agent): State<Arc<Agent>>| async move {
                Json(serde_json::json!({
                    "turnsRun": agent.turns_run.load(Ordering::Relaxed),
                    "streamsAbandoned": agent.streams_abandoned.load(Ordering::Relaxed),
                }))
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(16 * 1024 * 1024))
        .with_state(agent)
}

/// Serves the agent on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, config: AgentConfig) -> std::io::Result<()> {
    baton_serve::serve(
        baton_serve::no_delay(listener),
        router(config),
        baton_serve::Limits::DEFAULT,
        std::future::pending(),
    )
    .await;
    Ok(())
}
