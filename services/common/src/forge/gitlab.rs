//! GitLab's merge requests: `POST /projects/{url-encoded path}/merge_requests`, and on
//! its 409 (another open merge request for the source branch) the open one, `GET
//! …/merge_requests?source_branch=…&target_branch=…&state=opened`.

use super::{
    ForgeAccess, ForgeError, Opened, PullRequest,
    http::{Call, endpoint},
};
use serde::Deserialize;

#[derive(Deserialize)]
struct MergeRequest {
    iid: u64,
    web_url: String,
}

pub(super) async fn open(
    access: &ForgeAccess,
    repo_path: &str,
    pr: &PullRequest,
) -> Result<Opened, ForgeError> {
    let call = Call {
        forge: access.forge,
        what: format!("merge request for {repo_path}"),
        token: &access.token,
    };
    if !repo_path.contains('/') || repo_path.split('/').any(str::is_empty) {
        return Err(ForgeError::Setup(format!(
            "gitlab merge request for {repo_path}: a gitlab project is group/…/name"
        )));
    }
    // The project's path as one segment: endpoint() encodes its slashes (%2F).
    let url = endpoint(
        &call,
        &access.api,
        &["projects", repo_path, "merge_requests"],
    )?;
    // GitLab marks a draft by its title.
    let title = if pr.draft && !pr.title.starts_with("Draft:") {
        format!("Draft: {}", pr.title)
    } else {
        pr.title.clone()
    };
    let body = serde_json::json!({
        "source_branch": pr.head,
        "target_branch": pr.base,
        "title": title,
        "description": pr.body,
    });
    let post = call.client()?.post(url.clone()).json(&body);
    let answer = call.send(request(&call, post)?).await?;
    match answer.status.as_u16() {
        200 | 201 => {
            let mr: MergeRequest = call.json(&answer)?;
            Ok(Opened {
                url: mr.web_url,
                number: mr.iid,
                existed: false,
            })
        }
        409 => find_open(&call, url, pr).await,
        _ => Err(call.status_error(&answer)),
    }
}

async fn find_open(
    call: &Call<'_>,
    mut url: url::Url,
    pr: &PullRequest,
) -> Result<Opened, ForgeError> {
    url.query_pairs_mut()
        .append_pair("source_branch", &pr.head)
        .append_pair("target_branch", &pr.base)
        .append_pair("state", "opened");
    let answer = call.send(request(call, call.client()?.get(url))?).await?;
    if !answer.status.is_success() {
        return Err(call.status_error(&answer));
    }
    let mrs: Vec<MergeRequest> = call.json(&answer)?;
    let mr = mrs
        .into_iter()
        .next()
        .ok_or_else(|| ForgeError::NotListed {
            forge: call.forge,
            what: call.what.clone(),
            head: pr.head.clone(),
        })?;
    Ok(Opened {
        url: mr.web_url,
        number: mr.iid,
        existed: true,
    })
}

/// GitLab's token header.
fn request(
    call: &Call<'_>,
    builder: reqwest::RequestBuilder,
) -> Result<reqwest::RequestBuilder, ForgeError> {
    let (name, value) = call.auth_header(
        reqwest::header::HeaderName::from_static("private-token"),
        "",
    )?;
    Ok(builder.header(name, value))
}
