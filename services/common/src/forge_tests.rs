//! Pull and merge requests over real HTTP against the fake forge.

use super::*;
use crate::fake_forge::FakeForge;
use serde_json::json;

const TOKEN: &str = "ghp_forge-test-token-0123456789";

fn access(forge: Forge, api: url::Url, token: &str) -> ForgeAccess {
    ForgeAccess {
        forge,
        api,
        token: Secret::new(token),
    }
}

fn pr(head: &str, draft: bool) -> PullRequest {
    PullRequest {
        head: head.into(),
        base: "main".into(),
        title: "forkyard: run-a fork 3".into(),
        body: "## Run\n\n| fork | verify |\n|---|---|\n| 3 | passed |".into(),
        draft,
    }
}

/// Neither the error's Display nor its Debug holds `token`.
fn assert_hidden(e: &ForgeError, token: &str) {
    assert!(!e.to_string().contains(token), "{e}");
    assert!(!format!("{e:?}").contains(token), "{e:?}");
}

#[tokio::test]
async fn a_github_pull_request_is_opened_with_its_json_and_headers() {
    let fake = FakeForge::start(TOKEN).await;
    let gh = access(Forge::GitHub, fake.github_api(), TOKEN);
    let opened = open_pull_request(&gh, "org/app", &pr("run-a-fork-3", true))
        .await
        .unwrap();
    assert_eq!(opened.number, 1);
    assert!(!opened.existed);
    assert_eq!(opened.url, format!("{}/org/app/pull/1", fake.url()));
    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    let post = &seen[0];
    assert_eq!(
        (post.method.as_str(), post.path.as_str()),
        ("POST", "/repos/org/app/pulls")
    );
    assert_eq!(post.accept.as_deref(), Some("application/vnd.github+json"));
    assert_eq!(post.api_version.as_deref(), Some("2022-11-28"));
    assert!(post.user_agent.as_deref().unwrap().starts_with("forkyard/"));
    assert_eq!(post.auth_header, Some("authorization"));
    assert!(post.authorized);
    assert_eq!(
        post.body,
        Some(json!({
            "title": "forkyard: run-a fork 3",
            "head": "run-a-fork-3",
            "base": "main",
            "body": "## Run\n\n| fork | verify |\n|---|---|\n| 3 | passed |",
            "draft": true,
        }))
    );
    let stored = fake.pulls();
    assert_eq!(stored.len(), 1);
    assert!(stored[0].draft && stored[0].repo == "org/app");
}

#[tokio::test]
async fn a_second_open_finds_the_first_and_opens_none() {
    let fake = FakeForge::start(TOKEN).await;
    let gh = access(Forge::GitHub, fake.github_api(), TOKEN);
    let first = open_pull_request(&gh, "org/app", &pr("run-a-fork-1", false))
        .await
        .unwrap();
    // A retry after a lost answer, given the path as a URL's (".git"): the same one.
    let again = open_pull_request(&gh, "/org/app.git", &pr("run-a-fork-1", false))
        .await
        .unwrap();
    assert!(again.existed);
    assert_eq!((again.number, &again.url), (first.number, &first.url));
    assert_eq!(fake.pulls().len(), 1);
    let lookup = &fake.seen()[2];
    assert_eq!(lookup.method, "GET");
    let query = lookup.query.as_deref().unwrap();
    assert!(query.contains("head=org%3Arun-a-fork-1"), "{query}");
    assert!(
        query.contains("base=main") && query.contains("state=open"),
        "{query}"
    );
    // Another branch is another pull request.
    let other = open_pull_request(&gh, "org/app", &pr("run-a-fork-2", false))
        .await
        .unwrap();
    assert_eq!((other.number, other.existed), (2, false));
}

