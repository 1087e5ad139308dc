//! The Lua scripts, sent by SHA and loaded again when Redis answers
//! NOSCRIPT (after a restart): the failed call ran nothing, so the
//! pipeline runs again and NOSCRIPT never surfaces as an outcome.

use redis::Script;

use baton_session::store::StoreResult;

use crate::conn::Conn;
use crate::errors::unavailable;

pub(crate) struct Scripts {
    pub(crate) begin: Script,
    pub(crate) commit: Script,
    pub(crate) renew: Script,
    pub(crate) abort: Script,
    pub(crate) revoke: Script,
    pub(crate) interrupt: Script,
    pub(crate) restore: Script,
    pub(crate) vouch: Script,
    pub(crate) ack: Script,
    pub(crate) unindex: Script,
    pub(crate) sweeper: Script,
    pub(crate) complete_known: Script,
    pub(crate) append_stream: Script,
    pub(crate) want: Script,
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Self {
            begin: Script::new(include_str!("scripts/begin.lua")),
            commit: Script::new(include_str!("scripts/commit.lua")),
            renew: Script::new(include_str!("scripts/renew.lua")),
            abort: Script::new(include_str!("scripts/abort.lua")),
            revoke: Script::new(include_str!("scripts/revoke.lua")),
            interrupt: Script::new(include_str!("scripts/interrupt.lua")),
            restore: Script::new(include_str!("scripts/restore.lua")),
            vouch: Script::new(include_str!("scripts/vouch.lua")),
            ack: Script::new(include_str!("scripts/ack.lua")),
            unindex: Script::new(include_str!("scripts/unindex.lua")),
            sweeper: Script::new(include_str!("scripts/sweeper.lua")),
            complete_known: Script::new(include_str!("scripts/complete_known.lua")),
            append_stream: Script::new(include_str!("scripts/append_stream.lua")),
            want: Script::new(include_str!("scripts/want.lua")),
        }
    }
}

impl Conn {
    /// Runs a pipeline holding one script call; if Redis lost its script
    /// cache (NOSCRIPT, after a restart), loads the script and runs the
    /// pipeline again. The failed call ran nothing, and the pipelines' other
    /// commands are safe to repeat.
    pub(crate) async fn with_script<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        build: impl Fn(&mut redis::Pipeline),
    ) -> StoreResult<T> {
        let mut conn = self.clone();
        let mut pipe = redis::pipe();
        build(&mut pipe);
        match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .map_err(unavailable)?;
                pipe.query_async(&mut conn).await.map_err(unavailable)
            }
            other => other.map_err(unavailable),
        }
    }

    /// `with_script` for pipelines of many buckets at once
    /// ([`Conn::query_each`]): those that found the script missing run
    /// again once it is loaded, the others not.
    pub(crate) async fn with_script_each<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        pipelines: &[redis::Pipeline],
    ) -> StoreResult<Vec<T>> {
        let no_script = |e: &redis::RedisError| {
            e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        };
        let mut answers = self.query_each::<T>(pipelines).await;
        let missed: Vec<usize> = (0..answers.len())
            .filter(|&i| answers[i].as_ref().is_err_and(no_script))
            .collect();
        if !missed.is_empty() {
            script
                .prepare_invoke()
                .load_async(&mut self.clone())
                .await
                .map_err(unavailable)?;
            let again: Vec<redis::Pipeline> =
                missed.iter().map(|&i| pipelines[i].clone()).collect();
            for (&i, answer) in missed.iter().zip(self.query_each::<T>(&again).await) {
                answers[i] = answer;
            }
        }
        answers
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(unavailable)
    }
}
