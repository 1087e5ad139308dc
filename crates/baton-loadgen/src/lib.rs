//! `baton bench`: drives turns against a Baton URL (a sidecar or the
//! `baton dev` front door) — or, for the baseline, straight against an
//! agent — and reports turns/s, latency percentiles and outcome counts.
//!
//! Every session belongs to one client task, and every turn carries an
//! explicit `turnSeq`, so a turn retried after a 503 or a dropped
//! connection can never run twice: the retry gets the stored result
//! (DUPLICATE). `--verify` then checks each session's state against the
//! acknowledged turns, through the reference agent's hash chain of inputs.
#![forbid(unsafe_code)]

mod http_client;
pub mod streamed;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use baton_agent::memory::{Memory, chain};
use baton_api::validate::parse_duration;
use http::Uri;
use http_client::Http;
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn duration(value: &str) -> Result<Duration, String> {
    parse_duration(value)
}

fn rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.1..=1_000_000.0).contains(&r) => Ok(r),
        _ => Err(format!(
            "{value:?} is not a rate: turns per second between 0.1 and 1000000"
        )),
    }
}

/// What the turns ask the agent to do, by weight.
#[derive(Clone, Debug)]
pub struct Mix(Vec<(TurnKind, u32)>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TurnKind {
    /// A plain message.
    Chat,
    /// "my name is ..." (state change).
    Name,
    /// `/write` a file (a workspace change).
    Write,
}

fn mix(value: &str) -> Result<Mix, String> {
    let mut parts = Vec::new();
    for entry in value.split(',') {
        let (kind, weight) = entry
            .split_once(':')
            .ok_or_else(|| format!("{entry:?}: expected kind:weight, e.g. chat:90"))?;
        let kind = match kind.trim() {
            "chat" => TurnKind::Chat,
            "name" => TurnKind::Name,
            "write" => TurnKind::Write,
            other => return Err(format!("{other:?}: kinds are chat, name, write")),
        };
        let weight: u32 = weight
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?}: weight must be a whole number"))?;
        parts.push((kind, weight));
    }
    if parts.iter().map(|(_, w)| w).sum::<u32>() == 0 {
        return Err("the weights must not all be 0".into());
    }
    Ok(Mix(parts))
}

impl Mix {
    /// The kind of turn `n` of a session, spread by weight.
    fn pick(&self, n: u64) -> TurnKind {
        let total: u32 = self.0.iter().map(|(_, w)| w).sum();
        let mut at = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33) as u32 % total;
        for (kind, w) in &self.0 {
            if at < *w {
                return *kind;
            }
            at -= w;
        }
        TurnKind::Chat
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Baton's turn API (a sidecar, or the `baton dev` front door).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,

    /// Call this agent directly through the agent contract instead (no
    /// Baton: state kept by the load generator), as a baseline.
    #[arg(long, conflicts_with = "verify")]
    pub direct_agent: Option<String>,

    #[arg(long, default_value_t = 100)]
    pub sessions: usize,

    /// Concurrent clients (each owns sessions of its own).
    #[arg(long, default_value_t = 10)]
    pub concurrency: usize,

    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub duration: Duration,

    /// Start turns at this many per second in all, spread evenly over the
    /// clients, instead of as fast as answers come back. Two setups then
    /// compare at the same load (CPU per turn depends on it); a client
    /// that falls behind catches up, and the report shows the rate reached.
    #[arg(long, value_parser = rate)]
    pub rate: Option<f64>,

    /// Turn mix, `kind:weight` for chat, name, write.
    #[arg(long, default_value = "chat:90,name:5,write:5", value_parser = mix)]
    pub mix: Mix,

    /// Session ids are `<prefix>-<n>`; default: a fresh random prefix.
    #[arg(long)]
    pub session_prefix: Option<String>,

    /// Tenant header (authentication off) ...
    #[arg(long)]
    pub tenant: Option<String>,