#[tokio::test]
async fn a_gitlab_merge_request_is_opened_once_on_its_encoded_project() {
    let fake = FakeForge::start(TOKEN).await;
    let gl = access(Forge::GitLab, fake.gitlab_api(), TOKEN);
    let opened = open_pull_request(&gl, "group/sub/app", &pr("run-b-fork-2", true))
        .await
        .unwrap();
    assert_eq!((opened.number, opened.existed), (1, false));
    assert_eq!(
        opened.url,
        format!("{}/group/sub/app/-/merge_requests/1", fake.url())
    );
    let post = &fake.seen()[0];
    assert_eq!(
        post.path,
        "/api/v4/projects/group%2Fsub%2Fapp/merge_requests"
    );
    assert_eq!(post.auth_header, Some("private-token"));
    assert_eq!(
        post.body,
        Some(json!({
            "source_branch": "run-b-fork-2",
            "target_branch": "main",
            "title": "Draft: forkyard: run-a fork 3",
            "description": "## Run\n\n| fork | verify |\n|---|---|\n| 3 | passed |",
        }))
    );
    let again = open_pull_request(&gl, "group/sub/app", &pr("run-b-fork-2", true))
        .await
        .unwrap();
    assert!(again.existed);
    assert_eq!(again.url, opened.url);
    let stored = fake.pulls();
    assert_eq!(stored.len(), 1);
    assert!(stored[0].draft && stored[0].repo == "group/sub/app");
    let lookup = fake.seen()[2].query.clone().unwrap();
    assert!(lookup.contains("source_branch=run-b-fork-2"), "{lookup}");
    assert!(lookup.contains("state=opened"), "{lookup}");
}

#[tokio::test]
async fn a_refused_token_is_final_and_never_in_the_error() {
    let fake = FakeForge::start(TOKEN).await;
    let wrong = "ghp_a-token-the-forge-does-not-know";
    for forge in [Forge::GitHub, Forge::GitLab] {
        let api = match forge {
            Forge::GitHub => fake.github_api(),
            Forge::GitLab => fake.gitlab_api(),
        };
        let e = open_pull_request(&access(forge, api, wrong), "org/app", &pr("b", false))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(401), "{e}");
        assert!(!e.is_retryable(), "{e}");
        let text = e.to_string();
        assert!(text.starts_with(&format!("{forge} ")), "{text}");
        assert!(
            text.contains("org/app") && text.contains("http 401"),
            "{text}"
        );
        assert_hidden(&e, wrong);
    }
    let gh_says = open_pull_request(
        &access(Forge::GitHub, fake.github_api(), wrong),
        "org/app",
        &pr("b", false),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(gh_says.ends_with("Bad credentials"), "{gh_says}");
    assert!(fake.pulls().is_empty());
}

#[tokio::test]
async fn a_bad_gateway_is_retryable_and_the_retry_opens_one() {
    let fake = FakeForge::start(TOKEN).await;
    let gh = access(Forge::GitHub, fake.github_api(), TOKEN);
    fake.fail_next(2);
    for _ in 0..2 {
        let e = open_pull_request(&gh, "org/app", &pr("b", false))
            .await
            .unwrap_err();
        assert_eq!(e.status(), Some(502), "{e}");
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("bad gateway"), "{e}");
    }
    let opened = open_pull_request(&gh, "org/app", &pr("b", false))
        .await
        .unwrap();
    assert_eq!((opened.number, opened.existed), (1, false));
    assert_eq!(fake.pulls().len(), 1);
}

#[tokio::test]
async fn an_api_that_does_not_answer_is_retryable() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let api = url::Url::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let e = open_pull_request(
        &access(Forge::GitHub, api, TOKEN),
        "org/app",
        &pr("b", false),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ForgeError::Unreachable { .. }), "{e:?}");
    assert!(e.is_retryable());
    assert!(
        e.to_string()
            .starts_with("github pull request for org/app: "),
        "{e}"
    );
    assert_hidden(&e, TOKEN);
}

