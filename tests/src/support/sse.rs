//! Server-Sent Events as the tests read them: a turn's stream, event by
//! event.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::Value;

/// One event of a turn's stream.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: String,
    pub id: String,
    pub data: Value,
}

/// A response read event by event.
pub struct Events {
    pub status: u16,
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = Event> + Send>>,
}

impl Events {
    /// Sends `request` (asking for a stream); its events, or, when the
    /// answer is not a stream, its status and JSON body.
    pub async fn open(request: reqwest::RequestBuilder) -> Result<Self, (u16, Value)> {
        let response = request
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("the request");
        let status = response.status().as_u16();
        let is_stream = response
            .headers()
            .get("content-type")
            .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
        if !is_stream {
            return Err((status, response.json().await.unwrap_or(Value::Null)));
        }
        let stream = response.bytes_stream().eventsource().map(|event| {
            let event = event.expect("a well-formed event");
            Event {
                name: event.event,
                id: event.id,
                data: serde_json::from_str(&event.data).expect("JSON data"),
            }
        });
        Ok(Self {
            status,
            stream: Box::pin(stream),
        })
    }

    /// The next event; `None` once the stream ended. Panics when none
    /// comes within 30 s.
    pub async fn next(&mut self) -> Option<Event> {
        tokio::time::timeout(Duration::from_secs(30), self.stream.next())
            .await
            .expect("an event or the end within 30 s")
    }

    /// The events up to the end.
    pub async fn rest(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// Sends a turn asking for a stream; the answer's status, and its events
/// (read to the end when it is a stream), each handed to `each` as it
/// arrives.
pub async fn stream_turn_with(
    http: &reqwest::Client,
    url: &str,
    body: Value,
    mut each: impl AsyncFnMut(&Event),
) -> (u16, Vec<Event>, Value) {
    let mut stream = match Events::open(http.post(url).json(&body)).await {
        Ok(stream) => stream,
        Err((status, body)) => return (status, Vec::new(), body),
    };
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        each(&event).await;
        events.push(event);
    }
    (stream.status, events, Value::Null)
}

pub async fn stream_turn(
    http: &reqwest::Client,
    url: &str,
    body: Value,
) -> (u16, Vec<Event>, Value) {
    stream_turn_with(http, url, body, async |_| {}).await
}

pub fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

/// The text of the stream's deltas, joined.
pub fn streamed_text(events: &[Event]) -> String {
    events
        .iter()
        .filter(|e| e.name == "delta")
        .map(|e| e.data["text"].as_str().expect("delta text"))
        .collect()
}
