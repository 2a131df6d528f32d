use super::*;
use crate::repo_location::{RepoLocation, locate};

fn remote(url: &str) -> Remote {
    match locate(url) {
        Ok(RepoLocation::Remote(r)) => r,
        other => panic!("{url}: {other:?}"),
    }
}

fn file(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("git-credentials.toml");
    std::fs::write(&p, text).unwrap();
    p
}

const FILE: &str = r#"
[[credential]]
host = "github.com"
tenants = ["team-a"]
token = "team-a-secret"

[[credential]]
host = "*.example.com"
tenants = ["*"]
token = "shared-secret"
username = "oauth2"

[[credential]]
host = "git.example.com:8443"
tenants = ["team-b"]
token_file = "TOKEN_FILE"

[[credential]]
host = "git.example.com"
tenants = ["team-b"]
ssh_key_file = "/keys/team-b"
known_hosts_file = "/keys/known_hosts"
"#;

fn token(c: Option<Credential>) -> Option<(String, String)> {
    match c? {
        Credential::Token { username, token } => Some((username, token.expose().to_owned())),
        Credential::SshKey { .. } => None,
    }
}

#[test]
fn a_tenant_gets_its_own_most_specific_credential_and_never_anothers() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("b-token");
    std::fs::write(&token_file, "team-b-token\n").unwrap();
    let path = file(
        dir.path(),
        &FILE.replace("TOKEN_FILE", token_file.to_str().unwrap()),
    );
    let creds = GitCredentials::open(Some(path), Some("operator-gh".into())).unwrap();
    let gh = remote("https://github.com/org/private.git");
    assert_eq!(
        token(creds.for_remote("team-a", &gh).unwrap()),
        Some(("x-access-token".into(), "team-a-secret".into()))
    );
    // Team b has none of its own for github.com: the operator's GITHUB_TOKEN, shared.
    assert_eq!(
        token(creds.for_remote("team-b", &gh).unwrap()).unwrap().1,
        "operator-gh"
    );
    // host:port beats *.domain; the token file is read (and trimmed).
    let port = remote("https://git.example.com:8443/x.git");
    assert_eq!(
        token(creds.for_remote("team-b", &port).unwrap()).unwrap().1,
        "team-b-token"
    );
    assert_eq!(
        token(creds.for_remote("team-a", &port).unwrap()).unwrap().1,
        "shared-secret"
    );
    // ssh gets the deploy key; another tenant nothing.
    let ssh = remote("ssh://git@git.example.com/x.git");
    assert!(matches!(
        creds.for_remote("team-b", &ssh).unwrap(),
        Some(Credential::SshKey { .. })
    ));
    assert_eq!(creds.for_remote("team-a", &ssh).unwrap(), None);
    assert_eq!(
        creds
            .for_remote("team-a", &remote("https://gitlab.com/x.git"))
            .unwrap(),
        None
    );
}

#[test]
fn the_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_last() {
    let dir = tempfile::tempdir().unwrap();
    let one = "[[credential]]\nhost = \"h.example\"\ntenants = [\"t\"]\ntoken = \"one\"\n";
    let path = file(dir.path(), one);
    let creds = GitCredentials::open(Some(path.clone()), None).unwrap();
    let r = remote("https://h.example/x.git");
    assert_eq!(token(creds.for_remote("t", &r).unwrap()).unwrap().1, "one");
    std::fs::write(&path, one.replace("\"one\"", "\"rotated\"")).unwrap();
    assert_eq!(
        token(creds.for_remote("t", &r).unwrap()).unwrap().1,
        "rotated"
    );
    std::fs::write(&path, "not toml [").unwrap();
    assert_eq!(
        token(creds.for_remote("t", &r).unwrap()).unwrap().1,
        "rotated"
    );
}

#[test]
fn bad_files_are_refused_naming_the_setting_and_never_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    for (text, says) in [
        (
            "[[credential]]\nhost = \"h\"\ntenants = [\"t\"]\n",
            "give a token",
        ),
        (
            "[[credential]]\nhost = \"h\"\ntenants = [\"t\"]\nssh_key_file = \"/k\"\n",
            "known_hosts_file",
        ),
        (
            "[[credential]]\nhost = \"h\"\ntenants = []\ntoken = \"s3cret\"\n",
            "tenants is empty",
        ),
        (
            "[[credential]]\nhost = \"h\"\ntenants = [\"t\"]\ntoken = \"s3cret\"\ntoken_typo = 1\n",
            "unknown field",
        ),
    ] {
        let err = GitCredentials::open(Some(file(dir.path(), text)), None).unwrap_err();
        assert!(err.contains(SETTING) && err.contains(says), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }
}

