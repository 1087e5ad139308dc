//! Redis Cluster slots and the buckets Baton groups sessions into there.
//!
//! On a cluster every key lives in one of 16384 slots, chosen by the CRC16
//! of its hash tag (the part between `{` and `}`), and a script or a
//! transaction may only touch keys of one slot. A session's keys share a
//! tag, so each protocol step stays one script on one node. What Baton
//! keeps *across* sessions (the index of unshipped logs, the known-index
//! watermark) must then live beside the sessions it names, in the same
//! slot, or the commit that indexes a session would need a second node.
//!
//! So on a cluster sessions are grouped into [`BUCKETS`] buckets by the
//! slot of their own id, and every key of a session carries its bucket's
//! tag, not its id: `baton:{<bucket tag>}:<tenant>:<session>:state`. A
//! bucket is one slot, so its index sits in the same slot as its sessions
//! and the commit still writes both in one pipeline; the sweeper reads
//! 1024 indexes, not 16384. Bucket `b` is slot `b * 16`: buckets spread
//! evenly over the slot ranges `redis-cli --cluster create` hands out.
//! A single Redis server keeps the layout it always had (one bucket,
//! tags by session id), so existing data keeps its keys.

use std::sync::OnceLock;

/// Slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// Buckets of sessions on a cluster: one slot in every [`SLOTS_PER_BUCKET`].
pub const BUCKETS: u16 = 1024;

pub const SLOTS_PER_BUCKET: u16 = SLOTS / BUCKETS;

/// The slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the
/// hash tag if the key has a non-empty one, of the whole key otherwise.
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS
}

/// The bucket of a session, by the slot of its encoded `<tenant>:<session>`.
pub fn bucket_of(member: &str) -> u16 {
    slot_of(member.as_bytes()) / SLOTS_PER_BUCKET
}

/// The slot every key of bucket `bucket` lives in.
pub fn slot_of_bucket(bucket: u16) -> u16 {
    bucket * SLOTS_PER_BUCKET
}

/// A short hash tag whose slot is `slot`: the first of `0`, `1`, … `zz…`
/// (base 36) that lands there. Found once for every slot (a few hundred
/// thousand CRCs, a few milliseconds) and kept.
pub fn tag_of_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = base36(n);
            let slot = usize::from(slot_of(tag.as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

/// The hash tag of bucket `bucket`.
pub fn tag_of_bucket(bucket: u16) -> &'static str {
    tag_of_slot(slot_of_bucket(bucket))
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots Redis's own `CLUSTER KEYSLOT` gives for these keys.
    #[test]
    fn slots_match_redis() {
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"123456789"), 12739);
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
    }

    #[test]
    fn every_slot_has_a_short_tag_that_lands_on_it() {
        for slot in 0..SLOTS {
            let tag = tag_of_slot(slot);
            assert!(tag.len() <= 4, "{tag}");
            assert_eq!(slot_of(tag.as_bytes()), slot);
        }
        for bucket in 0..BUCKETS {
            let key = format!("baton:{{{}}}:unshipped", tag_of_bucket(bucket));
            assert_eq!(slot_of(key.as_bytes()), bucket * SLOTS_PER_BUCKET);
        }
    }
}
