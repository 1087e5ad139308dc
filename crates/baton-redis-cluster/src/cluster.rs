//! The client: one connection per master, the slot map, and every request
//! routed by the slot of its keys (see the crate's documentation for why
//! and what it does when a slot moves or fails).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike as _, MultiplexedConnection};
use redis::{
    Arg, AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisError,
    RedisResult, ServerError, ServerErrorKind, Value,
};

use crate::requests::count_request;
use crate::slots::{SLOTS, slot_of};

/// How long a request refused for a moving or failing slot keeps being
/// tried (a failover within `cluster-node-timeout` plus an election).
const RETRY_BUDGET: Duration = Duration::from_secs(3);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// Redirections one request follows before it gives up (a MOVED loop
/// means the nodes disagree; the budget above bounds the waiting kind).
const MAX_REDIRECTIONS: usize = 16;
/// How long one node gets to answer `CLUSTER SLOTS`.
const SLOT_MAP_DEADLINE: Duration = Duration::from_secs(1);
/// A background re-read of the slot map starts at most this often.
const BACKGROUND_REFRESH_INTERVAL: Duration = Duration::from_millis(100);

/// A request as `ConnectionLike` hands it over.
#[derive(Clone, Copy)]
enum Request<'a> {
    Command(&'a Cmd),
    Pipeline(&'a Pipeline, usize, usize),
}

enum Reply {
    One(Value),
    Many(Vec<Value>),
}

/// A connection to a Redis Cluster (cheap to clone: one shared client).
#[derive(Clone)]
pub struct Cluster(Arc<Inner>);

struct Inner {
    /// The URL's seed nodes: where the first slot map is read, and where it
    /// is read again when no master the map names answers. Their
    /// credentials and TCP settings are every node's.
    seeds: Vec<ConnectionInfo>,
    config: AsyncConnectionConfig,
    map: RwLock<Arc<SlotMap>>,
    nodes: Mutex<HashMap<Arc<str>, Arc<Node>>>,
    /// One re-read of the slot map at a time; when the last one began.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
    /// Requests this client sent (its tests count them; the process-wide
    /// count is `conn::requests_sent`).
    sent: std::sync::atomic::AtomicU64,
}

impl Cluster {
    /// Reads the slot map from the first seed that answers.
    pub async fn connect(
        seeds: Vec<ConnectionInfo>,
        config: AsyncConnectionConfig,
    ) -> RedisResult<Self> {
        let cluster = Self(Arc::new(Inner {
            seeds,
            config,
            map: RwLock::new(Arc::new(SlotMap::default())),
            nodes: Mutex::default(),
            refreshed: tokio::sync::Mutex::new(None),
            sent: std::sync::atomic::AtomicU64::new(0),
        }));
        cluster.refresh().await?;
        Ok(cluster)
    }

    /// The slot map as this client knows it now.
    pub fn slot_map(&self) -> Arc<SlotMap> {
        self.0.map.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads the slot map again, unless a read that began after this call
    /// did already (one that began before may predate what the caller
    /// saw); the map it ended with.
    pub async fn refresh(&self) -> RedisResult<Arc<SlotMap>> {
        let asked = Instant::now();
        let mut refreshed = self.0.refreshed.lock().await;
        if refreshed.is_some_and(|began| began >= asked) {
            return Ok(self.slot_map());
        }
        let began = Instant::now();
        let read = self.read_slot_map().await;
        *refreshed = Some(began);
        let map = Arc::new(read?);
        *self.0.map.write().unwrap_or_else(|p| p.into_inner()) = map.clone();
        Ok(map)
    }

    /// Starts a re-read of the slot map in the background, unless one is
    /// running or ran within [`BACKGROUND_REFRESH_INTERVAL`].
    fn refresh_soon(&self) {
        let cluster = self.clone();
        let Ok(refreshed) = self.0.refreshed.try_lock() else {
            return;
        };
        if refreshed.is_some_and(|at| at.elapsed() < BACKGROUND_REFRESH_INTERVAL) {
            return;
        }
        drop(refreshed);
        tokio::spawn(async move {
            if let Err(e) = cluster.refresh().await {
                tracing::debug!(error = %e, "re-reading the cluster's slot map failed");
            }
        });
    }

    /// `CLUSTER SLOTS` from the first node that answers: the masters of the
    /// map first, then the seeds.
    async fn read_slot_map(&self) -> RedisResult<SlotMap> {
        let mut candidates: Vec<Arc<str>> = self.slot_map().masters().to_vec();
        for seed in &self.0.seeds {
            let addr: Arc<str> = address_of(seed).into();
            if !candidates.contains(&addr) {
                candidates.push(addr);
            }
        }
        let mut last_error = None;
        for addr in candidates {
            let read = async {
                let answer = self
                    .on_node(&addr, redis::cmd("CLUSTER").arg("SLOTS"))
                    .await?;
                SlotMap::from_cluster_slots(&answer, host_of(&addr))
            };
            match tokio::time::timeout(SLOT_MAP_DEADLINE, read).await {
                Ok(Ok(map)) if !map.masters().is_empty() => return Ok(map),
                Ok(Ok(_)) => last_error = Some(client_error(format!("{addr} serves no slot"))),
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    last_error = Some(client_error(format!(
                        "{addr} did not answer CLUSTER SLOTS within {SLOT_MAP_DEADLINE:?}"
                    )));
                }
            }
        }
        Err(last_error.unwrap_or_else(|| client_error("no node to read the slot map from")))
    }

    /// Sends `cmd` to the node at `addr` once: no routing, no retry.
    pub async fn on_node(&self, addr: &str, cmd: &Cmd) -> RedisResult<Value> {
        match self.send(addr, Request::Command(cmd), false).await {
            Ok(Reply::One(value)) => value.extract_error(),
            Ok(Reply::Many(_)) => Err(client_error("a command answered as a pipeline")),
            Err(Failure::NotSent(e) | Failure::Sent(e)) => Err(e),
        }
    }

    pub async fn command(&self, cmd: &Cmd) -> RedisResult<Value> {
        if is_script_load(cmd) {
            return self.on_every_master(cmd).await;
        }
        match self.request(Request::Command(cmd)).await? {
            Reply::One(value) => Ok(value),
            Reply::Many(_) => Err(client_error("a command answered as a pipeline")),
        }
    }

    pub async fn pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self
            .request(Request::Pipeline(pipeline, offset, count))
            .await?
        {
            Reply::Many(values) => Ok(values),
            Reply::One(_) => Err(client_error("a pipeline answered as one command")),
        }
    }

    /// Runs each of `pipelines` (each naming keys of one slot) as
    /// `query_async` would, sending all of one master's in one request:
    /// what the ledger shipper and the sweeper send for many buckets at
    /// once. A pipeline refused inside the combined request (its slot
    /// moving or failing over) is sent again alone, through
    /// [`Self::request`]'s redirections and retries: so each must be a
    /// transaction (a refused one ran nothing) or safe to run twice.
    pub async fn query_each<T: redis::FromRedisValue>(
        &self,
        pipelines: &[Pipeline],
    ) -> Vec<RedisResult<T>> {
        let map = self.slot_map();
        let mut by_master: HashMap<Arc<str>, Vec<usize>> = HashMap::new();
        for (i, pipeline) in pipelines.iter().enumerate() {
            if let Some(master) =
                slot_of_request(Request::Pipeline(pipeline, 0, 0)).and_then(|s| map.master_of(s))
            {
                by_master.entry(master.clone()).or_default().push(i);
            }
        }
        let mut raw: Vec<Option<RedisResult<Vec<Value>>>> =
            (0..pipelines.len()).map(|_| None).collect();
        let combined = by_master
            .iter()
            .filter(|(_, members)| members.len() > 1)
            .map(|(addr, members)| async move {
                (members, self.combined(addr, pipelines, members).await)
            });
        for (members, outcome) in futures::future::join_all(combined).await {
            match outcome {
                Ok(parts) => {
                    for (&i, part) in members.iter().zip(parts) {
                        raw[i] = part.map(Ok);
                    }
                }
                // Some may have run: none is sent again.
                Err(Failure::Sent(e)) => {
                    self.refresh_soon();
                    for &i in members {
                        raw[i] = Some(Err(e.clone()));
                    }
                }
                Err(Failure::NotSent(_)) => {}
            }
        }
        let alone: Vec<usize> = (0..pipelines.len()).filter(|&i| raw[i].is_none()).collect();
        let sent_alone = alone.iter().map(|&i| {
            let pipeline = &pipelines[i];
            let (offset, count) = query_span(pipeline);
            self.pipeline(pipeline, offset, count)
        });
        for (i, answer) in alone
            .iter()
            .zip(futures::future::join_all(sent_alone).await)
        {
            raw[*i] = Some(answer);
        }
        let mut answers = Vec::with_capacity(pipelines.len());
        for (pipeline, raw) in pipelines.iter().zip(raw) {
            answers.push(match raw {
                Some(Ok(values)) => match values.as_slice() {
                    // An aborted transaction: `query_async` would read its
                    // error as a malformed EXEC reply.
                    [Value::ServerError(e)] if pipeline.is_transaction() => Err(e.clone().into()),
                    _ => pipeline.query_async(&mut Replay(Some(values))).await,
                },
                Some(Err(e)) => Err(e),
                None => Err(client_error("a pipeline left unsent")),
            });
        }
        answers
    }

    /// `members` of `pipelines` in one request to `addr`: each one's
    /// replies as `query_async` asks for them, or `None` where the cluster
    /// refused it.
    async fn combined(
        &self,
        addr: &str,
        pipelines: &[Pipeline],
        members: &[usize],
    ) -> Result<Vec<Option<Vec<Value>>>, Failure> {
        let mut combined = redis::pipe();
        for &i in members {
            let pipeline = &pipelines[i];
            if pipeline.is_transaction() {
                combined.cmd("MULTI");
            }
            for cmd in pipeline.cmd_iter() {
                combined.add_command(cmd.clone());
            }
            if pipeline.is_transaction() {
                combined.cmd("EXEC");
            }
        }
        let request = Request::Pipeline(&combined, 0, combined.len());
        let Reply::Many(values) = self.send(addr, request, false).await? else {
            return Err(Failure::Sent(client_error(
                "a pipeline answered as one command",
            )));
        };
        if values.len() != combined.len() {
            return Err(Failure::Sent(client_error(format!(
                "{} replies to a pipeline of {}",
                values.len(),
                combined.len()
            ))));
        }
        let mut values = values.into_iter();
        let parts = members
            .iter()
            .map(|&i| {
                let pipeline = &pipelines[i];
                let transaction = pipeline.is_transaction();
                let sent = pipeline.len() + if transaction { 2 } else { 0 };
                let mut part: Vec<Value> = values.by_ref().take(sent).collect();
                let refusal = part.iter().find_map(|value| match value {
                    Value::ServerError(e) => Refusal::of_server_error(e),
                    _ => None,
                });
                // Sent again alone, straight to where a MOVED points.
                if let Some(Refusal::Moved { slot, to }) = &refusal {
                    self.learn_moved(*slot, with_host(to, host_of(addr)).into());
                    self.refresh_soon();
                }
                let refused = refusal.is_some();
                match (refused, transaction) {
                    (true, _) => None,
                    // A transaction's answer is its EXEC's; an EXECABORT
                    // says only "previous errors", so the answer is the
                    // error that aborted it.
                    (false, true) => {
                        let exec = part.pop();
                        let cause = part
                            .into_iter()
                            .find(|v| matches!(v, Value::ServerError(_)));
                        match exec {
                            Some(Value::ServerError(_)) => cause.or(exec),
                            _ => exec,
                        }
                        .map(|answer| vec![answer])
                    }
                    (false, false) => Some(part),
                }
            })
            .collect();
        Ok(parts)
    }

    /// Routes `request` by its slot and follows the cluster's answers (see
    /// the module's comment).
    async fn request(&self, request: Request<'_>) -> RedisResult<Reply> {
        let slot = slot_of_request(request);
        let started = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let mut redirected: Option<(Arc<str>, bool)> = None;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (addr, asking) = match redirected.take() {
                Some(target) => target,
                None => match self.slot_map().route(slot, attempt) {
                    Some(master) => (master, false),
                    None => {
                        let e = client_error(format!(
                            "slot {} is served by no master the cluster named",
                            slot.unwrap_or_default()
                        ));
                        self.wait_before_retry(started, &mut backoff, e).await?;
                        continue;
                    }
                },
            };
            let failure = match self.send(&addr, request, asking).await {
                Ok(reply) => match Refusal::of_reply(&reply) {
                    None => return Ok(reply),
                    // A plain pipeline's commands before or after a
                    // refused one ran (an ASK refuses only the keys that
                    // already left): it is not sent again.
                    Some(_) if ran_in_part(&reply) => {
                        self.refresh_soon();
                        return Err(reply_error(reply));
                    }
                    Some(refusal) => (refusal, reply_error(reply)),
                },
                Err(Failure::Sent(e)) => match Refusal::of_error(&e) {
                    Some(refusal) => (refusal, e),
                    None => {
                        // It may have run: the caller decides.
                        self.refresh_soon();
                        return Err(e);
                    }
                },
                Err(Failure::NotSent(e)) => (Refusal::Wait, e),
            };
            match failure {
                (Refusal::Moved { slot, to }, _) if attempt <= MAX_REDIRECTIONS => {
                    let to: Arc<str> = with_host(&to, host_of(&addr)).into();
                    self.learn_moved(slot, to.clone());
                    self.refresh_soon();
                    redirected = Some((to, false));
                }
                (Refusal::Ask { to }, _) if attempt <= MAX_REDIRECTIONS => {
                    redirected = Some((with_host(&to, host_of(&addr)).into(), true));
                }
                (Refusal::Wait, e) => {
                    self.wait_before_retry(started, &mut backoff, e).await?;
                }
                (_, e) => return Err(e),
            }
        }
    }

    /// Backs off and re-reads the slot map, or gives `error` back once the
    /// request has been refused for [`RETRY_BUDGET`].
    async fn wait_before_retry(
        &self,
        started: Instant,
        backoff: &mut Duration,
        error: RedisError,
    ) -> RedisResult<()> {
        if started.elapsed() + *backoff > RETRY_BUDGET {
            return Err(error);
        }
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        // The re-read counts against the budget too: nodes that do not
        // answer could otherwise hold the request a deadline each.
        let left = RETRY_BUDGET.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.refresh()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "re-reading the cluster's slot map failed"),
            Err(_) => return Err(error),
        }
        Ok(())
    }

    fn learn_moved(&self, slot: u16, to: Arc<str>) {
        let mut map = self.0.map.write().unwrap_or_else(|p| p.into_inner());
        if map.master_of(slot) != Some(&to) {
            *map = Arc::new(map.with_moved(slot, to));
        }
    }

    /// `SCRIPT LOAD` goes to every master: the next EVALSHA may run on any.
    /// It holds if one master took it (one that is down now loads it again
    /// when an EVALSHA there answers NOSCRIPT).
    async fn on_every_master(&self, cmd: &Cmd) -> RedisResult<Value> {
        let map = self.slot_map();
        let loads = map.masters().iter().map(|addr| self.on_node(addr, cmd));
        let answers = futures::future::join_all(loads).await;
        let mut first_error = None;
        let mut answer = None;
        for result in answers {
            match result {
                Ok(value) => answer = answer.or(Some(value)),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        match (answer, first_error) {
            (Some(value), _) => Ok(value),
            (None, Some(e)) => Err(e),
            (None, None) => Err(client_error("the cluster has no master")),
        }
    }

    fn count_request(&self) {
        self.0
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        count_request();
    }

    #[cfg(test)]
    fn requests_sent(&self) -> u64 {
        self.0.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn node(&self, addr: &str) -> Arc<Node> {
        let mut nodes = self.0.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(node) = nodes.get(addr) {
            return node.clone();
        }
        let node = Arc::new(Node::new(self.node_info(addr)));
        nodes.insert(addr.into(), node.clone());
        node
    }

    /// The seeds' settings and credentials, at `addr`.
    fn node_info(&self, addr: &str) -> ConnectionInfo {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_owned(), p.parse().ok()?)))
            .unwrap_or_else(|| (addr.to_owned(), 6379));
        self.0.seeds[0]
            .clone()
            .set_addr(ConnectionAddr::Tcp(host, port))
    }

    /// One round trip to `addr`; after an ASK, on a connection of its own
    /// that says ASKING first.
    async fn send(&self, addr: &str, request: Request<'_>, asking: bool) -> Result<Reply, Failure> {
        let node = self.node(addr);
        let (mut conn, generation) = if asking {
            let mut conn = node
                .connect_alone(&self.0.config)
                .await
                .map_err(Failure::NotSent)?;
            if let Request::Pipeline(pipeline, offset, count) = request
                && !pipeline.is_transaction()
            {
                return self
                    .send_asking_each(&mut conn, pipeline, offset, count)
                    .await;
            }
            self.count_request();
            redis::cmd("ASKING")
                .exec_async(&mut conn)
                .await
                .map_err(Failure::NotSent)?;
            (conn, None)
        } else {
            let (conn, generation) = node
                .connection(&self.0.config)
                .await
                .map_err(Failure::NotSent)?;
            (conn, Some(generation))
        };
        self.count_request();
        let answer = match request {
            Request::Command(cmd) => conn.req_packed_command(cmd).await.map(Reply::One),
            Request::Pipeline(pipeline, offset, count) => conn
                .req_packed_commands(pipeline, offset, count)
                .await
                .map(Reply::Many),
        };
        answer.map_err(|e| {
            if let Some(generation) = generation
                && (e.is_connection_dropped() || e.is_unrecoverable_error())
            {
                node.forget(generation);
            }
            Failure::Sent(e)
        })
    }

    /// A plain pipeline after an ASK, with ASKING before each command:
    /// Redis forgets ASKING after one command (outside MULTI), and the
    /// target would answer the rest with MOVED back to the source.
    async fn send_asking_each(
        &self,
        conn: &mut MultiplexedConnection,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> Result<Reply, Failure> {
        let mut asking = redis::pipe();
        for cmd in pipeline.cmd_iter() {
            asking.cmd("ASKING").add_command(cmd.clone());
        }
        self.count_request();
        let values = conn
            .req_packed_commands(&asking, 0, asking.len())
            .await
            .map_err(Failure::Sent)?;
        // ASKING's OK, the command's reply, ...
        let replies = values.into_iter().skip(1).step_by(2).skip(offset);
        Ok(Reply::Many(replies.take(count).collect()))
    }
}