    /// ... or a bearer token.
    #[arg(long, env = "BATON_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Give up on a turn after this many retries (503s, dropped connections).
    #[arg(long, default_value_t = 200)]
    pub max_retries: u32,

    /// Streamed turns: each asks the reference agent to stream its reply
    /// in `--stream-chunks` pieces and reads the answer as an event stream
    /// (`Accept: text/event-stream`), measuring the time to the first
    /// delta as well. With `--direct-agent`: the agent's own stream, the
    /// baseline. `--mix` does not apply.
    #[arg(long)]
    pub stream: bool,

    /// With `--stream`: a second client rejoins each turn from its start as
    /// soon as its first delta arrives (`GET …/turns/{turnSeq}/stream`), as
    /// a dashboard or another tab would, so that every turn's stream is kept
    /// in the store; checked like the first client's.
    #[arg(long, requires = "stream")]
    pub follow: bool,

    /// The turns `--stream` would send, unstreamed: each takes as long
    /// (`/sleep` for chunks × interval) and its same reply comes at once,
    /// as JSON. The baseline for what streaming costs the stores.
    #[arg(long, conflicts_with = "stream")]
    pub stream_baseline: bool,

    /// Pieces each streamed reply comes in (about 8 characters each).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub stream_chunks: u32,

    /// Milliseconds the agent waits between two pieces (as a model writes).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=10000))]
    pub stream_interval_ms: u32,

    /// After the run, check that every session holds exactly its acknowledged turns
    /// (and, with `--stream`, that every streamed turn showed its client exactly
    /// the reply that committed).
    #[arg(long)]
    pub verify: bool,

    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub target: String,
    pub seconds: f64,
    pub sessions: usize,
    pub concurrency: usize,
    /// The rate turns were started at (`--rate`), if one was asked for.
    pub target_turns_per_second: Option<f64>,
    /// Turns acknowledged (OK, or DUPLICATE on a retry of a committed one).
    pub acknowledged: u64,
    pub turns_per_second: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    /// Final answers by outcome (after retries).
    pub outcomes: BTreeMap<String, u64>,
    /// Retries by the answer that caused them.
    pub retries: BTreeMap<String, u64>,
    /// Turns that ended without being acknowledged.
    pub failed: u64,
    pub verified_sessions: Option<usize>,
    /// Sessions not verified because one of their turns failed.
    pub unverified_sessions: usize,
    /// Sessions whose state does not hold exactly their acknowledged turns.
    pub verify_errors: Vec<String>,
    /// Streamed turns (`--stream`).
    pub stream: Option<StreamReport>,
}

/// What the clients of streamed turns saw.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamReport {
    pub chunks_per_turn: u32,
    pub interval_ms: u32,
    /// From sending the turn to its first delta.
    pub first_delta_p50_ms: f64,
    pub first_delta_p90_ms: f64,
    pub first_delta_p99_ms: f64,
    /// Deltas received, and per second of the run.
    pub deltas: u64,
    pub deltas_per_second: f64,
    /// Acknowledged turns whose deltas joined were not the committed reply
    /// (for the first client, or for a follower).
    pub shown_not_committed: u64,
    /// `--follow`: turns a second client rejoined, and the deltas it read.
    pub followed_turns: u64,
    pub followed_deltas: u64,
}

/// A client's streamed turns, as they went.
#[derive(Default)]
struct StreamStats {
    first_delta: Vec<Duration>,
    deltas: u64,
    wrong: Vec<String>,
    followed_turns: u64,
    followed_deltas: u64,
}

/// One session as its client knows it.
struct Session {
    id: String,
    /// Its turn API (Baton) or the agent's turn endpoint (direct mode).
    turns: Uri,
    next_seq: u64,
    /// Hash chain of the acknowledged inputs, as the agent computes it.
    chain: String,
    acknowledged: u64,
    /// Direct mode: the state the agent returned last.
    state: Value,
}

