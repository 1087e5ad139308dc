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
/// Most sign-ins kept at once; the oldest goes first beyond it.
const MAX_SIGN_INS: usize = 10_000;

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
}

enum Mode {
    /// Everyone is this operator (loopback only).
    Open { csrf: String },
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
            mode: Mode::Open { csrf: random_hex() },
            sign_ins: Mutex::default(),
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
        })
    }

    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Self::from_yaml(path, &text)
    }

    pub fn is_open(&self) -> bool {
        matches!(self.mode, Mode::Open { .. })
    }

    /// Starts a sign-in for `token`; its cookie value, or `None` for an
    /// unknown token.
    pub fn sign_in(&self, token: &str) -> Option<String> {
        let Mode::Tokens(tokens) = &self.mode else {
            return None;
        };
        let (name, role) = tokens.get(&digest(token))?.clone();
        let id = random_hex();
        let mut sign_ins = self.sign_ins.lock().unwrap_or_else(|e| e.into_inner());
        sign_ins.retain(|_, s| s.since.elapsed() < SIGN_IN_TTL);
        if sign_ins.len() >= MAX_SIGN_INS
            && let Some(oldest) = sign_ins
                .iter()
                .min_by_key(|(_, s)| s.since)
                .map(|(id, _)| id.clone())
        {
            sign_ins.remove(&oldest);
        }
        sign_ins.insert(
            id.clone(),
            SignIn {
                name,
                role,
                csrf: random_hex(),
                since: Instant::now(),
            },
        );
        Some(id)
    }

    pub fn sign_out(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.sign_ins
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }

    /// The viewer of a request, `None` when it is not signed in.
    pub fn viewer(&self, headers: &HeaderMap) -> Option<Viewer> {
        match &self.mode {
            Mode::Open { csrf } => Some(Viewer {
                name: "dev (loopback)".into(),
                role: Role::Operator,
                csrf: csrf.clone(),
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
        assert_eq!(auth.sign_in("wrong-wrong-wrong"), None);
        let id = auth.sign_in("oooooooooooooooo").unwrap();
        let mut headers = HeaderMap::new();
        assert_eq!(auth.viewer(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("theme=dark; {COOKIE}={id}")).unwrap(),
        );
        let viewer = auth.viewer(&headers).unwrap();
        assert_eq!((viewer.name.as_str(), viewer.role), ("ops", Role::Operator));
        assert_eq!(viewer.csrf.len(), 64);
        auth.sign_out(&headers);
        assert_eq!(auth.viewer(&headers), None);
    }
}
