//! A fake GitHub and GitLab REST API for tests (`test-support`): the wire protocol of
//! pull and merge requests and of a GitHub App's token exchange, on 127.0.0.1.
//!
//! - GitHub at the base URL ([`FakeForge::github_api`]): `POST/GET
//!   /repos/{owner}/{repo}/pulls` with `Authorization: Bearer <token>` (or `token
//!   <token>`); a second open pull request for the same head and base is GitHub's 422.
//! - GitLab under `/api/v4` ([`FakeForge::gitlab_api`]): `POST/GET
//!   /projects/{url-encoded path}/merge_requests` with `PRIVATE-TOKEN: <token>`; a second
//!   open merge request for the same source branch is GitLab's 409.
//! - `POST /app/installations/{id}/access_tokens` with a JWT (`app` module): verified
//!   with the app's public key (RS256), its `iss`, `iat` and `exp`; the token it mints is
//!   then accepted like the configured one, until its `expires_at`, and only for the
//!   repositories the exchange named (`"repositories": [...]`; others are GitHub's 404),
//!   as GitHub scopes one. [`FakeForge::on_mint`] tells a test of each token minted (a
//!   git server of the test's then takes it too).
//!
//! Everything is held in memory and shown to the test ([`FakeForge::pulls`],
//! [`FakeForge::seen`], [`FakeForge::minted`]); [`FakeForge::fail_next`] answers the
//! next calls with 502, as a forge's load balancer does; [`FakeForge::hold_created`]
//! keeps a created pull request's answer from its creator for as long as a test likes.

mod app;
mod gitlab;

use crate::forge::Forge;
pub use app::{AppKey, Minted, generate_app_key};
use axum::{
    Router,
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

/// A pull or merge request the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub forge: Forge,
    /// `owner/name`, `group/sub/name` (decoded).
    pub repo: String,
    pub number: u64,
    pub head: String,
    pub base: String,
    /// As sent (GitLab's `Draft: ` prefix included).
    pub title: String,
    pub body: String,
    pub draft: bool,
}

/// A request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// The path as sent (percent-encoded).
    pub path: String,
    pub query: Option<String>,
    pub accept: Option<String>,
    pub user_agent: Option<String>,
    pub api_version: Option<String>,
    /// The header that carried the token: `authorization`, `private-token`, or none.
    pub auth_header: Option<&'static str>,
    pub authorized: bool,
    pub body: Option<Value>,
}

#[derive(Default)]
struct Inner {
    /// Tokens the API takes.
    tokens: HashMap<String, Grant>,
    on_mint: Option<OnMint>,
    apps: HashMap<String, app::FakeApp>,
    token_lifetime: Option<Duration>,
    minted: Vec<Minted>,
    fail_next: usize,
    /// Answers to GitHub pull requests created are held while set ([`FakeForge::hold_created`]).
    hold: bool,
    held: usize,
    pulls: Vec<Stored>,
    seen: Vec<Seen>,
}

/// What a token may do: until when (None: for ever), on which repositories (None: all).
#[derive(Default)]
struct Grant {
    until: Option<SystemTime>,
    repositories: Option<Vec<String>>,
}

/// What a test asked to be told of each token minted ([`FakeForge::on_mint`]).
type OnMint = Arc<dyn Fn(&Minted) + Send + Sync>;