/// The span of replies `query_async` asks a pipeline's connection for.
fn query_span(pipeline: &Pipeline) -> (usize, usize) {
    if pipeline.is_transaction() {
        (pipeline.len() + 1, 1)
    } else {
        (0, pipeline.len())
    }
}

/// Answers one `query_async` with replies already received, so that the
/// pipeline reads them as it reads its own (a transaction's EXEC, ignored
/// commands, errors).
struct Replay(Option<Vec<Value>>);

impl redis::aio::ConnectionLike for Replay {
    fn req_packed_command<'a>(&'a mut self, _: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async { Err(client_error("a replay answers pipelines only")) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a Pipeline,
        _: usize,
        _: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        let values = self.0.take();
        Box::pin(async move { values.ok_or_else(|| client_error("a replay answers once")) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Why a request failed: refused before it reached Redis (safe to send
/// again), or after it was sent (it may have run).
enum Failure {
    NotSent(RedisError),
    Sent(RedisError),
}

/// A cluster's refusal of a request that ran nothing.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    Moved {
        slot: u16,
        to: String,
    },
    Ask {
        to: String,
    },
    /// The slot's master is failing over, loading, or mid-migration.
    Wait,
}

impl Refusal {
    fn of_server_error(e: &ServerError) -> Option<Self> {
        let target = || {
            let mut words = e.details()?.split_ascii_whitespace();
            let slot = words.next()?.parse().ok()?;
            Some((slot, words.next()?.to_owned()))
        };
        match e.kind()? {
            ServerErrorKind::Moved => target().map(|(slot, to)| Self::Moved { slot, to }),
            ServerErrorKind::Ask => target().map(|(_, to)| Self::Ask { to }),
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading => Some(Self::Wait),
            _ => None,
        }
    }

    fn of_reply(reply: &Reply) -> Option<Self> {
        let of_value = |value: &Value| match value {
            Value::ServerError(e) => Self::of_server_error(e),
            _ => None,
        };
        match reply {
            Reply::One(value) => of_value(value),
            Reply::Many(values) => values.iter().find_map(of_value),
        }
    }

    /// A transaction whose queued commands were refused comes back as an
    /// error holding their errors.
    fn of_error(e: &RedisError) -> Option<Self> {
        let errors = e.clone().into_server_errors()?;
        errors.iter().find_map(|(_, e)| Self::of_server_error(e))
    }
}

/// Whether some of a plain pipeline's commands were refused and others ran.
fn ran_in_part(reply: &Reply) -> bool {
    let Reply::Many(values) = reply else {
        return false;
    };
    let refused = |value: &Value| match value {
        Value::ServerError(e) => Refusal::of_server_error(e).is_some(),
        _ => false,
    };
    values.iter().any(refused) && !values.iter().all(refused)
}

/// The first server error of a refused reply, as an error.
fn reply_error(reply: Reply) -> RedisError {
    let values = match reply {
        Reply::One(value) => vec![value],
        Reply::Many(values) => values,
    };
    values
        .into_iter()
        .find_map(|value| value.extract_error().err())
        .unwrap_or_else(|| client_error("a refused reply without an error"))
}

/// A master's connection, made when first needed and again after it broke.
struct Node {
    info: ConnectionInfo,
    /// The connection and its generation (so a request that saw an old one
    /// break does not drop a new one).
    conn: Mutex<(u64, Option<MultiplexedConnection>)>,
    /// One connection attempt at a time.
    connecting: tokio::sync::Mutex<()>,
}

impl Node {
    fn new(info: ConnectionInfo) -> Self {
        Self {
            info,
            conn: Mutex::new((0, None)),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    fn cached(&self) -> Option<(MultiplexedConnection, u64)> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.1.clone().map(|c| (c, conn.0))
    }

    async fn connection(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, u64)> {
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let _alone = self.connecting.lock().await;
        if let Some(cached) = self.cached() {
            return Ok(cached);
        }
        let fresh = self.connect_alone(config).await?;
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.0 += 1;
        conn.1 = Some(fresh.clone());
        Ok((fresh, conn.0))
    }

    async fn connect_alone(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        redis::Client::open(self.info.clone())?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }

    fn forget(&self, generation: u64) {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if conn.0 == generation {
            conn.1 = None;
        }
    }
}

/// Which master serves which slot, as `CLUSTER SLOTS` said.
#[derive(Debug, Default)]
pub struct SlotMap {
    /// Every master, once, in the order the answer named them.
    masters: Vec<Arc<str>>,
    /// For every slot, its master's index in `masters` (`NONE`: unserved).
    owners: Vec<u16>,
}

const NONE: u16 = u16::MAX;

impl SlotMap {
    /// `[[first, last, [host, port, id, ...], replicas...], ...]`; an empty
    /// host means the node that answered (`answered_by`).
    fn from_cluster_slots(value: &Value, answered_by: &str) -> RedisResult<Self> {
        let bad = || client_error(format!("CLUSTER SLOTS answered {value:?}"));
        let Value::Array(entries) = value else {
            return Err(bad());
        };
        let mut map = Self {
            masters: Vec::new(),
            owners: vec![NONE; usize::from(SLOTS)],
        };
        for entry in entries {
            let Value::Array(fields) = entry else {
                return Err(bad());
            };
            let number = |v: Option<&Value>| match v {
                Some(Value::Int(n)) => u16::try_from(*n).ok().filter(|n| *n < SLOTS),
                _ => None,
            };
            let (Some(first), Some(last)) = (number(fields.first()), number(fields.get(1))) else {
                return Err(bad());
            };
            let Some(Value::Array(master)) = fields.get(2) else {
                return Err(bad());
            };
            // Nil or "?" (`cluster-preferred-endpoint-type
            // unknown-endpoint`): the node that answered.
            let host: String = match master.first() {
                Some(Value::Nil) => String::new(),
                Some(h) => redis::from_redis_value_ref(h).map_err(|_| bad())?,
                None => return Err(bad()),
            };
            let host = if host == "?" { String::new() } else { host };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(bad());
            };
            let host = if host.is_empty() { answered_by } else { &host };
            let index = map.index_of(format!("{host}:{port}").into());
            for slot in first..=last {
                map.owners[usize::from(slot)] = index;
            }
        }
        Ok(map)
    }

    fn index_of(&mut self, master: Arc<str>) -> u16 {
        match self.masters.iter().position(|m| *m == master) {
            Some(i) => u16::try_from(i).unwrap_or(NONE),
            None => {
                self.masters.push(master);
                u16::try_from(self.masters.len() - 1).unwrap_or(NONE)
            }
        }
    }

    /// The master serving `slot`, if one does.
    pub fn master_of(&self, slot: u16) -> Option<&Arc<str>> {
        let index = *self.owners.get(usize::from(slot))?;
        self.masters.get(usize::from(index))
    }

    pub fn masters(&self) -> &[Arc<str>] {
        &self.masters
    }

    /// Where a request for `slot` goes; a request without keys goes to the
    /// masters in turn, one more each attempt (so a dead one is passed by).
    fn route(&self, slot: Option<u16>, attempt: usize) -> Option<Arc<str>> {
        match slot {
            Some(slot) => self.master_of(slot).cloned(),
            None if self.masters.is_empty() => None,
            None => Some(self.masters[attempt % self.masters.len()].clone()),
        }
    }

    /// This map, with `slot` served by `master` (a MOVED said so).
    fn with_moved(&self, slot: u16, master: Arc<str>) -> Self {
        let mut map = Self {
            masters: self.masters.clone(),
            owners: self.owners.clone(),
        };
        let index = map.index_of(master);
        if let Some(owner) = map.owners.get_mut(usize::from(slot)) {
            *owner = index;
        }
        map
    }
}

/// Commands whose first argument is not a key (a request of these alone
/// goes to any master).
const KEYLESS: &[&str] = &[
    "ASKING", "AUTH", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "DBSIZE", "DEBUG", "DISCARD",
    "ECHO", "EXEC", "FLUSHALL", "FLUSHDB", "FUNCTION", "HELLO", "INFO", "LASTSAVE", "MONITOR",
    "MULTI", "PING", "READONLY", "ROLE", "SCAN", "SCRIPT", "SELECT", "TIME", "WAIT",
];

/// The slot of a request: of its first key, for a pipeline the first key
/// of any of its commands. A guess for commands it does not know (the
/// first argument); a wrong guess costs a MOVED, never a wrong answer.
fn slot_of_request(request: Request<'_>) -> Option<u16> {
    match request {
        Request::Command(cmd) => slot_of_command(cmd),
        Request::Pipeline(pipeline, _, _) => pipeline.cmd_iter().find_map(slot_of_command),
    }
}

fn slot_of_command(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    let is = |known: &str| name.eq_ignore_ascii_case(known.as_bytes());
    if [
        "EVAL",
        "EVALSHA",
        "EVAL_RO",
        "EVALSHA_RO",
        "FCALL",
        "FCALL_RO",
    ]
    .into_iter()
    .any(is)
    {
        let _script = args.next()?;
        let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
        return if keys == 0 {
            None
        } else {
            args.next().map(slot_of)
        };
    }
    if KEYLESS.iter().copied().any(is) {
        return None;
    }
    args.next().map(slot_of)
}

fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter();
    matches!(
        (args.next(), args.next()),
        (Some(Arg::Simple(name)), Some(Arg::Simple(sub)))
            if name.eq_ignore_ascii_case(b"SCRIPT") && sub.eq_ignore_ascii_case(b"LOAD")
    )
}

/// `host:port` of a seed.
fn address_of(info: &ConnectionInfo) -> String {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        other => other.to_string(),
    }
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// A redirection's `host:port`; an empty host is the node that answered.
fn with_host(target: &str, answered_by: &str) -> String {
    match target.strip_prefix(':') {
        Some(port) => format!("{answered_by}:{port}"),
        None => target.to_owned(),
    }
}

fn client_error(what: impl Into<String>) -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "redis cluster", what.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys `k0..` spread over the slots; each pipeline sets one key and
    /// reads it back, every third as a transaction that reads a second key
    /// of the same slot.
    fn pipelines_over_many_slots(n: usize, round: usize) -> Vec<Pipeline> {
        (0..n)
            .map(|i| {
                let mut pipe = redis::pipe();
                let key = format!("{{k{i}}}");
                if i % 3 == 0 {
                    pipe.atomic()
                        .set(&key, round)
                        .ignore()
                        .get(&key)
                        .get(format!("{key}:other"));
                } else {
                    pipe.set(&key, round)
                        .ignore()
                        .get(&key)
                        .get(format!("{key}:other"));
                }
                pipe
            })
            .collect()
    }

    /// A client of `servers`, seeded with every node.
    async fn client_of(servers: &baton_testkit::RedisCluster) -> Cluster {
        let seeds = servers
            .seeds()
            .split(',')
            .map(|seed| redis::IntoConnectionInfo::into_connection_info(format!("redis://{seed}/")))
            .collect::<RedisResult<Vec<_>>>()
            .unwrap();
        Cluster::connect(seeds, AsyncConnectionConfig::new())
            .await
            .unwrap()
    }

    /// A transaction that Redis aborts (a command refused as it was
    /// queued) inside a request combined with others: its answer names
    /// the command's error, not only EXECABORT, and the others run.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_aborted_transaction_in_a_combined_request_says_why_and_the_others_run() {
        let servers = baton_testkit::RedisCluster::start(1, 0);
        let cluster = client_of(&servers).await;
        let mut fine = redis::pipe();
        fine.atomic().set("{a}x", 1).ignore().get("{a}x");
        let mut aborted = redis::pipe();
        aborted.atomic().set("{b}x", 1).ignore().cmd("GET"); // GET without a key
        let sent = cluster.requests_sent();
        let answers = cluster.query_each::<(u64,)>(&[fine, aborted]).await;
        assert_eq!(cluster.requests_sent() - sent, 1, "one combined request");
        assert_eq!(answers[0].as_ref().unwrap(), &(1,));
        let why = answers[1].as_ref().unwrap_err().to_string();
        assert!(why.contains("wrong number of arguments"), "{why}");
    }

