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
        token: Secret("tok".into()),
    };
    let env = c.git_env(&remote("https://git.example.com:8443/x.git"));
    assert_eq!(env[1].1, "http.https://git.example.com:8443/.extraHeader");
    assert_eq!(env[2].1, "Authorization: Basic dTp0b2s=");
    let env = c.git_env(&remote("https://github.com/x.git"));
    assert_eq!(env[1].1, "http.https://github.com/.extraHeader");
    assert!(!format!("{c:?}").contains("tok\""), "{c:?}");
}