type Shared = Arc<Mutex<Inner>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fake, serving until dropped.
pub struct FakeForge {
    base: String,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeForge {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeForge {
    /// Serve on 127.0.0.1 (a port of its own), taking `token` for both APIs.
    pub async fn start(token: &str) -> Self {
        let shared = Shared::default();
        lock(&shared)
            .tokens
            .insert(token.to_owned(), Grant::default());
        let router = Router::new()
            .route("/repos/{owner}/{repo}/pulls", post(gh_create).get(gh_list))
            .route(
                "/api/v4/projects/{id}/merge_requests",
                post(gitlab::create).get(gitlab::list),
            )
            .route(
                "/app/installations/{id}/access_tokens",
                post(app::access_tokens),
            )
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the fake forge");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            base,
            shared,
            server,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.base
    }

    pub fn github_api(&self) -> url::Url {
        url::Url::parse(&self.base).expect("a URL")
    }

    pub fn gitlab_api(&self) -> url::Url {
        url::Url::parse(&format!("{}/api/v4", self.base)).expect("a URL")
    }

    /// Serve `app_id`'s token exchange for `installation_id`, its JWTs verified with
    /// `public_key_pem` (`RSA PUBLIC KEY`, as [`generate_app_key`] makes).
    pub fn add_app(&self, app_id: &str, public_key_pem: &str, installation_id: u64) {
        let mut inner = lock(&self.shared);
        let app = inner
            .apps
            .entry(app_id.to_owned())
            .or_insert_with(|| app::FakeApp::new(public_key_pem));
        app.installations.push(installation_id);
    }

    /// How long tokens minted from now on live (GitHub's: an hour, the default).
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        lock(&self.shared).token_lifetime = Some(lifetime);
    }

    /// Answer the next `n` calls, whatever they are, with 502.
    pub fn fail_next(&self, n: usize) {
        lock(&self.shared).fail_next = n;
    }

    /// While `on`, a GitHub pull request is created and stored, but the answer to its
    /// creator is held until this is called with `false`: a creator killed meanwhile
    /// opened it without ever hearing so, and must find it when it tries again.
    pub fn hold_created(&self, on: bool) {
        lock(&self.shared).hold = on;
    }

    /// How many answers to pull requests created were held so far.
    pub fn held(&self) -> usize {
        lock(&self.shared).held
    }

    /// The pull and merge requests opened, in order.
    pub fn pulls(&self) -> Vec<Stored> {
        lock(&self.shared).pulls.clone()
    }

    /// Every request, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared).seen.clone()
    }

    /// Call `f` with each installation token minted from now on, as it is minted.
    pub fn on_mint(&self, f: impl Fn(&Minted) + Send + Sync + 'static) {
        lock(&self.shared).on_mint = Some(Arc::new(f));
    }

    /// The installation tokens minted, in order.
    pub fn minted(&self) -> Vec<Minted> {
        lock(&self.shared).minted.clone()
    }
}

fn answer(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Record the request, then fail it if told to, then check its token: `Some` is the
/// answer. `auth` is the header the forge takes it in (GitHub's `authorization`,
/// GitLab's `private-token`); `None` for the app route, which checks its JWT itself.
fn enter(
    shared: &Shared,
    (method, uri, headers): (&Method, &Uri, &HeaderMap),
    body: Option<Value>,
    auth: Option<&'static str>,
) -> Option<Response> {
    let mut inner = lock(shared);
    let presented = match auth {
        Some("private-token") => header(headers, "private-token"),
        Some(name) => header(headers, name).map(|v| {
            let token = v
                .strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("token "));
            token.unwrap_or_default().to_owned()
        }),
        None => None,
    };
    let now = SystemTime::now();
    let grant = presented.as_ref().and_then(|t| inner.tokens.get(t));
    let authorized = grant.is_some_and(|g| g.until.is_none_or(|u| u > now));
    // A token scoped to other repositories does not see this one: GitHub's 404.
    let hidden = grant
        .and_then(|g| g.repositories.as_ref())
        .is_some_and(|names| {
            let name = uri
                .path()
                .strip_prefix("/repos/")
                .and_then(|p| p.split('/').nth(1));
            !name.is_some_and(|n| names.iter().any(|r| r == n))
        });
    inner.seen.push(Seen {
        method: method.to_string(),
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
        accept: header(headers, "accept"),
        user_agent: header(headers, "user-agent"),
        api_version: header(headers, "x-github-api-version"),
        auth_header: auth.filter(|name| headers.contains_key(*name)),
        authorized,
        body,
    });
    if inner.fail_next > 0 {
        inner.fail_next -= 1;
        return Some((StatusCode::BAD_GATEWAY, "<html>502 Bad Gateway</html>").into_response());
    }
    match (auth, presented, authorized) {
        (None, _, _) => None,
        (_, _, true) if hidden => Some(answer(404, json!({"message": "Not Found"}))),
        (_, _, true) => None,
        (Some("private-token"), _, false) => {
            Some(answer(401, json!({"message": "401 Unauthorized"})))
        }
        (_, None, false) => Some(answer(401, json!({"message": "Requires authentication"}))),
        (_, Some(_), false) => Some(answer(
            401,
            json!({"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest"}),
        )),
    }
}

fn text(body: &Value, field: &str) -> Option<String> {
    body.get(field).and_then(Value::as_str).map(str::to_owned)
}