#[test]
fn a_token_reaches_git_only_as_an_extra_header_of_its_host() {
    let c = Credential::Token {
        username: "u".into(),
        token: Secret::new("tok"),
    };
    let env = c.git_env(&remote("https://git.example.com:8443/x.git"));
    assert_eq!(env[1].1, "http.https://git.example.com:8443/.extraHeader");
    assert_eq!(env[2].1, "Authorization: Basic dTp0b2s=");
    let env = c.git_env(&remote("https://github.com/x.git"));
    assert_eq!(env[1].1, "http.https://github.com/.extraHeader");
    assert!(!format!("{c:?}").contains("tok\""), "{c:?}");
}

/// The forge access `tenant` gets for `url`: its forge, API and token.
async fn forge(
    creds: &GitCredentials,
    tenant: &str,
    url: &str,
) -> Option<(String, String, String)> {
    let access = creds.forge_for(tenant, &remote(url)).await.unwrap()?;
    Some((
        access.forge.to_string(),
        access.api.to_string(),
        access.token.expose().to_owned(),
    ))
}

fn owned(forge: &str, api: &str, token: &str) -> Option<(String, String, String)> {
    Some((forge.into(), api.into(), token.into()))
}

#[tokio::test]
async fn a_hosts_forge_is_its_entrys_else_github_and_gitlab_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let api_token = dir.path().join("gl-api");
    std::fs::write(&api_token, "glpat-api\n").unwrap();
    let text = format!(
        r#"
[[credential]]
host = "gitlab.com"
tenants = ["t"]
token = "glpat-git"
username = "oauth2"

[[credential]]
host = "git.corp"
tenants = ["t"]
token = "corp-git"
forge = "gitlab"

[[credential]]
host = "ghe.corp"
tenants = ["t"]
token = "ghe-git"
forge = "github"
api = "https://ghe-api.corp/api/v3"

[[credential]]
host = "plain.corp"
tenants = ["t"]
token = "plain"

[[credential]]
host = "ssh.corp"
tenants = ["t"]
ssh_key_file = "/k"
known_hosts_file = "/kh"
forge = "gitlab"
api_token_file = "{}"

[[credential]]
host = "github.com"
tenants = ["t"]
ssh_key_file = "/k"
known_hosts_file = "/kh"
"#,
        api_token.display()
    );
    let creds =
        GitCredentials::open(Some(file(dir.path(), &text)), Some("gh-shared".into())).unwrap();
    let f = |url: &'static str| forge(&creds, "t", url);
    assert_eq!(
        f("https://github.com/o/r.git").await,
        owned("github", "https://api.github.com/", "gh-shared")
    );
    assert_eq!(
        f("https://gitlab.com/g/r.git").await,
        owned("gitlab", "https://gitlab.com/api/v4", "glpat-git")
    );
    assert_eq!(
        f("https://git.corp:8443/g/r.git").await,
        owned("gitlab", "https://git.corp:8443/api/v4", "corp-git")
    );
    assert_eq!(
        f("https://ghe.corp/o/r.git").await,
        owned("github", "https://ghe-api.corp/api/v3", "ghe-git")
    );
    assert_eq!(f("https://plain.corp/o/r.git").await, None);
    // An ssh entry calls the API with its api_token, on the host's https port.
    assert_eq!(
        f("ssh://git@ssh.corp:2222/g/r.git").await,
        owned("gitlab", "https://ssh.corp/api/v4", "glpat-api")
    );
    // The tenant's github.com deploy key calls no API: the operator's shared token does.
    assert_eq!(
        f("git@github.com:o/r.git").await,
        owned("github", "https://api.github.com/", "gh-shared")
    );
    assert_eq!(
        forge(&creds, "other", "https://gitlab.com/g/r.git").await,
        None
    );
}

