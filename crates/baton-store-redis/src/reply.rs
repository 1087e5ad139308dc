//! Reading the scripts' replies and the idempotency records they return.

use bytes::Bytes;
use redis::Value;

use crate::errors::corrupt;
use baton_session::model::{BeginRequest, TurnResult};
use baton_session::store::StoreResult;

/// Reads the script replies: arrays of bulk strings and integers.
pub(super) struct Reply(pub(super) Vec<Value>);

impl Reply {
    pub(super) fn text(&self, i: usize) -> StoreResult<String> {
        match self.0.get(i) {
            Some(Value::BulkString(b)) => {
                String::from_utf8(b.clone()).map_err(|_| corrupt("non-UTF-8 text"))
            }
            Some(Value::SimpleString(s)) => Ok(s.clone()),
            Some(Value::Int(n)) => Ok(n.to_string()),
            other => Err(corrupt(format!("expected text at {i}, got {other:?}"))),
        }
    }

    pub(super) fn num(&self, i: usize) -> StoreResult<u64> {
        match self.0.get(i) {
            Some(Value::Int(n)) => u64::try_from(*n).map_err(|_| corrupt("negative number")),
            _ => self
                .text(i)?
                .parse()
                .map_err(|_| corrupt(format!("expected a number at {i}"))),
        }
    }

    pub(super) fn int(&self, i: usize) -> StoreResult<i64> {
        match self.0.get(i) {
            Some(Value::Int(n)) => Ok(*n),
            _ => self
                .text(i)?
                .parse()
                .map_err(|_| corrupt(format!("expected an integer at {i}"))),
        }
    }

    pub(super) fn bytes(&self, i: usize) -> StoreResult<Option<Bytes>> {
        match self.0.get(i) {
            Some(Value::BulkString(b)) => Ok(Some(Bytes::from(b.clone()))),
            Some(Value::Nil) | None => Ok(None),
            other => Err(corrupt(format!("expected bytes at {i}, got {other:?}"))),
        }
    }
}

/// A stored result is `"<version>\n<reply>"`.
/// Reads an idempotency record, `"<turnSeq>\n<version>\n<reply>"`; `None`
/// when its ring slot holds another turn's record (`turn_seq` left the
/// window).
pub(super) fn parse_result(turn_seq: u64, stored: &[u8]) -> StoreResult<Option<TurnResult>> {
    let mut parts = stored.splitn(3, |b| *b == b'\n');
    let mut number = |what: &str| {
        parts
            .next()
            .and_then(|n| std::str::from_utf8(n).ok())
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| corrupt(format!("idempotency record: {what}")))
    };
    let stored_seq = number("turnSeq")?;
    let version = number("version")?;
    let reply = parts
        .next()
        .ok_or_else(|| corrupt("idempotency record without a reply"))?;
    Ok((stored_seq == turn_seq).then(|| TurnResult {
        turn_seq,
        version,
        reply: Bytes::copy_from_slice(reply),
    }))
}

/// Whether the record of `turn_seq` was committed with another input than
/// `req`'s, by its digest field (`"<turnSeq>:<digest>"`). A field of
/// another turnSeq, or none (a build that predates it wrote the record),
/// proves nothing: the record is answered as before.
pub(super) fn reused(turn_seq: u64, stored: Option<Bytes>, req: &BeginRequest) -> bool {
    let (Some(stored), Some(asked)) = (stored, &req.input_digest) else {
        return false;
    };
    let prefix = format!("{turn_seq}:");
    stored
        .strip_prefix(prefix.as_bytes())
        .is_some_and(|digest| digest != asked.as_bytes())
}