    /// A slot half migrated by hand: `{m}a` and `{m}b` already on the
    /// target, `{m}c` still on the source.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_a_slot_migrates_moved_keys_are_asked_for_and_a_half_run_pipeline_is_not_resent()
    {
        let servers = baton_testkit::RedisCluster::start(3, 0);
        let cluster = client_of(&servers).await;
        let slot = slot_of(b"{m}");
        let source = servers.master_of(slot);
        let target = servers
            .shards()
            .into_iter()
            .find(|shard| !shard.serves(slot))
            .unwrap();
        let mut from = redis::Client::open(format!("redis://127.0.0.1:{}/", source.master_port))
            .unwrap()
            .get_connection()
            .unwrap();
        for (key, value) in [("{m}a", "1"), ("{m}b", "2"), ("{m}c", "3")] {
            let () = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .query(&mut from)
                .unwrap();
        }
        servers.start_slot_move(slot, target.master_port);
        servers.migrate_keys(
            source.master_port,
            target.master_port,
            &["{m}a".into(), "{m}b".into()],
        );

        // Both keys left: the source refuses both with ASK, and the target
        // answers both, each after its own ASKING.
        let mut moved = redis::pipe();
        moved.get("{m}a").get("{m}b");
        let answers = cluster.query_each::<(String, String)>(&[moved]).await;
        assert_eq!(answers[0].as_ref().unwrap(), &("1".into(), "2".into()));

        // One left, one did not: the source ran one and refused the
        // other, so the pipeline is not sent again.
        let mut half = redis::pipe();
        half.cmd("INCR").arg("{m}c").get("{m}a");
        let sent = cluster.requests_sent();
        let answers = cluster.query_each::<(i64, String)>(&[half]).await;
        assert!(answers[0].is_err(), "{:?}", answers[0]);
        assert_eq!(cluster.requests_sent() - sent, 1);
        let incremented: String = redis::cmd("GET").arg("{m}c").query(&mut from).unwrap();
        assert_eq!(incremented, "4", "the INCR ran once");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelines_of_many_slots_go_one_request_per_master_and_a_moved_one_alone() {
        let servers = baton_testkit::RedisCluster::start(3, 0);
        let cluster = client_of(&servers).await;
        let n = 30;
        let slots: Vec<u16> = (0..n)
            .map(|i| slot_of(format!("{{k{i}}}").as_bytes()))
            .collect();
        let masters = slots
            .iter()
            .map(|&s| cluster.slot_map().master_of(s).cloned())
            .collect::<std::collections::HashSet<_>>();
        assert_eq!(masters.len(), 3, "the keys span every master");

        let sent = cluster.requests_sent();
        let answers = cluster
            .query_each::<(u64, Option<u64>)>(&pipelines_over_many_slots(n, 1))
            .await;
        assert_eq!(cluster.requests_sent() - sent, 3, "one request per master");
        for answer in answers {
            assert_eq!(answer.unwrap(), (1, None));
        }

        // The client still believes the first key's slot is where it was.
        let moved = slots[0];
        let to = servers
            .shards()
            .into_iter()
            .find(|shard| !shard.serves(moved))
            .unwrap();
        servers.move_slot(moved, to.master_port);
        let sent = cluster.requests_sent();
        let answers = cluster
            .query_each::<(u64, Option<u64>)>(&pipelines_over_many_slots(n, 2))
            .await;
        for (i, answer) in answers.into_iter().enumerate() {
            assert_eq!(answer.unwrap(), (2, None), "pipeline {i}");
        }
        // The three combined requests, and the moved transaction alone at
        // its new master (MOVED there refused all of it: it ran once).
        assert_eq!(cluster.requests_sent() - sent, 4);
        assert_eq!(
            cluster.slot_map().master_of(moved).map(|m| m.to_string()),
            Some(format!("127.0.0.1:{}", to.master_port))
        );
    }

    fn slot_of_args(args: &[&str]) -> Option<u16> {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        slot_of_command(&cmd)
    }

    #[test]
    fn requests_route_by_their_first_key() {
        let key = "baton:{abc}:t:s:state";
        let slot = Some(slot_of(key.as_bytes()));
        assert_eq!(slot_of_args(&["HMGET", key, "version"]), slot);
        assert_eq!(slot_of_args(&["evalsha", "f00", "2", key, "other"]), slot);
        assert_eq!(slot_of_args(&["EVALSHA", "f00", "0", "arg"]), None);
        assert_eq!(slot_of_args(&["INFO", "server"]), None);
        assert_eq!(slot_of_args(&["CLUSTER", "SLOTS"]), None);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME").hget(key, "v").get("elsewhere");
        assert_eq!(slot_of_request(Request::Pipeline(&pipe, 0, 3)), slot);
        assert!(is_script_load(
            redis::cmd("script").arg("load").arg("return 1")
        ));
        assert!(!is_script_load(redis::cmd("SCRIPT").arg("FLUSH")));
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    #[test]
    fn the_slot_map_reads_cluster_slots_and_learns_moves() {
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(8192), Value::Int(16383), node("", 7001)]),
        ]);
        let map = SlotMap::from_cluster_slots(&answer, "10.0.0.9").unwrap();
        assert_eq!(map.master_of(0).map(|m| &**m), Some("10.0.0.1:7000"));
        assert_eq!(map.master_of(8191).map(|m| &**m), Some("10.0.0.1:7000"));
        assert_eq!(map.master_of(16383).map(|m| &**m), Some("10.0.0.9:7001"));
        assert_eq!(map.masters().len(), 2);
        let moved = map.with_moved(5, "10.0.0.2:7002".into());
        assert_eq!(moved.master_of(5).map(|m| &**m), Some("10.0.0.2:7002"));
        assert_eq!(moved.master_of(6).map(|m| &**m), Some("10.0.0.1:7000"));
        assert_eq!(moved.masters().len(), 3);
        // Keyless requests go round the masters.
        assert_ne!(map.route(None, 1), map.route(None, 2));

        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Array(vec![Value::Int(0)])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(99999),
                node("h", 1),
            ])]),
        ] {
            assert!(SlotMap::from_cluster_slots(&bad, "h").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refusals_name_where_to_go_and_an_empty_host_is_the_answering_node() {
        let server_error = |text: &str| {
            let parsed = redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap();
            match parsed {
                Value::ServerError(e) => e,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            Refusal::of_server_error(&server_error("MOVED 3999 127.0.0.1:6381")),
            Some(Refusal::Moved {
                slot: 3999,
                to: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            Refusal::of_server_error(&server_error("ASK 3999 :6381")),
            Some(Refusal::Ask { to: ":6381".into() })
        );
        assert_eq!(with_host(":6381", "10.1.1.1"), "10.1.1.1:6381");
        for waiting in [
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "READONLY You can't write against a read only replica.",
        ] {
            assert_eq!(
                Refusal::of_server_error(&server_error(waiting)),
                Some(Refusal::Wait),
                "{waiting}"
            );
        }
        assert_eq!(
            Refusal::of_server_error(&server_error("ERR wrong number of arguments")),
            None
        );
    }
}
