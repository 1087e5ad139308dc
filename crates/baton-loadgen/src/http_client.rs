//! The load generator's HTTP: hyper's pooled HTTP/1.1 client, every URL
//! parsed once before the run. The generator shares the machine with what
//! it measures, so whatever it spends per turn is taken from the system
//! under test; a general-purpose client (redirects, proxies, URL parsing
//! with IDNA on every request) cost it about a third more CPU per turn.

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

/// Why a request got no complete answer.
pub(crate) enum Failure {
    /// No connection: the server never saw the request.
    Connect(String),
    /// The request may have reached the server; its answer was lost.
    Dropped(String),
}

impl Failure {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Failure::Connect(_) => "CONNECT",
            Failure::Dropped(_) => "DROPPED",
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) | Failure::Dropped(e) => f.write_str(e),
        }
    }
}

pub(crate) struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Tenant and bearer token, sent to Baton (never to an agent).
    auth: HeaderMap,
}

impl Http {
    pub(crate) fn new(
        connections: usize,
        tenant: Option<&str>,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut auth = HeaderMap::new();
        if let Some(t) = tenant {
            auth.insert(
                HeaderName::from_static("x-baton-tenant"),
                HeaderValue::from_str(t)
                    .map_err(|_| anyhow::anyhow!("--tenant: not valid in an HTTP header"))?,
            );
        }
        if let Some(t) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {t}"))
                .map_err(|_| anyhow::anyhow!("--token: not valid in an HTTP header"))?;
            value.set_sensitive(true);
            auth.insert(AUTHORIZATION, value);
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(connections)
            .pool_idle_timeout(std::time::Duration::from_secs(5))
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .build(connector);
        Ok(Self { client, auth })
    }

    /// POSTs `body` as JSON; `to_baton` adds the tenant and token.
    pub(crate) async fn post_json(
        &self,
        uri: &Uri,
        body: &impl serde::Serialize,
        to_baton: bool,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let body = serde_json::to_vec(body).map_err(|e| Failure::Connect(e.to_string()))?;
        self.send(Method::POST, uri, Bytes::from(body), to_baton)
            .await
    }

    /// GETs from Baton (with the tenant and token).
    pub(crate) async fn get(&self, uri: &Uri) -> Result<(StatusCode, Bytes), Failure> {
        self.send(Method::GET, uri, Bytes::new(), true).await
    }

    /// POSTs `body` as JSON asking for an event stream; the answer's body
    /// is left to read as it arrives.
    pub(crate) async fn post_stream(
        &self,
        uri: &Uri,
        body: &impl serde::Serialize,
        to_baton: bool,
    ) -> Result<http::Response<hyper::body::Incoming>, Failure> {
        let body = serde_json::to_vec(body).map_err(|e| Failure::Connect(e.to_string()))?;
        let accept = (ACCEPT, HeaderValue::from_static("text/event-stream"));
        self.request(Method::POST, uri, Bytes::from(body), to_baton, Some(accept))
            .await
    }

    /// GETs an event stream from Baton; the body is left to read.
    pub(crate) async fn get_stream(
        &self,
        uri: &Uri,
    ) -> Result<http::Response<hyper::body::Incoming>, Failure> {
        let accept = (ACCEPT, HeaderValue::from_static("text/event-stream"));
        self.request(Method::GET, uri, Bytes::new(), true, Some(accept))
            .await
    }

    async fn send(
        &self,
        method: Method,
        uri: &Uri,
        body: Bytes,
        to_baton: bool,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let answer = self.request(method, uri, body, to_baton, None).await?;
        let status = answer.status();
        let body = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| Failure::Dropped(e.to_string()))?
            .to_bytes();
        Ok((status, body))
    }

    async fn request(
        &self,
        method: Method,
        uri: &Uri,
        body: Bytes,
        to_baton: bool,
        header: Option<(HeaderName, HeaderValue)>,
    ) -> Result<http::Response<hyper::body::Incoming>, Failure> {
        let mut request = Request::builder().method(method).uri(uri.clone());
        if !body.is_empty() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let mut request = request
            .body(Full::new(body))
            .map_err(|e| Failure::Connect(e.to_string()))?;
        if to_baton {
            request.headers_mut().extend(self.auth.clone());
        }
        self.client.request(request).await.map_err(|e| {
            if e.is_connect() {
                Failure::Connect(describe(e))
            } else {
                Failure::Dropped(describe(e))
            }
        })
    }
}

/// A URL given on the command line, with `path` appended, parsed once.
pub(crate) fn uri(flag: &str, base: &str, path: &str) -> anyhow::Result<Uri> {
    let text = format!("{}{path}", base.trim_end_matches('/'));
    let uri: Uri = text
        .parse()
        .map_err(|e| anyhow::anyhow!("{flag}: {text:?} is not a URL: {e}"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http") && uri.host().is_some(),
        "{flag}: {base:?} must be an http:// URL with a host"
    );
    Ok(uri)
}

/// hyper's errors keep their cause ("Connection refused") in their source:
/// `{:#}` prints both.
fn describe(e: hyper_util::client::legacy::Error) -> String {
    format!("{:#}", anyhow::Error::new(e))
}
