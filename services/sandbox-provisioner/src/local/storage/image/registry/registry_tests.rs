use super::*;

#[tokio::test]
async fn credentials_are_read_per_host_at_each_pull_and_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    let write = |text: &str| std::fs::write(&file, text).unwrap();
    write(
        r#"{"auths": {"https://index.docker.io/v1/": {"auth": "dXNlcjpzZWNyZXQ="}, "127.0.0.1:5000": {"auth": "YTpi"}, "ghcr.example": {"identitytoken": "refresh-me"}}}"#,
    );
    let r = Registries::new(
        &RegistryConfig {
            auth_file: Some(file.clone()),
            ..RegistryConfig::default()
        },
        0,
    )
    .unwrap();
    let basic = |c: Option<auth::Credential>| match c {
        Some(auth::Credential::Basic(b)) => b,
        _ => panic!("no basic credential"),
    };
    let at = |host: &'static str| auth::credential(&file, host);
    assert_eq!(
        basic(at("registry-1.docker.io").await.unwrap()),
        "dXNlcjpzZWNyZXQ="
    );
    assert_eq!(basic(at("127.0.0.1:5000").await.unwrap()), "YTpi");
    assert!(matches!(
        at("ghcr.example").await.unwrap(),
        Some(auth::Credential::IdentityToken(t)) if t == "refresh-me"
    ));
    assert!(at("other.example").await.unwrap().is_none());
    // Rotated in the file: the next pull reads the new one, no restart.
    write(r#"{"auths": {"127.0.0.1:5000": {"auth": "Yzpk"}}}"#);
    assert_eq!(basic(at("127.0.0.1:5000").await.unwrap()), "Yzpk");
    let shown = format!("{r:?}");
    assert!(
        !shown.contains("Yzpk") && !shown.contains("YTpi"),
        "{shown}"
    );
}

#[test]
fn a_file_that_is_no_docker_config_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    std::fs::write(&file, "[1]").unwrap();
    let config = RegistryConfig {
        auth_file: Some(file),
        ..RegistryConfig::default()
    };
    let e = Registries::new(&config, 0).unwrap_err();
    assert!(e.contains("not a Docker config.json"), "{e}");
}