fn github_pull(base: &str, p: &Stored) -> Value {
    json!({
        "number": p.number,
        "html_url": format!("{base}/{}/pull/{}", p.repo, p.number),
        "state": "open",
        "draft": p.draft,
        "title": p.title,
        "body": p.body,
        "head": {"ref": p.head},
        "base": {"ref": p.base},
    })
}

/// The next number of `repo`'s pull requests.
fn next_number(inner: &Inner, forge: Forge, repo: &str) -> u64 {
    1 + inner
        .pulls
        .iter()
        .filter(|p| p.forge == forge && p.repo == repo)
        .count() as u64
}

fn base_url(headers: &HeaderMap) -> String {
    format!("http://{}", header(headers, "host").unwrap_or_default())
}

async fn gh_create(
    State(shared): State<Shared>,
    Path((owner, name)): Path<(String, String)>,
    (method, uri, headers): (Method, Uri, HeaderMap),
    body: Bytes,
) -> Response {
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(r) = enter(
        &shared,
        (&method, &uri, &headers),
        json.clone(),
        Some("authorization"),
    ) {
        return r;
    }
    let Some(json) = json else {
        return answer(400, json!({"message": "Problems parsing JSON"}));
    };
    let repo = format!("{owner}/{name}");
    let fields = (
        text(&json, "head"),
        text(&json, "base"),
        text(&json, "title"),
    );
    let (Some(head), Some(base), Some(title)) = fields else {
        return answer(
            422,
            json!({"message": "Validation Failed", "errors": [{"resource": "PullRequest", "code": "missing_field"}]}),
        );
    };
    let (answered, hold) = match gh_store(
        &shared,
        &headers,
        (&owner, repo),
        (head, base, title),
        &json,
    ) {
        Ok(stored) => stored,
        Err(refused) => return *refused,
    };
    // A test's switch, flipped by hand: checking it often is all the wait needs.
    while hold && holding(&shared) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    answer(201, answered)
}

fn holding(shared: &Shared) -> bool {
    lock(shared).hold
}

/// A new pull request stored: its answer, and whether the answer is held; or GitHub's
/// 422 for one that is open already.
fn gh_store(
    shared: &Shared,
    headers: &HeaderMap,
    (owner, repo): (&str, String),
    (head, base, title): (String, String, String),
    json: &Value,
) -> Result<(Value, bool), Box<Response>> {
    let mut inner = lock(shared);
    let open = |p: &&Stored| {
        p.forge == Forge::GitHub && p.repo == repo && p.head == head && p.base == base
    };
    if inner.pulls.iter().any(|p| open(&p)) {
        return Err(Box::new(answer(
            422,
            json!({"message": "Validation Failed", "errors": [{
                "resource": "PullRequest", "code": "custom",
                "message": format!("A pull request already exists for {owner}:{head}."),
            }], "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"}),
        )));
    }
    let pull = Stored {
        forge: Forge::GitHub,
        number: next_number(&inner, Forge::GitHub, &repo),
        repo,
        head,
        base,
        title,
        body: text(json, "body").unwrap_or_default(),
        draft: json.get("draft").and_then(Value::as_bool).unwrap_or(false),
    };
    let answered = github_pull(&base_url(headers), &pull);
    inner.pulls.push(pull);
    let hold = inner.hold;
    inner.held += usize::from(hold);
    Ok((answered, hold))
}

async fn gh_list(
    State(shared): State<Shared>,
    Path((owner, name)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    (method, uri, headers): (Method, Uri, HeaderMap),
) -> Response {
    if let Some(r) = enter(
        &shared,
        (&method, &uri, &headers),
        None,
        Some("authorization"),
    ) {
        return r;
    }
    let repo = format!("{owner}/{name}");
    // `head` is `owner:branch`; the fake's branches are all on the repository's owner.
    let head = query.get("head").map(|h| match h.split_once(':') {
        Some((o, b)) if o == owner => b.to_owned(),
        _ => String::from("\0no such head"),
    });
    let inner = lock(&shared);
    let base = base_url(&headers);
    let pulls: Vec<Value> = inner
        .pulls
        .iter()
        .filter(|p| p.forge == Forge::GitHub && p.repo == repo)
        .filter(|p| head.as_ref().is_none_or(|h| *h == p.head))
        .filter(|p| query.get("base").is_none_or(|b| *b == p.base))
        .map(|p| github_pull(&base, p))
        .collect();
    answer(200, Value::Array(pulls))
}
