//! Bad configuration fails fast: each real service binary, started with a missing or
//! unusable setting, exits at once with code 64 and a first stderr line that names the
//! setting — what a crash-looping pod shows in `kubectl logs`.

use forkyard_tests::mesh::{SERVICES, bin_dir};
use std::{
    net::TcpListener,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const EXIT_CONFIG: i32 = 64;

struct Exit {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

impl Exit {
    fn first_line(&self) -> &str {
        self.stderr.lines().next().unwrap_or("")
    }
}

/// Start `service` with a clean environment plus `env`; it must exit within 20 s.
fn start(service: &str, env: &[(&str, String)]) -> Exit {
    let bin = bin_dir().join(service);
    assert!(
        bin.exists(),
        "{} missing: build the services first (`cargo build --workspace --bins`)",
        bin.display()
    );
    let state = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(&bin);
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("FORKYARD_STATE_DIR", state.path())
        // Nothing listens here and the services would keep trying for a minute: a setting
        // checked only after connecting to Temporal would outlast the 20 s below.
        .env("TEMPORAL_ADDRESS", "127.0.0.1:9")
        .env("FORKYARD_TEMPORAL_CONNECT_TIMEOUT_SECS", "60")
        .env("FORKYARD_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env(
            "FORKYARD_METRICS_LISTEN",
            format!("127.0.0.1:{}", free_port()),
        )
        .env("FORKYARD_LLM_LISTEN", format!("127.0.0.1:{}", free_port()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{service} still running after 20 s; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    Exit {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether `service --help` lists the environment variable `name`.
fn accepts(service: &str, name: &str) -> bool {
    let out = Command::new(bin_dir().join(service))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains(&format!("[env: {name}="))
}

fn assert_config_error(service: &str, exit: &Exit, setting: &str) {
    assert_eq!(
        exit.code,
        Some(EXIT_CONFIG),
        "{service}: exit code; stderr:\n{}",
        exit.stderr
    );
    let first = exit.first_line();
    assert!(
        first.starts_with("configuration error:") && first.contains(setting),
        "{service}: the first stderr line must name {setting}, got:\n{}",
        exit.stderr
    );
    // "At once": without waiting on Temporal (a generous bound for a loaded CI machine).
    assert!(
        exit.took < Duration::from_secs(10),
        "{service}: took {:?} to refuse its configuration",
        exit.took
    );
}

#[test]
fn grpc_port_in_use_exits_64_naming_forkyard_listen() {
    for service in SERVICES {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let exit = start(service, &[("FORKYARD_LISTEN", addr.to_string())]);
        assert_config_error(service, &exit, "FORKYARD_LISTEN");
        assert!(
            exit.first_line().contains(&addr.to_string()),
            "{service}: name the address: {}",
            exit.first_line()
        );
    }
}

#[test]
fn metrics_port_in_use_exits_64_naming_forkyard_metrics_listen() {
    let mut checked = 0;
    for service in SERVICES {
        if !accepts(service, "FORKYARD_METRICS_LISTEN") {
            continue;
        }
        checked += 1;
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let exit = start(service, &[("FORKYARD_METRICS_LISTEN", addr.to_string())]);
        assert_config_error(service, &exit, "FORKYARD_METRICS_LISTEN");
    }
    assert!(checked > 0, "no service serves /metrics");
}

#[test]
fn empty_temporal_address_exits_64_naming_temporal_address() {
    // What a pod gets from the images (TEMPORAL_ADDRESS="" in the Dockerfile) when the
    // deployment does not say where Temporal is.
    for service in SERVICES {
        let exit = start(service, &[("TEMPORAL_ADDRESS", String::new())]);
        assert_config_error(service, &exit, "TEMPORAL_ADDRESS");
    }
}

#[test]
fn malformed_settings_exit_64_naming_the_setting() {
    for service in SERVICES {
        let exit = start(service, &[("FORKYARD_LISTEN", "nope".into())]);
        assert_config_error(service, &exit, "FORKYARD_LISTEN");
        let exit = start(service, &[("TEMPORAL_ADDRESS", "not an address:::".into())]);
        assert_config_error(service, &exit, "TEMPORAL_ADDRESS");
    }
}

#[test]
fn gateway_settings_out_of_range_exit_64_naming_the_setting() {
    // A run larger than this would pass Temporal's history warning; a bad provisioner
    // list would only fail at the first create.
    for (name, value) in [
        ("FORKYARD_MAX_FORKS", "5000"),
        // No run may have more forks than that.
        ("FORKYARD_INLINE_FORK_LIMIT", "1301"),
        ("FORKYARD_PROVISIONER_ADDR", " , "),
        ("FORKYARD_PROVISIONER_ADDR", "http://a:1,not a url"),
        // A crashed gateway's runs would never move, or wait past any timeout.
        ("FORKYARD_STICKY_TIMEOUT_SECS", "0"),
        ("FORKYARD_STICKY_TIMEOUT_SECS", "601"),
    ] {
        let exit = start("gateway", &[(name, value.into())]);
        assert_config_error("gateway", &exit, name);
    }
}

#[test]
fn tls_certificate_without_its_key_exits_64_naming_the_key() {
    for (cert, key) in [
        ("TEMPORAL_TLS_CERT", "TEMPORAL_TLS_KEY"),
        ("FORKYARD_TLS_CERT", "FORKYARD_TLS_KEY"),
    ] {
        let mut checked = 0;
        for service in SERVICES {
            if !accepts(service, cert) {
                continue;
            }
            checked += 1;
            let exit = start(service, &[(cert, "/nonexistent/cert.pem".into())]);
            assert_config_error(service, &exit, key);
        }
        assert!(checked > 0, "no service accepts {cert}");
    }
}

#[test]
fn llm_gateway_egress_price_and_repo_settings_exit_64_naming_the_setting() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let cases: &[(&str, &str, String)] = &[
        ("agent-runner", "FORKYARD_LLM_LISTEN", "nope".into()),
        (
            "agent-runner",
            "FORKYARD_LLM_LISTEN",
            taken.local_addr().unwrap().to_string(),
        ),
        (
            "sandbox-provisioner",
            "FORKYARD_SANDBOX_CPU_SECOND_USD",
            "-1".into(),
        ),
        (
            "sandbox-provisioner",
            "FORKYARD_EGRESS_PRIVATE_ALLOWED",
            "not-an-ip".into(),
        ),
        ("gateway", "FORKYARD_TENANT_EGRESS", "no equals sign".into()),
        ("gateway", "FORKYARD_EGRESS_SETS", "bad=ho st".into()),
        (
            "gateway",
            "FORKYARD_LOCAL_REPO_ROOTS",
            "/no/such/root".into(),
        ),
    ];
    for (service, name, value) in cases {
        let exit = start(service, &[(name, value.clone())]);
        assert_config_error(service, &exit, name);
    }
}

/// The console (HTTP, not among SERVICES): a taken or malformed listen address and a
/// gateway it cannot speak to exit 64 naming the setting.
#[test]
fn console_bad_settings_exit_64_naming_them() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    let cases = [
        (
            "FORKYARD_CONSOLE_LISTEN",
            addr.as_str(),
            "FORKYARD_CONSOLE_LISTEN",
        ),
        (
            "FORKYARD_CONSOLE_LISTEN",
            "not-an-address",
            "FORKYARD_CONSOLE_LISTEN",
        ),
        ("FORKYARD_GATEWAY", "grpc://gateway", "FORKYARD_GATEWAY"),
    ];
    for (name, value, setting) in cases {
        let mut env = vec![(name, value.to_owned())];
        if name != "FORKYARD_CONSOLE_LISTEN" {
            env.push(("FORKYARD_CONSOLE_LISTEN", free.clone()));
        }
        let exit = start("console", &env);
        assert_config_error("console", &exit, setting);
    }
}
