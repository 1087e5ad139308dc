//! Streamed turns (`baton bench --stream`): what a client of a streaming
//! chat product measures, read from the answer's events as they arrive.
//! From Baton: `turn`, `delta`s, then `committed` or `failed` (README,
//! "Streaming"); from an agent called directly (the baseline): `delta`s
//! then `final` (the agent contract, version 2).

use std::time::{Duration, Instant};

use baton_api::agent_contract::stream;
use eventsource_stream::Eventsource as _;
use futures::StreamExt as _;
use http_body_util::BodyDataStream;
use serde::Deserialize;
use serde_json::Value;

/// The reply a streamed turn asks the reference agent for: exactly
/// `chunks` pieces (of 8 characters, or more when the turn's name needs
/// them), `interval_ms` apart, unique to the turn.
pub fn input(session: &str, seq: u64, chunks: u32, interval_ms: u32) -> String {
    let mut text = format!("turn {seq} of {session}:");
    let chunks = chunks.max(1) as usize;
    let piece = text.len().div_ceil(chunks).max(8);
    while text.len() < piece * chunks {
        text.push_str(" streamed");
    }
    text.truncate(piece * chunks);
    if text.ends_with(' ') {
        // The agent trims its command's text.
        text.pop();
        text.push('.');
    }
    format!("/stream {chunks} {interval_ms} {text}")
}

/// The reply text of an [`input`].
pub fn text_of(input: &str) -> &str {
    input.splitn(4, ' ').nth(3).unwrap_or(input)
}

/// The turn `streamed` (an [`input`]) asks for, unstreamed: as long, the
/// same reply, answered at once.
pub fn unstreamed(streamed: &str, chunks: u32, interval_ms: u32) -> String {
    format!(
        "/sleep {} {}",
        u64::from(chunks) * u64::from(interval_ms),
        text_of(streamed)
    )
}

/// How a streamed answer ended.
#[derive(Debug)]
pub enum End {
    /// Baton's `committed` event: its `status` (OK, DUPLICATE) and reply.
    Committed { status: String, reply: String },
    /// Baton's `failed` event: its outcome, and whether it says to retry
    /// (`retryAfterMs`, or BUSY).
    Failed {
        status: String,
        retry: bool,
        error: String,
    },
    /// The agent's `final` event (direct mode): its reply and state.
    Final { reply: String, state: Value },
    /// The stream broke or broke the rules: the turn's fate is unknown.
    Broken(String),
}

/// One streamed answer, as its client saw it.
#[derive(Debug)]
pub struct Streamed {
    /// From sending the request to the first `delta`.
    pub first_delta: Option<Duration>,
    pub deltas: u64,
    /// The deltas joined: the reply as the client showed it.
    pub text: String,
    /// Whether Baton's first event was `turn` (direct mode: true).
    pub opened: bool,
    pub end: End,
}

#[derive(Deserialize)]
struct Ended {
    status: Option<String>,
    #[serde(default)]
    reply: String,
    #[serde(default)]
    error: Value,
    #[serde(rename = "retryAfterMs")]
    retry_after_ms: Option<u64>,
}

#[derive(Deserialize)]
struct Final {
    reply: String,
    state: Value,
}

/// Reads a streamed answer to its end. `started` is when the request was
/// sent; `from_baton` picks which events end it.
pub async fn read(
    body: hyper::body::Incoming,
    started: Instant,
    from_baton: bool,
    mut on_first_delta: Option<tokio::sync::oneshot::Sender<()>>,
) -> Streamed {
    let mut out = Streamed {
        first_delta: None,
        deltas: 0,
        text: String::new(),
        opened: !from_baton,
        end: End::Broken("the stream ended without a last event".into()),
    };
    let mut events = std::pin::pin!(BodyDataStream::new(body).eventsource());
    let mut first = true;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                out.end = End::Broken(format!("the stream broke: {e}"));
                return out;
            }
        };
        if std::mem::take(&mut first) && event.event == "turn" {
            out.opened = true;
            continue;
        }
        match (event.event.as_str(), from_baton) {
            (stream::DELTA, _) => match serde_json::from_str::<stream::Delta>(&event.data) {
                Ok(delta) => {
                    out.first_delta.get_or_insert_with(|| started.elapsed());
                    if let Some(tell) = on_first_delta.take() {
                        let _ = tell.send(());
                    }
                    out.deltas += 1;
                    out.text.push_str(&delta.text);
                }
                Err(e) => {
                    out.end = End::Broken(format!("a delta's data: {e}"));
                    return out;
                }
            },
            (stream::PROGRESS, _) => {}
            ("committed" | "failed", true) => {
                out.end = match serde_json::from_str::<Ended>(&event.data) {
                    Ok(ended) if event.event == "committed" => End::Committed {
                        status: ended.status.unwrap_or_default(),
                        reply: ended.reply,
                    },
                    Ok(ended) => {
                        let status = ended.status.unwrap_or_else(|| "?".into());
                        End::Failed {
                            retry: ended.retry_after_ms.is_some() || status == "BUSY",
                            status,
                            error: ended.error.to_string(),
                        }
                    }
                    Err(e) => End::Broken(format!("the {} event's data: {e}", event.event)),
                };
                return out;
            }
            (stream::FINAL, false) => {
                out.end = match serde_json::from_str::<Final>(&event.data) {
                    Ok(f) => End::Final {
                        reply: f.reply,
                        state: f.state,
                    },
                    Err(e) => End::Broken(format!("the final event's data: {e}")),
                };
                return out;
            }
            (other, _) => {
                out.end = End::Broken(format!("an unexpected {other:?} event"));
                return out;
            }
        }
    }
    out
}

/// Whether what the client was shown is the reply that counts: the deltas
/// joined equal the committed (or final) reply. A duplicate's stored answer
/// is not streamed again, so it has no deltas to compare.
pub fn shown_is_reply(streamed: &Streamed) -> Result<(), String> {
    let reply = match &streamed.end {
        End::Committed { status, .. } if status == "DUPLICATE" => return Ok(()),
        End::Committed { reply, .. } | End::Final { reply, .. } => reply,
        _ => return Ok(()),
    };
    if !streamed.opened {
        return Err("the stream did not open with a turn event".into());
    }
    if streamed.text != *reply {
        return Err(format!(
            "the deltas joined ({} chars) are not the reply ({} chars)",
            streamed.text.chars().count(),
            reply.chars().count()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_ask_for_the_chunks_and_differ_by_turn() {
        let a = input("s-1", 3, 100, 5);
        assert!(a.starts_with("/stream 100 5 turn 3 of s-1:"), "{a}");
        assert_ne!(a, input("s-1", 4, 100, 5));
        // The reference agent reads each back as that plan and that reply,
        // in exactly that many pieces.
        for (session, chunks) in [
            ("s-1", 100),
            ("a-rather-long-session-id-0042", 3),
            ("s", 1),
            ("s-7", 7),
        ] {
            let asked = input(session, 12, chunks, 0);
            let text = text_of(&asked);
            let out = baton_agent::memory::respond(&Default::default(), &asked);
            assert_eq!(out.reply, text, "{asked}");
            assert_eq!(out.stream.unwrap().chunks, chunks as usize);
            assert_eq!(text.len() % chunks as usize, 0, "{asked}");
            assert!(text.len() >= 8 * chunks as usize, "{asked}");
        }
    }
}
