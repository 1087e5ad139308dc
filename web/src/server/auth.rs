//! Who may look and who may act. Dashboard tokens come from a YAML file
//! (a mounted Secret under Kubernetes), each with a name and a role;
//! signing in with one starts a sign-in held in memory and named by an
//! HttpOnly, SameSite=Strict cookie. Every action form carries the
//! sign-in's CSRF token, checked against the cookie's sign-in.
//!
//! Without a tokens file the dashboard is open, and only on a loopback
//! address (`baton dev`): every request is the operator `dev (loopback)`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::model::{Role, Viewer};

/// The cookie naming a sign-in.
pub const COOKIE: &str = "baton_dashboard";
/// How long a sign-in lasts.
pub const SIGN_IN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Shortest token accepted in the tokens file.
pub const MIN_TOKEN_LEN: usize = 16;
/// Most sign-ins one principal (one token of the file) holds at once: its
/// oldest goes beyond it. Per principal, so nobody's sign-ins can push out
/// another's: the table holds at most this many per listed token.
pub const MAX_SIGN_INS_PER_PRINCIPAL: usize = 32;
/// Failed sign-ins one client address may make per [`FAILURE_WINDOW`];
/// beyond, it is answered 429 until the window ends.
pub const MAX_FAILURES_PER_WINDOW: u32 = 20;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// How long an open dashboard's CSRF token is issued; the previous one
/// is still taken, so a form loaded just before a change works.
pub const OPEN_CSRF_PERIOD: Duration = Duration::from_secs(3600);
/// Client addresses whose failures are tracked at once (a flood of
/// addresses cannot grow the table without bound: the quietest go).
const MAX_TRACKED_CLIENTS: usize = 4096;

/// One entry of the tokens file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    token: String,
}

struct SignIn {
    name: String,
    role: Role,
    csrf: String,
    since: Instant,
}

pub struct Auth {
    mode: Mode,
    sign_ins: Mutex<HashMap<String, SignIn>>,
    /// Failed sign-ins per client address: (window start, count).
    failures: Mutex<HashMap<std::net::IpAddr, (Instant, u32)>>,
    started: Instant,
}

/// Why a sign-in did not start.
#[derive(Debug, PartialEq, Eq)]
pub enum SignInRefused {
    /// Not a token of the file.
    Unknown,
    /// This address failed too often lately; try again after this long.
    TooMany(Duration),
}

