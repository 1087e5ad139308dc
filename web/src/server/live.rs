//! Live updates: server-sent events carrying a page's data, read once a
//! second per open page (pages with the same filters share the read). The
//! hydrated page replaces what it shows with each event; without
//! JavaScript nothing connects.

use crate::server::error::PageError;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;

use crate::model::{Filters, SessionsData};
use crate::server::{Dashboard, data};

/// How often an open page's data is read again.
pub const EVERY: Duration = Duration::from_secs(1);

/// How often a session page's running-turn output is read again: a
/// reader sees the words come in small runs, and an idle session costs one
/// read of its lease.
pub const OUTPUT_EVERY: Duration = Duration::from_millis(250);

/// Reads `read` every `every` and sends what it returns; an error is
/// sent as an `error` event. Every read is sent, changed or not: the data
/// carries the server's clock, which lease countdowns are computed from.
///
/// The stream ends when the sign-in that opened it does (signed out or
/// expired): it is asked before every event.
fn changes<T, F, Fut>(
    dashboard: Arc<Dashboard>,
    headers: HeaderMap,
    every: Duration,
    read: F,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    T: Serialize,
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, PageError>> + Send,
{
    let stream = futures::stream::unfold(
        (read, tokio::time::interval(every), dashboard, headers),
        |(read, mut tick, dashboard, headers)| async move {
            tick.tick().await;
            if !dashboard.auth.still_signed_in(&headers) {
                return None;
            }
            let event = match read().await {
                Ok(value) => {
                    Event::default().data(serde_json::to_string(&value).unwrap_or_default())
                }
                Err(e) => Event::default().event("error").data(e.to_string()),
            };
            Some((Ok(event), (read, tick, dashboard, headers)))
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::default())
}

pub async fn sessions(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let filters = Filters::from_query(|name| query.get(name).cloned());
    changes(dashboard.clone(), headers, EVERY, move || {
        let (dashboard, filters) = (dashboard.clone(), filters.clone());
        async move { dashboard.live_pages.sessions(&dashboard, &filters).await }
    })
}

/// What the open sessions pages were sent last, per filter: pages with the
/// same filters share one read a second, however many are open.
#[derive(Default)]
pub struct SharedReads {
    sessions: tokio::sync::Mutex<HashMap<Filters, (Instant, SessionsData)>>,
}

impl SharedReads {
    pub async fn sessions(
        &self,
        dashboard: &Dashboard,
        filters: &Filters,
    ) -> Result<SessionsData, PageError> {
        // Held across the read: a second page with these filters waits for
        // the first one's read instead of making its own.
        let mut cache = self.sessions.lock().await;
        if let Some((at, data)) = cache.get(filters)
            && at.elapsed() < EVERY.mul_f32(0.9)
        {
            return Ok(data.clone());
        }
        let data = data::sessions(dashboard, filters).await?;
        cache.retain(|_, (at, _)| at.elapsed() < EVERY * 10);
        cache.insert(filters.clone(), (Instant::now(), data.clone()));
        Ok(data)
    }
}

pub async fn session(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path((tenant, session)): Path<(String, String)>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    changes(dashboard.clone(), headers, EVERY, move || {
        let (dashboard, tenant, session) = (dashboard.clone(), tenant.clone(), session.clone());
        async move { data::session(&dashboard, &tenant, &session, false).await }
    })
}

pub async fn replicas(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    changes(dashboard.clone(), headers, EVERY, move || {
        let dashboard = dashboard.clone();
        async move { data::replicas(&dashboard).await }
    })
}

pub async fn output(
    State(dashboard): State<Arc<Dashboard>>,
    headers: HeaderMap,
    Path((tenant, session)): Path<(String, String)>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    changes(dashboard.clone(), headers, OUTPUT_EVERY, move || {
        let (dashboard, tenant, session) = (dashboard.clone(), tenant.clone(), session.clone());
        async move { data::output(&dashboard, &tenant, &session).await }
    })
}
