//! The file as a Kubernetes Secret volume gives it: perhaps not there at all (an
//! optional Secret not created yet mounts an empty directory), later there, replaced by
//! the kubelet's swap of its `..data` link, or gone.

use super::*;
use crate::repo_location::{RepoLocation, locate};
use std::sync::{Arc, Mutex as StdMutex};

fn remote(url: &str) -> Remote {
    match locate(url) {
        Ok(RepoLocation::Remote(r)) => r,
        other => panic!("{url}: {other:?}"),
    }
}

fn token(creds: &GitCredentials, tenant: &str, url: &str) -> Option<String> {
    match creds.for_remote(tenant, &remote(url)).unwrap()? {
        Credential::Token { token, .. } => Some(token.expose().to_owned()),
        Credential::SshKey { .. } => None,
    }
}

fn entry(secret: &str) -> String {
    format!("[[credential]]\nhost = \"h.example\"\ntenants = [\"t\"]\ntoken = \"{secret}\"\n")
}

/// What the services log while `f` runs.
fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<StdMutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let out = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || out.clone())
        .with_ansi(false)
        .finish();
    let got = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (got, text)
}

#[test]
fn a_file_not_there_yet_starts_with_none_said_once_and_is_read_when_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("git-credentials.toml");
    let gh = "https://github.com/org/private.git";
    let url = "https://h.example/x.git";
    let (creds, log) = logged(|| {
        let creds = GitCredentials::open(Some(path.clone()), Some("operator-gh".into()))
            .expect("a missing file is no configuration error");
        for _ in 0..3 {
            assert_eq!(token(&creds, "t", url), None);
        }
        creds
    });
    assert_eq!(
        log.matches("git credentials file not found").count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("WARN") && log.contains("git-credentials.toml"),
        "{log}"
    );
    // GITHUB_TOKEN serves meanwhile.
    assert_eq!(token(&creds, "t", gh).as_deref(), Some("operator-gh"));

    std::fs::write(&path, entry("appeared")).unwrap();
    assert_eq!(token(&creds, "t", url).as_deref(), Some("appeared"));

    // Gone again: what it held is revoked (and said once more).
    std::fs::remove_file(&path).unwrap();
    let (_, log) = logged(|| {
        assert_eq!(token(&creds, "t", url), None);
        assert_eq!(token(&creds, "t", url), None);
    });
    assert_eq!(
        log.matches("git credentials file not found").count(),
        1,
        "{log}"
    );
    assert_eq!(token(&creds, "t", gh).as_deref(), Some("operator-gh"));
}

#[test]
fn a_file_that_cannot_be_read_is_still_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the file should be: a mistake, not a Secret yet to come.
    let path = dir.path().join("git-credentials.toml");
    std::fs::create_dir(&path).unwrap();
    let err = GitCredentials::open(Some(path), None).unwrap_err();
    assert!(err.contains(SETTING), "{err}");
}

/// The kubelet's layout of a Secret volume: each key a link through `..data`, which it
/// points at a new timestamped directory when the Secret changes (one rename).
fn kubelet_publish(dir: &Path, version: &str, files: &[(&str, &str)]) {
    let data = dir.join(version);
    std::fs::create_dir(&data).unwrap();
    for (name, text) in files {
        std::fs::write(data.join(name), text).unwrap();
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
        }
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn a_secret_volumes_update_is_read_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("team-t");
    let file = format!(
        "[[credential]]\nhost = \"h.example\"\ntenants = [\"t\"]\ntoken_file = \"{}\"\n",
        token_file.display()
    );
    kubelet_publish(
        dir.path(),
        "..2025_01_01_00_00_00.1",
        &[("git-credentials.toml", &file), ("team-t", "first\n")],
    );
    let creds = GitCredentials::open(Some(dir.path().join("git-credentials.toml")), None).unwrap();
    let url = "https://h.example/x.git";
    assert_eq!(token(&creds, "t", url).as_deref(), Some("first"));
    // A rotated token: the token file read at its next use.
    kubelet_publish(
        dir.path(),
        "..2025_01_01_00_00_00.2",
        &[("git-credentials.toml", &file), ("team-t", "rotated\n")],
    );
    assert_eq!(token(&creds, "t", url).as_deref(), Some("rotated"));
    // A new tenant: the file read again.
    let more = format!(
        "{file}{}",
        entry("new-tenant").replace("[\"t\"]", "[\"u\"]")
    );
    kubelet_publish(
        dir.path(),
        "..2025_01_01_00_00_00.3",
        &[("git-credentials.toml", &more), ("team-t", "rotated\n")],
    );
    assert_eq!(token(&creds, "u", url).as_deref(), Some("new-tenant"));
}