enum Mode {
    /// Everyone is this operator (loopback only). Its CSRF tokens are
    /// derived from `secret` and the current period, so they change.
    Open { secret: [u8; 32] },
    /// SHA-256 of each token → its name and role: lookups compare digests,
    /// so the time they take says nothing about a token's characters.
    Tokens(HashMap<[u8; 32], (String, Role)>),
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Auth {
    /// Open to everyone: for a dashboard on a loopback address only.
    pub fn open() -> Self {
        Self {
            mode: Mode::Open {
                secret: rand::random(),
            },
            sign_ins: Mutex::default(),
            failures: Mutex::default(),
            started: Instant::now(),
        }
    }

    /// The open dashboard's CSRF token of period `period`.
    fn open_csrf(secret: &[u8; 32], period: u64) -> String {
        let mut hasher = Sha256::new();
        hasher.update(secret);
        hasher.update(period.to_be_bytes());
        hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn open_period(&self) -> u64 {
        self.started.elapsed().as_secs() / OPEN_CSRF_PERIOD.as_secs()
    }

    /// Whether `given` is the CSRF token of `viewer`'s forms (on an open
    /// dashboard: this period's or the previous one's). Compared by digest,
    /// so the time taken says nothing about the token's characters.
    pub fn csrf_matches(&self, viewer: &Viewer, given: &str) -> bool {
        if given.is_empty() {
            return false;
        }
        let same = |expected: &str| digest(expected) == digest(given);
        match &self.mode {
            Mode::Open { secret } => {
                let now = self.open_period();
                same(&Self::open_csrf(secret, now))
                    || (now > 0 && same(&Self::open_csrf(secret, now - 1)))
            }
            Mode::Tokens(_) => same(&viewer.csrf),
        }
    }

    /// The tokens of a YAML list of `{name, role, token}`; every problem
    /// names the file, the entry and the rule.
    pub fn from_yaml(path: &Path, text: &str) -> Result<Self, String> {
        let file = path.display();
        let entries: Vec<TokenEntry> = serde_yaml::from_str(text).map_err(|e| {
            format!("{file}: expected a list of {{name, role: viewer|operator, token}}: {e}")
        })?;
        if entries.is_empty() {
            return Err(format!("{file}: lists no token; nobody could sign in"));
        }
        let mut tokens = HashMap::new();
        for (i, entry) in entries.into_iter().enumerate() {
            if entry.name.trim().is_empty() || entry.name.chars().any(char::is_control) {
                return Err(format!(
                    "{file}: entry {i}: name must be non-empty, without control characters"
                ));
            }
            if entry.token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "{file}: entry {i} ({}): token must be at least {MIN_TOKEN_LEN} characters",
                    entry.name
                ));
            }
            if tokens
                .insert(digest(&entry.token), (entry.name.clone(), entry.role))
                .is_some()
            {
                return Err(format!(
                    "{file}: entry {i} ({}): the same token is listed twice",
                    entry.name
                ));
            }
        }
        Ok(Self {
            mode: Mode::Tokens(tokens),
            sign_ins: Mutex::default(),
            failures: Mutex::default(),
            started: Instant::now(),
        })
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::from_yaml(path, &text)
    }

    pub fn is_open(&self) -> bool {
        matches!(self.mode, Mode::Open { .. })
    }

    /// Starts a sign-in for `token` from `client`; its cookie value. An
    /// unknown token counts against the client's address, and an address
    /// that failed [`MAX_FAILURES_PER_WINDOW`] times in the last
    /// [`FAILURE_WINDOW`] is refused before its token is looked at. Every
    /// failure is logged with the address (never the token).
    pub fn sign_in(
        &self,
        token: &str,
        client: Option<std::net::IpAddr>,
    ) -> Result<String, SignInRefused> {
        // Without a known address, all such clients share one allowance.
        let client = client.unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        if let Some(wait) = self.failures_exhausted(client) {
            tracing::warn!(%client, "dashboard sign-in refused: too many failed sign-ins from this address");
            return Err(SignInRefused::TooMany(wait));
        }
        let known = match &self.mode {
            Mode::Tokens(tokens) => tokens.get(&digest(token)).cloned(),
            Mode::Open { .. } => None,
        };
        let Some((name, role)) = known else {
            let failed = self.count_failure(client);
            tracing::warn!(%client, failed, "dashboard sign-in failed: unknown token");
            return Err(SignInRefused::Unknown);
        };
        let id = random_hex();
        let mut sign_ins = self.sign_ins.lock().unwrap_or_else(|e| e.into_inner());
        sign_ins.retain(|_, s| s.since.elapsed() < SIGN_IN_TTL);
        let held = sign_ins.values().filter(|s| s.name == name).count();
        if held >= MAX_SIGN_INS_PER_PRINCIPAL
            && let Some(oldest) = sign_ins
                .iter()
                .filter(|(_, s)| s.name == name)
                .min_by_key(|(_, s)| s.since)
                .map(|(id, _)| id.clone())
        {
            sign_ins.remove(&oldest);
        }
        tracing::info!(%client, who = %name, "dashboard sign-in");
        sign_ins.insert(
            id.clone(),
            SignIn {
                name,
                role,
                csrf: random_hex(),
                since: Instant::now(),
            },
        );
        Ok(id)
    }

    /// How long `client` must wait, when it failed too often lately.
    fn failures_exhausted(&self, client: std::net::IpAddr) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let (since, count) = failures.get(&client)?;
        let age = since.elapsed();
        (age < FAILURE_WINDOW && *count >= MAX_FAILURES_PER_WINDOW).then(|| FAILURE_WINDOW - age)
    }

    /// Counts a failure of `client`; returns its failures in this window.
    fn count_failure(&self, client: std::net::IpAddr) -> u32 {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.retain(|_, (since, _)| since.elapsed() < FAILURE_WINDOW);
        if failures.len() >= MAX_TRACKED_CLIENTS
            && !failures.contains_key(&client)
            && let Some(quietest) = failures
                .iter()
                .min_by_key(|(_, (_, count))| *count)
                .map(|(ip, _)| *ip)
        {
            failures.remove(&quietest);
        }
        let entry = failures.entry(client).or_insert((Instant::now(), 0));
        entry.1 += 1;
        entry.1
    }

    /// Whether the request's sign-in (its cookie) still holds: what a live
    /// stream asks before each event, so it ends with its sign-in.
    pub fn still_signed_in(&self, headers: &HeaderMap) -> bool {
        self.viewer(headers).is_some()
    }

    pub fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.sign_ins
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }

    /// The viewer an API client's `Authorization: Bearer <dashboard
    /// token>` names: `Ok(None)` without the header, `Err` for a token the
    /// file does not list (or any token on an open dashboard, which has
    /// none).
    pub fn bearer_viewer(&self, headers: &HeaderMap) -> Result<Option<Viewer>, String> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Ok(None);
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or("authorization: expected `Bearer <dashboard token>`")?;
        let Mode::Tokens(tokens) = &self.mode else {
            return Err("authorization: this dashboard is open and takes no token".into());
        };
        let (name, role) = tokens
            .get(&digest(token))
            .cloned()
            .ok_or("authorization: not a token of the dashboard's tokens file")?;
        Ok(Some(Viewer {
            name,
            role,
            // An API client sends its token with every request: no form,
            // so nothing to forge across sites.
            csrf: String::new(),
            open: false,
        }))
    }

    /// The viewer of a request, `None` when it is not signed in.
    pub fn viewer(&self, headers: &HeaderMap) -> Option<Viewer> {
        match &self.mode {
            Mode::Open { secret } => Some(Viewer {
                name: "dev (loopback)".into(),
                role: Role::Operator,
                csrf: Self::open_csrf(secret, self.open_period()),
                open: true,
            }),
            Mode::Tokens(_) => {
                let id = cookie(headers)?;
                let sign_ins = self.sign_ins.lock().unwrap_or_else(|e| e.into_inner());
                let s = sign_ins.get(&id)?;
                (s.since.elapsed() < SIGN_IN_TTL).then(|| Viewer {
                    name: s.name.clone(),
                    role: s.role,
                    csrf: s.csrf.clone(),
                    open: false,
                })
            }
        }
    }
}

