//! One turn: begin (lease + state), materialise the workspace, call the
//! agent while the lease is kept, snapshot the workspace, commit.

use super::*;

/// What a turn has ready to commit.
struct Prepared {
    reply: String,
    payload: Bytes,
    /// The new manifest's reference, `None` when no file changed.
    workspace: Option<String>,
    manifest: Manifest,
    files: LocalFiles,
    started_at_ms: u64,
}

/// Keeps the lease gauges right however a turn ends.
struct LeaseGauges<'a>(&'a Metrics);

impl<'a> LeaseGauges<'a> {
    fn hold(metrics: &'a Metrics) -> Self {
        metrics.leases_held.inc();
        metrics.in_flight.inc();
        Self(metrics)
    }
}

impl Drop for LeaseGauges<'_> {
    fn drop(&mut self) {
        self.0.leases_held.dec();
        self.0.in_flight.dec();
    }
}

impl<S: TurnStore + 'static> Engine<S> {
    /// Runs one turn and records its outcome in the metrics.
    pub async fn turn(&self, ask: TurnAsk) -> Result<TurnAnswer, TurnError> {
        let started = Instant::now();
        let span = tracing::info_span!("turn", session = %ask.key, replica = %self.holder);
        let result = self.run(&ask).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(a) if a.duplicate => Outcome::Duplicate,
            Ok(_) => Outcome::Ok,
            Err(e) => e.outcome(),
        }
        .as_str();
        self.metrics
            .turn(&outcome.to_ascii_lowercase(), started.elapsed());
        // A line per turn only at debug: at INFO a busy replica would
        // write megabytes a minute (the metrics count every outcome). What
        // points at a fault of the agent or the stores stays at warn.
        span.in_scope(|| match &result {
            Ok(a) => tracing::debug!(
                outcome,
                version = a.version,
                turn_seq = a.turn_seq,
                ms = started.elapsed().as_millis() as u64,
                "turn answered"
            ),
            Err(e) if e.is_fault() => tracing::warn!(outcome, error = %e, "turn failed"),
            Err(e) => tracing::debug!(outcome, error = %e, "turn refused"),
        });
        result
    }

    async fn run(&self, ask: &TurnAsk) -> Result<TurnAnswer, TurnError> {
        if let Some(store) = self.layout_mismatch() {
            return Err(TurnError::LayoutMismatch {
                layout: self.layout,
                store,
            });
        }
        let wait = if ask.interrupt {
            ask.wait.max(INTERRUPT_WAIT)
        } else {
            ask.wait
        };
        let deadline = Instant::now() + wait;
        let mut interrupted = false;
        let input_digest = digest(ask.input.as_bytes());
        let begin = BeginRequest {
            key: ask.key.clone(),
            replica: self.holder.clone(),
            turn_seq: ask.turn_seq,
            cached_version: None,
            lease_ttl: self.timings.lease_ttl,
            state_ttl: self.timings.state_ttl,
            reclaim_own_lease: true,
            input_digest: Some(input_digest.clone()),
        };
        let mut backoff = Duration::from_millis(5);
        let (mut slot, lease, state) = loop {
            // Checked on every pass: a turn waiting for a busy lease must not
            // start on a replica that began draining meanwhile. One local
            // turn per session; a second one waits like a busy lease.
            let outcome = match self.inflight.enter(&ask.key, ask.turn_seq) {
                Ok(slot) => match self.timed("begin", self.store.begin(&begin)).await? {
                    BeginOutcome::Granted { lease, state } => break (slot, lease, state),
                    other => other,
                },
                Err(Refused::Draining) => return Err(TurnError::Draining),
                Err(Refused::SessionBusy) => BeginOutcome::Busy {
                    owner: self.holder.to_string(),
                    retry_after: Duration::from_millis(100),
                },
            };
            match outcome {
                BeginOutcome::Granted { .. } => unreachable!("handled above"),
                BeginOutcome::Duplicate(result) => {
                    return Ok(TurnAnswer {
                        reply: String::from_utf8_lossy(&result.reply).into_owned(),
                        turn_seq: result.turn_seq,
                        version: result.version,
                        duplicate: true,
                    });
                }
                BeginOutcome::Busy { .. } if ask.interrupt && !interrupted => {
                    // Once: the lease is free at once, and the turn that
                    // held it stops within LEASE_CHECK (a local one then
                    // leaves the in-flight registry too).
                    interrupted = true;
                    let stopped = self
                        .timed("interrupt", self.store.interrupt(&ask.key, None))
                        .await?;
                    tracing::info!(session = %ask.key, interrupted = ?stopped.map(|l| (l.owner, l.fence, l.turn_seq)), "interrupt asked by a newer turn");
                }
                BeginOutcome::Busy { owner, retry_after } => {
                    let now = Instant::now();
                    if now + backoff >= deadline {
                        // The holder may have just died: that shows one
                        // heartbeat TTL later, so never hint a longer wait.
                        return Err(TurnError::Busy {
                            session: ask.key.clone(),
                            owner,
                            retry_after: retry_after.min(self.timings.heartbeat_ttl),
                        });
                    }
                    // Waiting for the holder to commit: poll the lease with a
                    // growing pause, never past the caller's deadline.
                    tokio::time::sleep(backoff.min(deadline - now)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                }
                BeginOutcome::Gap { next_turn_seq } => {
                    return Err(TurnError::Gap { next_turn_seq });
                }
                BeginOutcome::Stale { last_turn_seq } => {
                    return Err(TurnError::Stale { last_turn_seq });
                }
                BeginOutcome::TurnSeqReused { turn_seq } => {
                    return Err(TurnError::TurnSeqReused { turn_seq });
                }
                BeginOutcome::StateLost { last_version } => {
                    return Err(TurnError::StateLost { last_version });
                }
            }
        };
        slot.granted(lease.fence, lease.turn_seq);
        if let Some(live) = &ask.live {
            live.start(
                lease.fence,
                lease.turn_seq,
                serde_json::json!({
                    "session": ask.key.session.as_str(),
                    "turnSeq": lease.turn_seq,
                    "attempt": lease.fence,
                    "replica": self.replica,
                })
                .to_string(),
            );
        }
        let _held = LeaseGauges::hold(&self.metrics);
        let granted_at_ms = now_ms();
        let result = self
            .with_lease(ask, input_digest.clone(), &lease, state, &mut slot.abort)
            .await;
        if matches!(result, Err(TurnError::Interrupted)) {
            self.record_interrupted(ask, &lease, input_digest, granted_at_ms)
                .await;
        }
        if result.is_err() {
            // Release what we may still hold so the next turn need not wait
            // for the TTL. Compare-and-delete on the fence: a lease we lost,
            // or one a commit already released, is not touched.
            if let Err(e) = self.timed("abort", self.store.abort(&lease)).await {
                tracing::warn!(error = %e, fence = lease.fence, "abort failed; a handover retries it, else the lease expires on its own");
                self.inflight.remember_unreleased(lease.clone());
            }
        }
        result
    }

    /// Keeps the interrupted turn in the session's history, with its input
    /// when the ledger keeps text. A failure costs the history a line, no
    /// more: the turn's outcome is settled.
    async fn record_interrupted(
        &self,
        ask: &TurnAsk,
        lease: &Lease,
        input_digest: String,
        started_at_ms: u64,
    ) {
        let turn = baton_session::TurnRecord {
            tenant: lease.key.tenant.to_string(),
            session: lease.key.session.to_string(),
            turn_seq: lease.turn_seq,
            version: lease.version,
            replica: self.holder.to_string(),
            fence: lease.fence,
            input_digest,
            reply_digest: String::new(),
            workspace: None,
            started_at_ms,
            committed_at_ms: now_ms(),
            input: self.keep_text.then(|| ask.input.clone()),
            reply: None,
            interrupted: true,
        };
        if let Err(e) = self.store.record_interrupted(&turn).await {
            tracing::warn!(error = %e, fence = lease.fence, "the interrupted turn could not be kept in the history");
        }
    }

    async fn with_lease(
        &self,
        ask: &TurnAsk,
        input_digest: String,
        lease: &Lease,
        state: baton_session::SessionState,
        abort: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Result<TurnAnswer, TurnError> {
        tracing::debug!(
            version = lease.version,
            fence = lease.fence,
            turn_seq = lease.turn_seq,
            "lease granted"
        );
        // The lease is renewed from the grant until the commit is sent:
        // materialising, the agent and the upload all count.
        let prepared = tokio::select! {
            prepared = self.prepare(ask, lease, &state) => prepared,
            () = self.renew_until_lost(lease) => Err(TurnError::LeaseLost),
            stopped = self.until_lease_goes(lease, ask.live.as_deref()) => Err(stopped),
            _ = abort.wait_for(|a| *a) => Err(TurnError::AbortedByDrain),
        };
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                // The agent may still be running (we stopped waiting), or
                // left half a turn: its generation goes.
                self.local.abandon(&lease.key);
                return Err(e);
            }
        };
        let commit = CommitRequest {
            lease: lease.clone(),
            expected_version: lease.version,
            payload: prepared.payload,
            workspace: prepared.workspace.or(state.workspace),
            reply: Bytes::from(prepared.reply.clone()),
            state_ttl: self.timings.state_ttl,
            started_at_ms: prepared.started_at_ms,
            input_digest,
            input: self.keep_text.then(|| ask.input.clone()),
        };
        let committed = self.timed("commit", self.store.commit(&commit)).await;
        match committed {
            Ok(CommitOutcome::Committed { version }) => {
                self.local.committed(
                    &lease.key,
                    Holds {
                        reference: commit.workspace,
                        manifest: prepared.manifest,
                        files: prepared.files,
                    },
                );
                Ok(TurnAnswer {
                    reply: prepared.reply,
                    turn_seq: lease.turn_seq,
                    version,
                    duplicate: false,
                })
            }
            Ok(CommitOutcome::LeaseLost) => {
                self.local.abandon(&lease.key);
                Err(TurnError::LeaseLost)
            }
            Ok(CommitOutcome::Conflict { current_version }) => {
                self.local.abandon(&lease.key);
                Err(TurnError::Conflict { current_version })
            }
            Err(StoreError::Unavailable(why)) => {
                // The script may have run before the answer was lost.
                self.local.abandon(&lease.key);
                tracing::warn!(error = %why, turn_seq = lease.turn_seq, "commit outcome unknown");
                Err(TurnError::CommitUnknown {
                    turn_seq: lease.turn_seq,
                })
            }
            Err(e) => {
                self.local.abandon(&lease.key);
                Err(e.into())
            }
        }
    }

    /// Everything between the grant and the commit: the workspace, the
    /// agent, the new state and the snapshot of the files.
    async fn prepare(
        &self,
        ask: &TurnAsk,
        lease: &Lease,
        state: &baton_session::SessionState,
    ) -> Result<Prepared, TurnError> {
        let started_at_ms = now_ms();
        let (dir, cached) =
            if let Some(hit) = self.local.check_out_cached(&lease.key, &state.workspace) {
                hit
            } else {
                let (local, root, key, fence, reference) = (
                    self.local.clone(),
                    self.workspace_root.clone(),
                    lease.key.clone(),
                    lease.fence,
                    state.workspace.clone(),
                );
                tokio::task::spawn_blocking(move || local.check_out(&root, &key, fence, &reference))
                    .await
                    .map_err(|e| WorkspaceError::Io(std::io::Error::other(e.to_string())))?
                    .map_err(WorkspaceError::Io)?
            };
        let (base, seen) = match cached {
            Some(holds) => (holds.manifest, holds.files),
            None => {
                let done = self
                    .workspaces
                    .materialize(state.workspace.as_deref(), &dir)
                    .await?;
                (done.manifest, done.files)
            }
        };
        // The state passes through as raw JSON text: checked to be JSON,
        // never parsed into a tree (it can be large, and it is the agent's).
        // It is stored exactly as the agent wrote it, whatever its nesting
        // depth or escapes: an agent must read back what it writes (an
        // agent whose parser refuses its own output fails its next turns,
        // and nothing it committed is lost).
        let payload = state.payload.clone().unwrap_or_default();
        let agent_state: &serde_json::value::RawValue = if payload.is_empty() {
            serde_json::value::RawValue::NULL
        } else {
            serde_json::from_slice(&payload).map_err(|e| {
                StoreError::Corrupt(format!("{}: stored state is not JSON: {e}", lease.key))
            })?
        };
        let request = TurnRequest {
            session: lease.key.session.to_string(),
            tenant: lease.key.tenant.to_string(),
            turn_seq: lease.turn_seq,
            input: ask.input.clone(),
            state: agent_state,
            workspace_dir: dir.clone(),
        };
        let relay = |event: AgentEvent| {
            if let Some(live) = &ask.live {
                match event {
                    AgentEvent::Delta(text) => {
                        live.push(Kind::Delta, serde_json::json!({ "text": text }).to_string())
                    }
                    AgentEvent::Progress(data) => live.push(Kind::Progress, data),
                }
            }
        };
        let response = self
            .agent
            .turn(&request, &relay)
            .await
            .map_err(TurnError::Agent)?;
        let new_payload = Bytes::from(String::from(Box::<str>::from(response.state)));
        if new_payload.len() > baton_session::MAX_PAYLOAD_BYTES {
            return Err(TurnError::BadAgentState(format!(
                "it is {} bytes; the limit is {}",
                new_payload.len(),
                baton_session::MAX_PAYLOAD_BYTES
            )));
        }
        let snapshot = self
            .workspaces
            .snapshot_manifest(
                &dir,
                &base,
                &seen,
                &lease.key,
                lease.version + 1,
                lease.fence,
            )
            .await?;
        Ok(Prepared {
            reply: response.reply,
            payload: new_payload,
            workspace: snapshot.reference,
            manifest: snapshot.manifest,
            files: snapshot.files,
            started_at_ms,
        })
    }
}