#[test]
fn bad_forge_and_app_entries_are_refused_without_their_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let base = "[[credential]]\nhost = \"h\"\ntenants = [\"t\"]\n";
    for (rest, says) in [
        (
            "token = \"s3cret\"\napi = \"https://h/api/v4\"\n",
            "api needs forge",
        ),
        (
            "token = \"s3cret\"\nforge = \"gitlab\"\napi = \"https://u:s3cret@h/api\"\n",
            "must not carry credentials",
        ),
        (
            "token = \"s3cret\"\nforge = \"gitlab\"\napi = \"ftp://h/\"\n",
            "not an http(s) url",
        ),
        (
            "token = \"s3cret\"\nforge = \"bitbucket\"\n",
            "unknown variant",
        ),
        ("token = 12345\n", "a secret must be a string"),
        (
            "app_id = 1\napp_key_file = \"/k\"\n",
            "needs app_id, app_key_file and installation_id",
        ),
        (
            "app_id = 1\napp_key_file = \"/k\"\ninstallation_id = 2\ntoken = \"s3cret\"\n",
            "one of them",
        ),
        (
            "app_id = 1\napp_key_file = \"/k\"\ninstallation_id = 2\nforge = \"gitlab\"\n",
            "is for forge = \"github\"",
        ),
        (
            "app_id = 1\napp_key_file = \"/k\"\ninstallation_id = 2\napi_token = \"s3cret\"\n",
            "no username, api_token",
        ),
        (
            "ssh_key_file = \"/k\"\nknown_hosts_file = \"/h\"\napi_token = \"s3cret\"\napi_token_file = \"/f\"\n",
            "not both",
        ),
    ] {
        let text = format!("{base}{rest}");
        let err = GitCredentials::open(Some(file(dir.path(), &text)), None).unwrap_err();
        assert!(err.contains(SETTING) && err.contains(says), "{rest}: {err}");
        assert!(!err.contains("s3cret") && !err.contains("12345"), "{err}");
    }
}

mod app {
    use super::*;
    use crate::{
        fake_forge::{FakeForge, generate_app_key},
        forge::{PullRequest, open_pull_request},
    };

    /// A tenant's GitHub App entry on the fake's API, and the fake serving the app.
    async fn app_setup(dir: &Path) -> (GitCredentials, FakeForge) {
        let key = generate_app_key(dir, "app", true);
        let fake = FakeForge::start("not-the-apps").await;
        fake.add_app("31337", &key.public_pem, 9);
        let text = format!(
            "[[credential]]\nhost = \"github.com\"\ntenants = [\"t\"]\napp_id = 31337\napp_key_file = \"{}\"\ninstallation_id = 9\napi = \"{}\"\n",
            key.key_file.display(),
            fake.url()
        );
        let creds = GitCredentials::open(Some(file(dir, &text)), None).unwrap();
        (creds, fake)
    }

    #[tokio::test]
    async fn an_apps_installation_token_serves_git_and_the_api_minted_once() {
        let dir = tempfile::tempdir().unwrap();
        let (creds, fake) = app_setup(dir.path()).await;
        let repo = remote("https://github.com/org/app.git");
        let got = token(creds.resolve("t", &repo).await.unwrap()).unwrap();
        assert_eq!(got.0, "x-access-token");
        assert_eq!(got.1, fake.minted()[0].token);
        // The sync path cannot mint, and says so.
        let e = creds.for_remote("t", &repo).unwrap_err();
        assert!(e.contains("github.com") && e.contains("resolve"), "{e}");
        // The API gets the same token (one mint), and opens a pull request with it.
        let access = creds.forge_for("t", &repo).await.unwrap().unwrap();
        assert_eq!(access.token.expose(), got.1);
        assert_eq!(fake.minted().len(), 1);
        let pr = PullRequest {
            head: "run-x-fork-1".into(),
            base: "main".into(),
            title: "t".into(),
            body: String::new(),
            draft: false,
        };
        let opened = open_pull_request(&access, "org/app", &pr).await.unwrap();
        assert_eq!(opened.number, 1);
        assert!(fake.seen().last().unwrap().authorized);
        // Minted for this repository alone; another of the installation's gets its own.
        assert_eq!(fake.minted()[0].repositories, Some(vec!["app".to_owned()]));
        let lib = remote("https://github.com/org/lib.git");
        let lib_token = token(creds.resolve("t", &lib).await.unwrap()).unwrap();
        assert_ne!(lib_token.1, got.1);
        assert_eq!(fake.minted()[1].repositories, Some(vec!["lib".to_owned()]));
        // Another tenant has nothing; ssh is not the app's.
        assert_eq!(creds.resolve("other", &repo).await.unwrap(), None);
        let ssh = remote("git@github.com:org/app.git");
        assert_eq!(creds.resolve("t", &ssh).await.unwrap(), None);
        assert!(!format!("{creds:?}").contains(&got.1));
    }

    #[tokio::test]
    async fn a_mint_that_fails_names_the_host_and_quotes_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let (creds, fake) = app_setup(dir.path()).await;
        let repo = remote("https://github.com/org/app.git");
        fake.fail_next(1);
        let e = creds.forge_for("t", &repo).await.unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("(credential for github.com)"), "{e}");
        fake.fail_next(1);
        let e = creds.resolve("t", &repo).await.unwrap_err();
        assert!(
            e.starts_with("credential for github.com: github installation token"),
            "{e}"
        );
        assert!(
            e.contains("http 502") && !e.contains("eyJ") && !e.contains("PRIVATE"),
            "{e}"
        );
    }
}
