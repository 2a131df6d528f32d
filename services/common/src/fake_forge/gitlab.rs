//! The fake's GitLab: `POST/GET /api/v4/projects/{url-encoded path}/merge_requests`,
//! with `PRIVATE-TOKEN`; a second open merge request for a source branch is GitLab's 409.

use super::{Shared, Stored, answer, base_url, enter, lock, next_number, text};
use crate::forge::Forge;
use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{HeaderMap, Method, Uri},
    response::Response,
};
use serde_json::{Value, json};
use std::collections::HashMap;

fn gitlab_mr(base: &str, p: &Stored) -> Value {
    json!({
        "iid": p.number,
        "web_url": format!("{base}/{}/-/merge_requests/{}", p.repo, p.number),
        "state": "opened",
        "draft": p.draft,
        "title": p.title,
        "description": p.body,
        "source_branch": p.head,
        "target_branch": p.base,
    })
}

pub(super) async fn create(
    State(shared): State<Shared>,
    Path(project): Path<String>,
    (method, uri, headers): (Method, Uri, HeaderMap),
    body: Bytes,
) -> Response {
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    if let Some(r) = enter(
        &shared,
        (&method, &uri, &headers),
        json.clone(),
        Some("private-token"),
    ) {
        return r;
    }
    let json = json.unwrap_or_default();
    let fields = (
        text(&json, "source_branch"),
        text(&json, "target_branch"),
        text(&json, "title"),
    );
    let (Some(head), Some(base), Some(title)) = fields else {
        return answer(
            400,
            json!({"error": "source_branch, target_branch, title are missing"}),
        );
    };
    let mut inner = lock(&shared);
    let same = |p: &&Stored| p.forge == Forge::GitLab && p.repo == project && p.head == head;
    if let Some(open) = inner.pulls.iter().find(same) {
        let message = format!(
            "Another open merge request already exists for this source branch: !{}",
            open.number
        );
        return answer(409, json!({"message": [message]}));
    }
    let mr = Stored {
        forge: Forge::GitLab,
        number: next_number(&inner, Forge::GitLab, &project),
        repo: project,
        head,
        base,
        draft: title.starts_with("Draft:"),
        title,
        body: text(&json, "description").unwrap_or_default(),
    };
    let answered = gitlab_mr(&base_url(&headers), &mr);
    inner.pulls.push(mr);
    answer(201, answered)
}

pub(super) async fn list(
    State(shared): State<Shared>,
    Path(project): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    (method, uri, headers): (Method, Uri, HeaderMap),
) -> Response {
    if let Some(r) = enter(
        &shared,
        (&method, &uri, &headers),
        None,
        Some("private-token"),
    ) {
        return r;
    }
    let inner = lock(&shared);
    let base = base_url(&headers);
    let mrs: Vec<Value> = inner
        .pulls
        .iter()
        .filter(|p| p.forge == Forge::GitLab && p.repo == project)
        .filter(|p| query.get("source_branch").is_none_or(|b| *b == p.head))
        .filter(|p| query.get("target_branch").is_none_or(|b| *b == p.base))
        .map(|p| gitlab_mr(&base, p))
        .collect();
    answer(200, Value::Array(mrs))
}