/// The sign-in id in the request's cookie.
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// `Set-Cookie` for a sign-in (`Secure` behind HTTPS, as a proxy says).
pub fn set_cookie(id: &str, headers: &HeaderMap) -> HeaderValue {
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let value = format!(
        "{COOKIE}={id}; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SIGN_IN_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static(
        "baton_dashboard=; Path=/dashboard; HttpOnly; SameSite=Strict; Max-Age=0",
    )
}

/// Lets signed-in requests through with their [`Viewer`] in the request's
/// extensions. Others: a page is sent to the sign-in page, anything else
/// (server functions, live updates, actions) gets 401.
pub async fn require_viewer(auth: &Auth, mut request: Request, next: Next) -> Response {
    match auth.viewer(request.headers()) {
        Some(viewer) => {
            request.extensions_mut().insert(viewer);
            next.run(request).await
        }
        None if request.method() == Method::GET
            && !request.uri().path().starts_with("/dashboard/api/")
            && !request.uri().path().starts_with("/dashboard/live/") =>
        {
            Redirect::to("/dashboard/signin").into_response()
        }
        None => (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({
                "status": "UNAUTHENTICATED",
                "error": "sign in first: POST /dashboard/signin with a dashboard token",
            })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(text: &str) -> Result<Auth, String> {
        Auth::from_yaml(Path::new("tokens.yaml"), text)
    }

    #[test]
    fn the_tokens_file_is_checked_entry_by_entry() {
        let e = auth("- {name: a, role: admin, token: aaaaaaaaaaaaaaaa}")
            .err()
            .unwrap();
        assert!(
            e.contains("tokens.yaml") && e.contains("viewer|operator"),
            "{e}"
        );
        let e = auth("- {name: a, role: viewer, token: short}")
            .err()
            .unwrap();
        assert!(
            e.contains("entry 0 (a)") && e.contains("16 characters"),
            "{e}"
        );
        let e = auth("- {name: a, role: viewer, token: aaaaaaaaaaaaaaaa}\n- {name: b, role: operator, token: aaaaaaaaaaaaaaaa}")
            .err()
            .unwrap();
        assert!(e.contains("entry 1 (b)") && e.contains("twice"), "{e}");
        let e = auth("[]").err().unwrap();
        assert!(e.contains("no token"), "{e}");
        let e = auth("- {name: a, role: viewer, token: aaaaaaaaaaaaaaaa, extra: 1}")
            .err()
            .unwrap();
        assert!(e.contains("extra"), "{e}");
    }

    #[test]
    fn a_sign_in_names_its_viewer_through_the_cookie() {
        let auth = auth(
            "- {name: vic, role: viewer, token: vvvvvvvvvvvvvvvv}\n- {name: ops, role: operator, token: oooooooooooooooo}",
        )
        .unwrap();
        assert_eq!(
            auth.sign_in("wrong-wrong-wrong", None),
            Err(SignInRefused::Unknown)
        );
        let id = auth.sign_in("oooooooooooooooo", None).unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(auth.viewer(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("theme=dark; {COOKIE}={id}")).unwrap(),
        );
        let viewer = auth.viewer(&headers).unwrap();
        assert_eq!((viewer.name.as_str(), viewer.role), ("ops", Role::Operator));
        assert_eq!(viewer.csrf.len(), 64);
        assert!(auth.csrf_matches(&viewer, &viewer.csrf));
        assert!(!auth.csrf_matches(&viewer, ""));
        assert!(!auth.csrf_matches(&viewer, &"0".repeat(64)));
        auth.sign_out(&headers);
        assert_eq!(auth.viewer(&headers), None);
    }

    #[test]
    fn no_principal_evicts_another_and_failures_are_limited_per_address() {
        let auth = auth(
            "- {name: vic, role: viewer, token: vvvvvvvvvvvvvvvv}\n- {name: ops, role: operator, token: oooooooooooooooo}",
        )
        .unwrap();
        let ops = auth.sign_in("oooooooooooooooo", None).unwrap();
        let cookie = |id: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                header::COOKIE,
                HeaderValue::from_str(&format!("{COOKIE}={id}")).unwrap(),
            );
            h
        };
        let vic: Vec<String> = (0..MAX_SIGN_INS_PER_PRINCIPAL * 3)
            .map(|_| auth.sign_in("vvvvvvvvvvvvvvvv", None).unwrap())
            .collect();
        assert!(
            auth.still_signed_in(&cookie(&ops)),
            "a viewer's sign-ins evicted an operator's"
        );
        assert!(
            !auth.still_signed_in(&cookie(&vic[0])),
            "the viewer's oldest went"
        );
        assert!(auth.still_signed_in(&cookie(vic.last().unwrap())));

        let attacker = Some("192.0.2.7".parse().unwrap());
        for _ in 0..MAX_FAILURES_PER_WINDOW {
            assert_eq!(
                auth.sign_in("wrong-wrong-wrong", attacker),
                Err(SignInRefused::Unknown)
            );
        }
        // Past the allowance even the right token waits: the address is
        // refused before its token is looked at.
        assert!(matches!(
            auth.sign_in("oooooooooooooooo", attacker),
            Err(SignInRefused::TooMany(_))
        ));
        // Another address is not affected.
        assert!(
            auth.sign_in("oooooooooooooooo", Some("192.0.2.8".parse().unwrap()))
                .is_ok()
        );
    }

    #[test]
    fn an_open_dashboards_csrf_token_is_secret_and_takes_the_previous_period() {
        let auth = Auth::open();
        let viewer = auth.viewer(&HeaderMap::new()).unwrap();
        assert!(auth.csrf_matches(&viewer, &viewer.csrf));
        assert!(!auth.csrf_matches(&viewer, "x"));
        assert_ne!(
            viewer.csrf,
            Auth::open().viewer(&HeaderMap::new()).unwrap().csrf
        );
        let Mode::Open { secret } = &auth.mode else {
            unreachable!()
        };
        assert_ne!(Auth::open_csrf(secret, 0), Auth::open_csrf(secret, 1));
    }
}