/// A local server of its own for what the fake does not do: `router` on 127.0.0.1.
async fn serve(router: axum::Router) -> url::Url {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url::Url::parse(&url).unwrap()
}

#[tokio::test]
async fn an_answer_over_a_mebibyte_is_not_read_and_an_echoed_token_is_cut_out() {
    let big = serve(axum::Router::new().fallback(|| async { vec![b'x'; 2 << 20] })).await;
    let e = open_pull_request(
        &access(Forge::GitHub, big, TOKEN),
        "org/app",
        &pr("b", false),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("over 1048576 bytes"), "{e}");
    assert!(!e.is_retryable());
    let echo = serve(
        axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
            let said = headers["authorization"].to_str().unwrap().to_owned();
            let body = json!({"message": format!("token {said} is revoked")});
            (axum::http::StatusCode::FORBIDDEN, axum::Json(body))
        }),
    )
    .await;
    let e = open_pull_request(
        &access(Forge::GitHub, echo, TOKEN),
        "org/app",
        &pr("b", false),
    )
    .await
    .unwrap_err();
    assert_eq!(e.status(), Some(403));
    assert!(e.to_string().contains("is revoked"), "{e}");
    assert_hidden(&e, TOKEN);
}

#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed_with_the_token() {
    let elsewhere_hit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hit = elsewhere_hit.clone();
    let elsewhere = serve(axum::Router::new().fallback(move || async move {
        hit.store(true, std::sync::atomic::Ordering::SeqCst);
        "{}"
    }))
    .await;
    let to = elsewhere.to_string();
    let api = serve(
        axum::Router::new()
            .fallback(move || async move { axum::response::Redirect::temporary(&to) }),
    )
    .await;
    let e = open_pull_request(&access(Forge::GitLab, api, TOKEN), "g/app", &pr("b", false))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(307), "{e}");
    assert!(!elsewhere_hit.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn api_messages_are_read_in_each_forges_shapes() {
    let m = |v: serde_json::Value| http::api_message(v.to_string().as_bytes()).unwrap();
    assert_eq!(
        m(json!({"message": "Validation Failed", "errors": [
            {"resource": "PullRequest", "code": "custom", "message": "No commits between main and b"},
            {"resource": "PullRequest", "field": "head", "code": "invalid"},
        ]})),
        "Validation Failed; No commits between main and b; invalid"
    );
    assert_eq!(m(json!({"message": ["one", "two"]})), "one; two");
    assert_eq!(
        m(json!({"message": {"source_branch": ["is invalid"]}})),
        "source_branch is invalid"
    );
    assert_eq!(m(json!({"error": "title is missing"})), "title is missing");
    assert_eq!(http::api_message(b"<html>502</html>"), None);
}

#[test]
fn a_repository_urls_path_is_its_forge_path() {
    for (url, path) in [
        ("https://github.com/org/app.git", Some("org/app")),
        ("https://gitlab.com/group/sub/app", Some("group/sub/app")),
        ("git@github.com:org/app.git", Some("org/app")),
        ("ssh://git@git.corp:2222/group/app.git/", Some("group/app")),
        ("https://github.com/app.git", None),
        ("/srv/git/app", None),
    ] {
        assert_eq!(
            crate::repo_location::repo_path(url).as_deref(),
            path,
            "{url}"
        );
    }
}

#[tokio::test]
async fn a_path_a_forge_cannot_name_is_refused_before_any_call() {
    let fake = FakeForge::start(TOKEN).await;
    let gh = access(Forge::GitHub, fake.github_api(), TOKEN);
    let e = open_pull_request(&gh, "group/sub/app", &pr("b", false))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ForgeError::Setup(_)) && !e.is_retryable(),
        "{e}"
    );
    let gl = access(Forge::GitLab, fake.gitlab_api(), TOKEN);
    assert!(
        open_pull_request(&gl, "app", &pr("b", false))
            .await
            .is_err()
    );
    assert!(fake.seen().is_empty());
}
