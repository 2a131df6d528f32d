//! A private git server over HTTP: git's own smart-HTTP CGI (`git http-backend`) behind
//! basic authentication, serving the bare repositories under a directory to one user
//! and token, as a forge's HTTPS endpoint serves a private repository. It counts the
//! fetches it served (`command=fetch` of protocol v2, `want` lines of v0).

use axum::{
    Router,
    body::Bytes,
    extract::{Path, RawQuery, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::any,
};
use base64::Engine as _;
use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

pub struct GitHttp {
    pub port: u16,
    state: Arc<Served>,
}

struct Served {
    root: PathBuf,
    basic: String,
    fetches: AtomicUsize,
}

impl GitHttp {
    /// Serve the bare repositories under `root` as `/git/<name>.git` to `user`/`token`.
    pub async fn serve(root: PathBuf, user: &str, token: &str) -> GitHttp {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
        let state = Arc::new(Served {
            root,
            basic: format!("Basic {basic}"),
            fetches: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/git/{*path}", any(cgi))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        GitHttp { port, state }
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/git/{name}.git", self.port)
    }

    /// How many fetches (a clone's included) were served.
    pub fn fetches(&self) -> usize {
        self.state.fetches.load(Ordering::SeqCst)
    }
}

async fn cgi(
    State(s): State<Arc<Served>>,
    Path(path): Path<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
    if header("authorization") != s.basic {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Basic realm=\"git\"")],
        )
            .into_response();
    }
    let text = String::from_utf8_lossy(&body);
    if text.contains("command=fetch") || text.contains("want ") {
        s.fetches.fetch_add(1, Ordering::SeqCst);
    }
    let out = run_backend(&s, &path, query, &method, &headers, body).await;
    let Some(split) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let mut resp = Response::builder().status(StatusCode::OK);
    for line in String::from_utf8_lossy(&out[..split]).lines() {
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("status") {
                let code = v.trim().split(' ').next().unwrap_or("500");
                resp = resp.status(code.parse::<u16>().unwrap_or(500));
            } else {
                resp = resp.header(k.trim(), v.trim());
            }
        }
    }
    resp.body(axum::body::Body::from(out[split + 4..].to_vec()))
        .unwrap()
}

/// `git http-backend` run once for a request: its CGI output, headers and body.
async fn run_backend(
    s: &Served,
    path: &str,
    query: Option<String>,
    method: &Method,
    headers: &HeaderMap,
    body: Bytes,
) -> Vec<u8> {
    use tokio::io::AsyncWriteExt as _;
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let mut child = tokio::process::Command::new("git")
        .arg("http-backend")
        .env("GIT_PROJECT_ROOT", &s.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("PATH_INFO", format!("/{path}"))
        .env("QUERY_STRING", query.unwrap_or_default())
        .env("REQUEST_METHOD", method.as_str())
        .env("CONTENT_TYPE", header("content-type"))
        .env("HTTP_CONTENT_ENCODING", header("content-encoding"))
        .env("GIT_PROTOCOL", header("git-protocol"))
        .env("REMOTE_USER", "git")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("git http-backend");
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
    });
    child.wait_with_output().await.unwrap().stdout
}
