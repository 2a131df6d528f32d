use super::*;
use std::ffi::OsString;

fn cli() -> Flags {
    Flags::default()
}

fn prod() -> (String, Context) {
    (
        "prod".into(),
        Context {
            gateway: Some("https://prod:443".into()),
            ca: Some("/prod-ca.pem".into()),
            api_key_command: Some("echo k".into()),
            output: Some(Output::Yaml),
            ..Default::default()
        },
    )
}

#[test]
fn the_file_is_forkyard_config_else_xdg_else_home() {
    let os = |s: &str| Some(OsString::from(s));
    assert_eq!(
        path_from(os("/etc/fy.toml"), os("/xdg"), os("/home/me")),
        Some("/etc/fy.toml".into())
    );
    assert_eq!(
        path_from(None, os("/xdg"), os("/home/me")),
        Some("/xdg/forkyard/config.toml".into())
    );
    // A relative XDG_CONFIG_HOME is ignored, as the spec says.
    assert_eq!(
        path_from(None, os("xdg"), os("/home/me")),
        Some("/home/me/.config/forkyard/config.toml".into())
    );
    assert_eq!(path_from(None, None, None), None);
}

#[test]
fn flags_win_then_the_context_then_the_defaults() {
    let s = Settings::resolve(&cli(), None);
    assert_eq!(s.gateway, DEFAULT_GATEWAY);
    assert_eq!(
        (s.key, s.output, s.gateway_ca),
        (Key::None, Output::Table, None)
    );

    let s = Settings::resolve(&cli(), Some(prod()));
    assert_eq!(s.gateway, "https://prod:443");
    assert_eq!(s.gateway_ca, Some("/prod-ca.pem".into()));
    assert_eq!(s.output, Output::Yaml);
    assert_eq!(
        s.key,
        Key::Command {
            context: "prod".into(),
            command: "echo k".into()
        }
    );

    let mut flags = cli();
    flags.output = Some(Output::Json);
    flags.api_key = Some("given".into());
    let s = Settings::resolve(&flags, Some(prod()));
    assert_eq!(
        (s.output, s.key),
        (Output::Json, Key::Given("given".into()))
    );

    // --jq reads JSON, whatever the context prints.
    let mut jq = cli();
    jq.jq = true;
    assert_eq!(Settings::resolve(&jq, Some(prod())).output, Output::Json);
}

/// A key is a secret for one gateway: pointed elsewhere, the context's key and CA stay
/// home.
#[test]
fn another_gateway_never_gets_the_contexts_key_or_ca() {
    let mut elsewhere = cli();
    elsewhere.gateway = Some("http://other:50051".into());
    let s = Settings::resolve(&elsewhere, Some(prod()));
    assert_eq!(s.gateway, "http://other:50051");
    assert_eq!((s.key, s.gateway_ca), (Key::None, None));

    let mut same = cli();
    same.gateway = Some("https://prod:443".into());
    assert_ne!(Settings::resolve(&same, Some(prod())).key, Key::None);
}

#[test]
fn the_file_round_trips_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/config.toml");
    assert!(load(&path).unwrap().contexts.is_empty());
    let mut config = Config {
        current_context: Some("prod".into()),
        ..Default::default()
    };
    config.contexts.insert("prod".into(), prod().1);
    save(&path, &config).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("current-context = \"prod\"\n"), "{text}");
    assert!(text.contains("[contexts.prod]\n"), "{text}");
    assert!(text.contains("api-key-command = \"echo k\"\n"), "{text}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let back = load(&path).unwrap();
    assert_eq!(back.contexts["prod"], prod().1);
}

#[test]
fn a_bad_file_names_itself_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[contexts.a]\ngateway = 1\n").unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.starts_with(&path.display().to_string()), "{e}");
    std::fs::write(&path, "[contexts.a]\ngatway = \"x\"\n").unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.contains("gatway"), "{e}");
    std::fs::write(
        &path,
        "[contexts.a]\napi-key = \"k\"\napi-key-command = \"c\"\n",
    )
    .unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.contains("both api-key and api-key-command"), "{e}");
}

#[test]
fn the_key_command_prints_the_key() {
    let key = |command: &str| {
        Key::Command {
            context: "c".into(),
            command: command.into(),
        }
        .get(false)
    };
    assert_eq!(key("echo '  fyk_1  '").unwrap(), Some("fyk_1".into()));
    let e = key("exit 3").unwrap_err().to_string();
    assert!(e.contains("api-key-command of context c failed"), "{e}");
    let e = key("true").unwrap_err().to_string();
    assert!(e.contains("printed nothing"), "{e}");
}