struct ClientResult {
    latencies: Vec<Duration>,
    outcomes: BTreeMap<String, u64>,
    retries: BTreeMap<String, u64>,
    failed: u64,
    /// Sessions left out of verification after a turn of unknown fate.
    unverifiable: usize,
    sessions: Vec<Session>,
    stream: StreamStats,
}

fn input_for(kind: TurnKind, session: &str, seq: u64) -> String {
    match kind {
        TurnKind::Chat => format!("hello from {session}, turn {seq}"),
        TurnKind::Name => format!("my name is Bench{seq}"),
        TurnKind::Write => format!("/write turn-{}.txt turn {seq} of {session}", seq % 8),
    }
}

/// How one attempt ended.
enum Attempt {
    Acknowledged(&'static str),
    Retry(String),
    Failed(String),
}

/// A turn as the turn API takes it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TurnBody<'a> {
    input: &'a str,
    turn_seq: u64,
}

/// The parts of the turn API's answer the generator reads.
#[derive(Deserialize)]
struct Answer {
    status: Option<String>,
    #[serde(default)]
    error: Value,
}

struct Client {
    http: Http,
    args: BenchArgs,
    /// Direct mode: the workspace directories the agent is given, removed
    /// when the run ends.
    scratch: tempfile::TempDir,
}

