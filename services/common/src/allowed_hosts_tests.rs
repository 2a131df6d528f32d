use super::*;

const SETTING: &str = "FORKYARD_ALLOWED_TEST_HOSTS";

fn list(entries: &[&str]) -> AllowedHosts {
    AllowedHosts::parse(
        SETTING,
        &entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>(),
    )
    .unwrap()
}

#[test]
fn entries_are_hosts_ports_and_subdomain_patterns() {
    let l = list(&[
        "github.com",
        "*.corp.example:8443",
        "10.0.0.7:5000",
        "[fd00::7]",
    ]);
    assert!(l.admits("GitHub.com.", 443) && l.admits("github.com", 22));
    assert!(!l.admits("api.github.com", 443) && !l.admits("evilgithub.com", 443));
    assert!(l.admits("git.corp.example", 8443) && l.admits("a.b.corp.example", 8443));
    assert!(!l.admits("git.corp.example", 443) && !l.admits("corp.example", 8443));
    assert!(l.admits("10.0.0.7", 5000) && !l.admits("10.0.0.7", 5001));
    assert!(l.admits("[fd00:0::7]", 1) && l.admits("fd00::7", 2));
    assert!(list(&[]).admits("anything.example", 1));
}

#[test]
fn bad_entries_are_refused_naming_the_setting() {
    for bad in [
        "*",
        "host:0",
        "host:65536",
        "host:x",
        "a b",
        "*.10.0.0.1",
        "a.*.com",
        "-oProxyCommand=x",
        "[::1",
        &"a".repeat(254),
    ] {
        let e = AllowedHosts::parse(SETTING, &[bad.to_owned()]).unwrap_err();
        assert!(e.starts_with(SETTING), "{bad:?}: {e}");
    }
    assert!(AllowedHosts::parse(SETTING, &[" ".into(), String::new()]).is_ok());
}

#[test]
fn only_exact_entries_let_a_host_have_internal_addresses() {
    let l = list(&["registry.corp", "*.corp.example", "127.0.0.1:5000"]);
    let internal: IpAddr = "10.1.2.3".parse().unwrap();
    assert!(
        l.check_addrs("registry.corp", Some(443), [internal])
            .is_ok()
    );
    assert!(matches!(
        l.check_addrs("git.corp.example", Some(443), [internal]),
        Err(Refusal::NotPublic { .. })
    ));
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    assert!(l.check_addrs("127.0.0.1", Some(5000), [lo]).is_ok());
    assert!(l.check_addrs("127.0.0.1", Some(5001), [lo]).is_err());
    // One internal address among public ones is enough to refuse.
    let public: IpAddr = "1.1.1.1".parse().unwrap();
    assert!(
        list(&[])
            .check_addrs("x.example", None, [public, internal])
            .is_err()
    );
}

#[tokio::test]
async fn names_are_resolved_and_every_address_checked() {
    let any = list(&[]);
    // `127.1` is no IP address to Rust but the system's resolver reads it as
    // 127.0.0.1 (inet_aton's short forms): a name that resolves to loopback.
    for (host, addr) in [
        ("127.1", "127.0.0.1"),
        ("100.64.1", "100.64.0.1"),
        ("169.254.43518", "169.254.169.254"),
        ("localhost", "127.0.0.1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
    ] {
        match any.resolve(host, 80).await {
            Err(Refusal::NotPublic { addr: got, .. }) => {
                assert_eq!(got.to_string(), addr, "{host}");
            }
            other => panic!("{host}: {other:?}"),
        }
    }
    let addrs = list(&["127.1"]).resolve("127.1", 80).await.unwrap();
    assert_eq!(addrs, vec!["127.0.0.1:80".parse().unwrap()]);
    assert!(matches!(
        list(&["github.com"]).resolve("127.1", 80).await,
        Err(Refusal::NotListed { .. })
    ));
    assert!(matches!(
        any.resolve("no-such-host.invalid", 80).await,
        Err(Refusal::Unresolved { .. })
    ));
}

#[test]
fn authorities_split_into_host_and_port() {
    assert_eq!(split_host_port("h:5000"), Ok(("h", Some(5000))));
    assert_eq!(split_host_port("[::1]:5000"), Ok(("::1", Some(5000))));
    assert_eq!(split_host_port("::1"), Ok(("::1", None)));
    assert_eq!(split_host_port("h"), Ok(("h", None)));
    assert!(split_host_port("h:0").is_err() && split_host_port("[::1]x").is_err());
}
