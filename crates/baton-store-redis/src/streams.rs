//! Turn streams ([`baton_session::turn_stream`]) on Redis: a Redis Stream
//! per `(session, turnSeq)`, under the session's hash tag (one slot with
//! the rest of the session on a cluster), whose entry ids are the events'
//! `<attempt>-<n>`. Redis refuses an entry id at or below the stream's
//! top, which is the rule that an older attempt adds nothing once a newer
//! one has written; `append_stream.lua` makes a batch all-or-nothing.
//!
//! Readers poll with `XRANGE` from their last id rather than block with
//! `XREAD BLOCK`: a blocking read would hold the connection every turn of
//! the replica shares, and readers are rare (a client that came back on
//! another replica).

use baton_session::ids::SessionKey;
use baton_session::store::StoreResult;
use baton_session::turn_stream::{
    EventId, EventKind, MAX_READ, STREAM_TTL, StreamEvent, TurnStreamReader, TurnStreams,
    parse_event_id,
};

use crate::errors::{corrupt, millis, unavailable};
use crate::store::RedisStore;

impl TurnStreams for RedisStore {
    async fn append_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        events: &[StreamEvent],
    ) -> StoreResult<bool> {
        if events.is_empty() {
            return Ok(true);
        }
        let stream = self.space.session(key).stream(turn_seq);
        let mut call = self.scripts.append_stream.key(stream);
        call.arg(millis(STREAM_TTL));
        for event in events {
            call.arg(event.id())
                .arg(event.kind.as_str())
                .arg(&event.data);
        }
        let appended: i64 = call
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(appended == 1)
    }
}

impl TurnStreamReader for RedisStore {
    async fn want_events(&self, key: &SessionKey, turn_seq: u64) -> StoreResult<bool> {
        let keys = self.space.session(key);
        let marked: i64 = self
            .scripts
            .want
            .key(&keys.state)
            .arg(turn_seq)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        Ok(marked == 1)
    }

    async fn read_events(
        &self,
        key: &SessionKey,
        turn_seq: u64,
        after: Option<EventId>,
        limit: usize,
    ) -> StoreResult<Vec<StreamEvent>> {
        let stream = self.space.session(key).stream(turn_seq);
        // `(` excludes the id itself (Redis 6.2 and later).
        let start = after.map_or_else(|| "-".to_owned(), |(a, n)| format!("({a}-{n}"));
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&stream)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(limit.clamp(1, MAX_READ))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(unavailable)?;
        entries
            .into_iter()
            .map(|(id, fields)| event_of(&stream, &id, fields))
            .collect()
    }
}

/// An entry as `append_stream.lua` writes it: `k <kind> d <data>`.
fn event_of(stream: &str, id: &str, fields: Vec<String>) -> StoreResult<StreamEvent> {
    let bad = |what: &str| corrupt(format!("{stream} entry {id}: {what}"));
    let (attempt, n) = parse_event_id(id).ok_or_else(|| bad("not an event id"))?;
    let [k, kind, d, data]: [String; 4] =
        fields.try_into().map_err(|_| bad("not the fields k, d"))?;
    if k != "k" || d != "d" {
        return Err(bad("not the fields k, d"));
    }
    let kind = EventKind::parse(&kind).ok_or_else(|| bad("an unknown kind"))?;
    Ok(StreamEvent {
        kind,
        attempt,
        n,
        data,
    })
}
