//! GitHub's pull requests: `POST /repos/{owner}/{repo}/pulls`, and on its 422 "a pull
//! request already exists" the open one, `GET …/pulls?head=owner:branch&base=…`.

use super::{
    ForgeAccess, ForgeError, Opened, PullRequest,
    http::{Answer, Call, endpoint},
};
use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde::Deserialize;

/// The API version the calls are written against.
const API_VERSION: &str = "2022-11-28";

#[derive(Deserialize)]
struct Pull {
    number: u64,
    html_url: String,
}

pub(super) async fn open(
    access: &ForgeAccess,
    repo_path: &str,
    pr: &PullRequest,
) -> Result<Opened, ForgeError> {
    let call = Call {
        forge: access.forge,
        what: format!("pull request for {repo_path}"),
        token: &access.token,
    };
    let Some((owner, name)) = repo_path
        .split_once('/')
        .filter(|(o, n)| !o.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        return Err(ForgeError::Setup(format!(
            "github pull request for {repo_path}: a github repository is owner/name"
        )));
    };
    let url = endpoint(&call, &access.api, &["repos", owner, name, "pulls"])?;
    let body = serde_json::json!({
        "title": pr.title,
        "head": pr.head,
        "base": pr.base,
        "body": pr.body,
        "draft": pr.draft,
    });
    let answer = call
        .send(request(&call, call.client()?.post(url.clone()))?.json(&body))
        .await?;
    match answer.status.as_u16() {
        200 | 201 => {
            let pull: Pull = call.json(&answer)?;
            Ok(Opened {
                url: pull.html_url,
                number: pull.number,
                existed: false,
            })
        }
        422 if already_exists(&answer) => find_open(&call, url, owner, pr).await,
        _ => Err(call.status_error(&answer)),
    }
}

/// The open pull request for `owner:head` into `base`.
async fn find_open(
    call: &Call<'_>,
    mut url: url::Url,
    owner: &str,
    pr: &PullRequest,
) -> Result<Opened, ForgeError> {
    url.query_pairs_mut()
        .append_pair("head", &format!("{owner}:{}", pr.head))
        .append_pair("base", &pr.base)
        .append_pair("state", "open");
    let answer = call.send(request(call, call.client()?.get(url))?).await?;
    if !answer.status.is_success() {
        return Err(call.status_error(&answer));
    }
    let pulls: Vec<Pull> = call.json(&answer)?;
    let pull = pulls
        .into_iter()
        .next()
        .ok_or_else(|| ForgeError::NotListed {
            forge: call.forge,
            what: call.what.clone(),
            head: pr.head.clone(),
        })?;
    Ok(Opened {
        url: pull.html_url,
        number: pull.number,
        existed: true,
    })
}

/// GitHub's headers: its media type, the API version, the token as a bearer.
pub(crate) fn request(
    call: &Call<'_>,
    builder: reqwest::RequestBuilder,
) -> Result<reqwest::RequestBuilder, ForgeError> {
    let (name, value) = call.auth_header(AUTHORIZATION, "Bearer ")?;
    Ok(builder
        .header(ACCEPT, "application/vnd.github+json")
        .header("X-GitHub-Api-Version", API_VERSION)
        .header(name, value))
}

/// A 422 whose errors say a pull request already exists (others: no commits between
/// the branches, a head that is no branch, are final).
fn already_exists(answer: &Answer) -> bool {
    #[derive(Deserialize)]
    struct Validation {
        #[serde(default)]
        errors: Vec<serde_json::Value>,
    }
    serde_json::from_slice::<Validation>(&answer.body).is_ok_and(|v| {
        v.errors.iter().any(|e| {
            e.get("message")
                .and_then(|m| m.as_str())
                .is_some_and(|m| m.to_ascii_lowercase().contains("already exists"))
        })
    })
}