impl Client {
    async fn attempt(
        &self,
        session: &mut Session,
        input: &str,
        stats: &mut StreamStats,
    ) -> Attempt {
        match (self.args.direct_agent.is_some(), self.args.stream) {
            (true, false) => return self.attempt_direct(session, input).await,
            (true, true) => return self.attempt_direct_streamed(session, input, stats).await,
            (false, true) => return self.attempt_streamed(session, input, stats).await,
            (false, false) => {}
        }
        let body = TurnBody {
            input,
            turn_seq: session.next_seq,
        };
        let (status, body) = match self.http.post_json(&session.turns, &body, true).await {
            Ok(answer) => answer,
            Err(e) => return Attempt::Retry(e.label().into()),
        };
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(answer) => answer,
            // The answer was cut off: the turn may have committed, and the
            // same turnSeq tells (DUPLICATE) without running it again.
            Err(_) => return Attempt::Retry("DROPPED".into()),
        };
        let outcome = answer.status.unwrap_or_else(|| "?".into());
        match (status.as_u16(), outcome.as_str()) {
            (200, "OK") => Attempt::Acknowledged("OK"),
            (200, "DUPLICATE") => Attempt::Acknowledged("DUPLICATE"),
            // Draining, no replica, a store restarting, a replica that died
            // mid-request, a lease still held by a turn that was cut off:
            // the same turnSeq is safe to send again.
            (502 | 503, _) | (409, "BUSY") => Attempt::Retry(outcome),
            _ => Attempt::Failed(format!("{status} {outcome}: {}", answer.error)),
        }
    }

    /// A turn through Baton, its answer read as an event stream.
    async fn attempt_streamed(
        &self,
        session: &mut Session,
        input: &str,
        stats: &mut StreamStats,
    ) -> Attempt {
        let body = TurnBody {
            input,
            turn_seq: session.next_seq,
        };
        let started = Instant::now();
        let answer = match self.http.post_stream(&session.turns, &body, true).await {
            Ok(answer) => answer,
            Err(e) => return Attempt::Retry(e.label().into()),
        };
        let status = answer.status();
        if status != http::StatusCode::OK {
            // Refused before the turn started (BUSY, DRAINING...): JSON.
            let body = http_body_util::BodyExt::collect(answer.into_body())
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let outcome = serde_json::from_slice::<Answer>(&body)
                .ok()
                .and_then(|a| a.status)
                .unwrap_or_else(|| "?".into());
            return match (status.as_u16(), outcome.as_str()) {
                (502 | 503, _) | (409, "BUSY") => Attempt::Retry(outcome),
                _ => Attempt::Failed(format!("{status} {outcome}")),
            };
        }
        let (first_delta, follow_now) = tokio::sync::oneshot::channel();
        let (streamed, followed) = tokio::join!(
            streamed::read(answer.into_body(), started, true, Some(first_delta)),
            self.rejoin(session, follow_now),
        );
        self.count(session, &streamed, stats);
        if let Some(followed) = followed {
            stats.followed_turns += 1;
            match followed {
                Ok(f) => {
                    stats.followed_deltas += f.deltas;
                    // The follower's end is the turn's: it must agree.
                    let agrees = match (&f.end, &streamed.end) {
                        (
                            streamed::End::Committed { reply: a, .. },
                            streamed::End::Committed { reply: b, .. },
                        ) => a == b,
                        (streamed::End::Failed { .. }, streamed::End::Failed { .. }) => true,
                        // A connection broke, or the turn's replica stopped
                        // before its end reached the stream (the follower is
                        // told to ask again): nothing to compare.
                        (_, streamed::End::Broken(_)) | (streamed::End::Broken(_), _) => true,
                        _ => false,
                    };
                    if let Err(why) = streamed::shown_is_reply(&f) {
                        stats.wrong.push(format!(
                            "{} turn {} (follower): {why}",
                            session.id, session.next_seq
                        ));
                    } else if !agrees {
                        stats.wrong.push(format!(
                            "{} turn {}: the follower saw {:?}, the client {:?}",
                            session.id, session.next_seq, f.end, streamed.end
                        ));
                    }
                }
                Err(why) => stats.wrong.push(format!(
                    "{} turn {} (follower): {why}",
                    session.id, session.next_seq
                )),
            }
        }
        match streamed.end {
            streamed::End::Committed { status, .. } if status == "OK" => {
                Attempt::Acknowledged("OK")
            }
            streamed::End::Committed { status, .. } if status == "DUPLICATE" => {
                Attempt::Acknowledged("DUPLICATE")
            }
            streamed::End::Failed {
                status,
                retry: true,
                ..
            } => Attempt::Retry(status),
            streamed::End::Failed { status, error, .. } => {
                Attempt::Failed(format!("{status}: {error}"))
            }
            // Cut off mid-stream: the same turnSeq tells (DUPLICATE).
            streamed::End::Broken(_) => Attempt::Retry("DROPPED".into()),
            other => Attempt::Failed(format!("an unexpected end: {other:?}")),
        }
    }

    /// `--follow`: once the turn's first delta is in, rejoins it from its
    /// start on the same URL and reads it to the end. `None` without
    /// `--follow`, or when the turn streamed no delta.
    async fn rejoin(
        &self,
        session: &Session,
        first_delta: tokio::sync::oneshot::Receiver<()>,
    ) -> Option<Result<streamed::Streamed, String>> {
        if !self.args.follow || first_delta.await.is_err() {
            return None;
        }
        let path = format!(
            "/v1/sessions/{}/turns/{}/stream",
            session.id, session.next_seq
        );
        let uri = match http_client::uri("--url", &self.args.url, &path) {
            Ok(uri) => uri,
            Err(e) => return Some(Err(e.to_string())),
        };
        Some(match self.http.get_stream(&uri).await {
            Ok(answer) if answer.status() == http::StatusCode::OK => {
                Ok(streamed::read(answer.into_body(), Instant::now(), true, None).await)
            }
            Ok(answer) => Err(format!("the rejoin answered {}", answer.status())),
            Err(e) => Err(format!("the rejoin: {e}")),
        })
    }

    /// A turn as the agent contract takes it (direct mode: the load
    /// generator keeps the state).
    fn agent_request<'a>(
        &self,
        session: &'a Session,
        input: &str,
    ) -> baton_api::agent_contract::TurnRequest<&'a Value> {
        baton_api::agent_contract::TurnRequest {
            session: session.id.clone(),
            tenant: "bench".into(),
            turn_seq: session.next_seq,
            input: input.to_owned(),
            state: &session.state,
            workspace_dir: self.scratch.path().join(&session.id),
        }
    }

    /// The agent called directly, its answer read as an event stream.
    async fn attempt_direct_streamed(
        &self,
        session: &mut Session,
        input: &str,
        stats: &mut StreamStats,
    ) -> Attempt {
        let req = self.agent_request(session, input);
        let started = Instant::now();
        let answer = match self.http.post_stream(&session.turns, &req, false).await {
            Ok(answer) if answer.status().is_success() => answer,
            Ok(answer) => return Attempt::Failed(format!("agent answered {}", answer.status())),
            Err(e) => return Attempt::Failed(format!("agent: {e}")),
        };
        let streamed = streamed::read(answer.into_body(), started, false, None).await;
        self.count(session, &streamed, stats);
        match streamed.end {
            streamed::End::Final { state, .. } => {
                session.state = state;
                Attempt::Acknowledged("OK")
            }
            other => Attempt::Failed(format!("agent stream: {other:?}")),
        }
    }

    /// Adds a streamed answer to the client's counts.
    fn count(&self, session: &Session, streamed: &streamed::Streamed, stats: &mut StreamStats) {
        stats.first_delta.extend(streamed.first_delta);
        stats.deltas += streamed.deltas;
        if let Err(why) = streamed::shown_is_reply(streamed) {
            stats
                .wrong
                .push(format!("{} turn {}: {why}", session.id, session.next_seq));
        }
    }

    async fn attempt_direct(&self, session: &mut Session, input: &str) -> Attempt {
        let req = self.agent_request(session, input);
        match self.http.post_json(&session.turns, &req, false).await {
            Ok((status, body)) if status.is_success() => {
                match serde_json::from_slice::<baton_api::agent_contract::TurnResponse>(&body) {
                    Ok(r) => {
                        session.state = r.state;
                        Attempt::Acknowledged("OK")
                    }
                    Err(e) => Attempt::Failed(format!("agent answer: {e}")),
                }
            }
            Ok((status, _)) => Attempt::Failed(format!("agent answered {status}")),
            Err(e) => Attempt::Failed(format!("agent: {e}")),
        }
    }

    async fn run(
        self: Arc<Self>,
        mut sessions: Vec<Session>,
        stop: Arc<AtomicBool>,
        mut pace: Option<tokio::time::Interval>,
    ) -> ClientResult {
        let mut result = ClientResult {
            latencies: Vec::new(),
            outcomes: BTreeMap::new(),
            retries: BTreeMap::new(),
            failed: 0,
            unverifiable: 0,
            sessions: Vec::new(),
            stream: StreamStats::default(),
        };
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) && !sessions.is_empty() {
            if let Some(pace) = pace.as_mut() {
                pace.tick().await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
            let idx = i % sessions.len();
            i += 1;
            let session = &mut sessions[idx];
            let seq = session.next_seq;
            let (chunks, interval) = (self.args.stream_chunks, self.args.stream_interval_ms);
            let input = if self.args.stream {
                streamed::input(&session.id, seq, chunks, interval)
            } else if self.args.stream_baseline {
                let streamed = streamed::input(&session.id, seq, chunks, interval);
                streamed::unstreamed(&streamed, chunks, interval)
            } else {
                input_for(self.args.mix.pick(seq), &session.id, seq)
            };
            let started = Instant::now();
            let mut tries = 0;
            let outcome = loop {
                match self.attempt(session, &input, &mut result.stream).await {
                    Attempt::Acknowledged(o) => break Ok(o),
                    Attempt::Failed(why) => break Err(why),
                    Attempt::Retry(why) => {
                        *result.retries.entry(why.clone()).or_default() += 1;
                        tries += 1;
                        if tries > self.args.max_retries {
                            break Err(format!("gave up after {tries} retries ({why})"));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            };
            match outcome {
                Ok(o) => {
                    result.latencies.push(started.elapsed());
                    *result.outcomes.entry(o.to_owned()).or_default() += 1;
                    session.chain = chain(&session.chain, &input);
                    session.acknowledged += 1;
                    session.next_seq += 1;
                }
                Err(why) => {
                    result.failed += 1;
                    let label = why.split(':').next().unwrap_or("FAILED").to_owned();
                    *result.outcomes.entry(label).or_default() += 1;
                    eprintln!("baton bench: {} turn {seq} failed: {why}", session.id);
                    // The turn's fate is unknown: the session leaves the run
                    // and is not verified, so verification stays exact.
                    result.unverifiable += 1;
                    sessions.swap_remove(idx);
                }
            }
        }
        result.sessions.extend(sessions);
        result
    }
}

/// The clock client `n` of `clients` starts its turns by at `rate` turns/s
/// in all: each ticks every `clients / rate` seconds, the clients offset
/// from each other so that turns arrive evenly rather than in bursts. A
/// client behind its clock (a slow answer) starts its late turns at once,
/// so the rate holds while the target keeps up.
fn pacing(rate: f64, clients: usize, n: usize) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(clients as f64 / rate);
    let offset = period.mul_f64(n as f64 / clients as f64);
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + offset, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    interval
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1000.0
}

/// Runs the benchmark and returns its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(args.sessions > 0, "--sessions must be at least 1");
    anyhow::ensure!(
        (1..=10_000).contains(&args.concurrency),
        "--concurrency must be between 1 and 10000"
    );
    let prefix = args
        .session_prefix
        .clone()
        .unwrap_or_else(|| format!("bench-{:08x}", rand::random::<u32>()));
    let http = Http::new(
        args.concurrency,
        args.tenant.as_deref(),
        args.token.as_deref(),
    )?;
    let client = Arc::new(Client {
        http,
        args: args.clone(),
        scratch: tempfile::tempdir().context("scratch directory")?,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let direct_turns = match &args.direct_agent {
        Some(agent) => Some(http_client::uri(
            "--direct-agent",
            agent,
            baton_api::agent_contract::TURN_PATH,
        )?),
        None => None,
    };
    let mut per_client: Vec<Vec<Session>> = (0..args.concurrency).map(|_| Vec::new()).collect();
    for n in 0..args.sessions {
        let id = format!("{prefix}-{n}");
        let turns = match &direct_turns {
            Some(uri) => uri.clone(),
            None => http_client::uri("--url", &args.url, &format!("/v1/sessions/{id}/turns"))?,
        };
        per_client[n % args.concurrency].push(Session {
            id,
            turns,
            next_seq: 1,
            chain: String::new(),
            acknowledged: 0,
            state: Value::Null,
        });
    }
    let started = Instant::now();
    let tasks: Vec<_> = per_client
        .into_iter()
        .enumerate()
        .map(|(n, sessions)| {
            let pace = args.rate.map(|rate| pacing(rate, args.concurrency, n));
            tokio::spawn(client.clone().run(sessions, stop.clone(), pace))
        })
        .collect();
    let bar = indicatif::ProgressBar::new(args.duration.as_secs().max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} s {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(250).min(args.duration)).await;
        bar.set_position(started.elapsed().as_secs());
    }
    stop.store(true, Ordering::Relaxed);
    bar.finish_and_clear();

    let mut report = Report {
        target: args
            .direct_agent
            .clone()
            .unwrap_or_else(|| args.url.clone()),
        sessions: args.sessions,
        concurrency: args.concurrency,
        target_turns_per_second: args.rate,
        ..Report::default()
    };
    let mut latencies = Vec::new();
    let mut sessions = Vec::new();
    let mut stream = StreamStats::default();
    for task in tasks {
        let r = task.await.context("a client task panicked")?;
        latencies.extend(r.latencies);
        for (k, v) in r.outcomes {
            *report.outcomes.entry(k).or_default() += v;
        }
        for (k, v) in r.retries {
            *report.retries.entry(k).or_default() += v;
        }
        report.failed += r.failed;
        report.unverified_sessions += r.unverifiable;
        sessions.extend(r.sessions);
        stream.first_delta.extend(r.stream.first_delta);
        stream.deltas += r.stream.deltas;
        stream.wrong.extend(r.stream.wrong);
        stream.followed_turns += r.stream.followed_turns;
        stream.followed_deltas += r.stream.followed_deltas;
    }
    report.seconds = started.elapsed().as_secs_f64();
    latencies.sort();
    report.acknowledged = latencies.len() as u64;
    report.turns_per_second = report.acknowledged as f64 / report.seconds;
    report.p50_ms = percentile(&latencies, 0.50);
    report.p90_ms = percentile(&latencies, 0.90);
    report.p99_ms = percentile(&latencies, 0.99);
    if args.stream {
        stream.first_delta.sort();
        report.stream = Some(StreamReport {
            chunks_per_turn: args.stream_chunks,
            interval_ms: args.stream_interval_ms,
            first_delta_p50_ms: percentile(&stream.first_delta, 0.50),
            first_delta_p90_ms: percentile(&stream.first_delta, 0.90),
            first_delta_p99_ms: percentile(&stream.first_delta, 0.99),
            deltas: stream.deltas,
            deltas_per_second: stream.deltas as f64 / report.seconds,
            shown_not_committed: stream.wrong.len() as u64,
            followed_turns: stream.followed_turns,
            followed_deltas: stream.followed_deltas,
        });
    }
    if args.verify {
        report.verify_errors = verify(&client, &sessions).await;
        report.verify_errors.extend(stream.wrong);
        report.verified_sessions = Some(sessions.len());
    }
    Ok(report)
}

/// Checks each session's stored state against its acknowledged turns.
async fn verify(client: &Client, sessions: &[Session]) -> Vec<String> {
    let mut errors = Vec::new();
    for s in sessions.iter().filter(|s| s.acknowledged > 0) {
        let path = format!("/v1/sessions/{}?state=true", s.id);
        let uri = match http_client::uri("--url", &client.args.url, &path) {
            Ok(uri) => uri,
            Err(e) => {
                errors.push(format!("{}: {e}", s.id));
                continue;
            }
        };
        let body: Value = match client.http.get(&uri).await {
            Ok((_, body)) => serde_json::from_slice(&body).unwrap_or(Value::Null),
            Err(e) => {
                errors.push(format!("{}: {e}", s.id));
                continue;
            }
        };
        let memory: Memory =
            serde_json::from_value(body["state"]["payload"].clone()).unwrap_or_default();
        if memory.turns != s.acknowledged || memory.history != s.chain {
            errors.push(format!(
                "{}: state holds {} turns (chain {}), {} were acknowledged (chain {})",
                s.id,
                memory.turns,
                short(&memory.history),
                s.acknowledged,
                short(&s.chain)
            ));
        }
    }
    errors
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

impl Report {
    /// A run passes when no turn failed, no streamed turn showed its client
    /// other words than those that committed, and verification found
    /// nothing wrong.
    pub fn passed(&self) -> bool {
        self.failed == 0
            && self.verify_errors.is_empty()
            && self
                .stream
                .as_ref()
                .is_none_or(|s| s.shown_not_committed == 0)
    }
}

/// The report as people read it.
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "target {}\n{} sessions, {} clients, {:.1} s{}\n\nacknowledged turns  {}\nturns/s             {:.0}\nlatency ms          p50 {:.2}  p90 {:.2}  p99 {:.2}\n",
        r.target,
        r.sessions,
        r.concurrency,
        r.seconds,
        r.target_turns_per_second
            .map(|rate| format!(", turns started at {rate} per second"))
            .unwrap_or_default(),
        r.acknowledged,
        r.turns_per_second,
        r.p50_ms,
        r.p90_ms,
        r.p99_ms
    );
    out.push_str("outcomes           ");
    for (k, v) in &r.outcomes {
        out.push_str(&format!(" {k}={v}"));
    }
    out.push_str("\nretries            ");
    if r.retries.is_empty() {
        out.push_str(" none");
    }
    for (k, v) in &r.retries {
        out.push_str(&format!(" {k}={v}"));
    }
    out.push_str(&format!("\nfailed              {}\n", r.failed));
    if let Some(st) = &r.stream {
        out.push_str(&format!(
            "streamed            {} chunks a turn, {} ms apart\nfirst delta ms      p50 {:.2}  p90 {:.2}  p99 {:.2}\ndeltas              {} ({:.0}/s)\nshown, not committed {}\n",
            st.chunks_per_turn,
            st.interval_ms,
            st.first_delta_p50_ms,
            st.first_delta_p90_ms,
            st.first_delta_p99_ms,
            st.deltas,
            st.deltas_per_second,
            st.shown_not_committed
        ));
        if st.followed_turns > 0 {
            out.push_str(&format!(
                "followed            {} turns rejoined, {} deltas read\n",
                st.followed_turns, st.followed_deltas
            ));
        }
    }
    if r.unverified_sessions > 0 {
        out.push_str(&format!(
            "unverified          {} sessions (a turn of unknown fate)\n",
            r.unverified_sessions
        ));
    }
    if let Some(n) = r.verified_sessions {
        if r.verify_errors.is_empty() {
            out.push_str(&format!(
                "verify              {n} sessions hold exactly their acknowledged turns\n"
            ));
        } else {
            out.push_str(&format!(
                "verify              {} of {n} sessions WRONG:\n",
                r.verify_errors.len()
            ));
            for e in r.verify_errors.iter().take(20) {
                out.push_str(&format!("  {e}\n"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_within_bounds() {
        assert_eq!(rate("2500").unwrap(), 2500.0);
        for bad in ["0", "-1", "NaN", "inf", "fast", "2000000"] {
            assert!(rate(bad).unwrap_err().contains("turns per second"), "{bad}");
        }
    }

    /// Paced clients start `rate` turns per second between them, spread
    /// out: never two clients on the same instant, and a client that was
    /// held up catches up on the turns it owes.
    #[tokio::test(start_paused = true)]
    async fn paced_clients_start_turns_evenly_at_the_rate() {
        let (rate, clients) = (200.0, 4);
        let begun = tokio::time::Instant::now();
        let mut starts = Vec::new();
        let paces: Vec<_> = (0..clients).map(|n| pacing(rate, clients, n)).collect();
        for mut pace in paces {
            loop {
                let start = pace.tick().await - begun;
                if start >= Duration::from_secs(1) {
                    break;
                }
                starts.push(start);
            }
        }
        assert_eq!(starts.len(), 200);
        starts.sort();
        let gaps: Vec<_> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| *g == Duration::from_millis(5)),
            "{gaps:?}"
        );

        let mut held_up = pacing(rate, clients, 0);
        held_up.tick().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // 100 ms held up at one turn every 20 ms owes 5 turns: started at
        // once, then one every 20 ms again.
        let late = tokio::time::Instant::now();
        for _ in 0..5 {
            held_up.tick().await;
        }
        assert_eq!(tokio::time::Instant::now(), late);
        held_up.tick().await;
        assert_eq!(
            tokio::time::Instant::now() - late,
            Duration::from_millis(20)
        );
    }

    #[test]
    fn mixes_parse_and_spread_by_weight() {
        let m = mix("chat:3,write:1").unwrap();
        let writes = (0..4000).filter(|n| m.pick(*n) == TurnKind::Write).count();
        assert!((800..1200).contains(&writes), "{writes}");
        assert!(mix("chat").unwrap_err().contains("kind:weight"));
        assert!(mix("shout:1").unwrap_err().contains("kinds are"));
        assert!(mix("chat:0").unwrap_err().contains("not all be 0"));
    }

    #[test]
    fn the_chain_matches_the_reference_agent() {
        // The verification depends on computing the same chain as the agent.
        let mut memory = Memory::default();
        let mut expected = String::new();
        for input in ["hello", "my name is Lin", "/write a.txt x"] {
            memory = baton_agent::memory::respond(&memory, input).memory;
            expected = chain(&expected, input);
        }
        assert_eq!(memory.history, expected);
        assert_eq!(memory.turns, 3);
    }
}
