//! The `e2b` backend's TTL and pseudo-terminals against the local E2B-protocol server
//! (tests/common/fake_e2b.rs, fake_e2b_session.rs), through the gRPC service.

mod common;

use common::{fake_e2b, make_repo};
use forkyard_proto::sandbox::v1::{
    CreateSandboxRequest, GetSandboxRequest, PtyEvent, ResizePtyRequest, SandboxState,
    StartPtyRequest, StartSandboxRequest, StopSandboxRequest, WritePtyRequest, pty_event::Event,
    sandbox_provisioner_server::SandboxProvisioner,
};
use forkyard_sandbox_provisioner::{
    Backends, Config, Provisioner, SandboxService,
    e2b::{ApiKey, E2bConfig},
};
use futures::StreamExt;
use std::time::Duration;
use tonic::{Code, Request};

const KEY: &str = "e2b_test_key_0c3e7d1b";

async fn open(tmp: &std::path::Path, server: &str) -> Backends {
    let config = Config::new(tmp.join("state"), "http://127.0.0.1:50052");
    let e2b = E2bConfig {
        api_url: server.into(),
        domain: server.into(),
        api_key: Some(ApiKey::new(KEY)),
        request_timeout: Duration::from_secs(5),
        ..E2bConfig::default()
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    Backends::open(core, e2b).expect("open backends")
}

fn create_req(repo: &std::path::Path, ttl_secs: u32) -> CreateSandboxRequest {
    CreateSandboxRequest {
        backend: "e2b".into(),
        repo: repo.to_string_lossy().into_owned(),
        branch: "fork-1".into(),
        ttl_secs,
        ..Default::default()
    }
}

use forkyard_common::clock::now_ms;

#[tokio::test]
async fn e2b_timeout_follows_the_ttl_after_create_and_on_resume() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let server = fake_e2b::start(KEY).await;
    let svc = SandboxService::with_backends(open(tmp.path(), &server.url).await);

    let before = now_ms();
    let sbx = svc
        .create_sandbox(Request::new(create_req(&repo, 600)))
        .await
        .unwrap()
        .into_inner();
    let sid = sbx.id.trim_start_matches("e2b-").to_owned();
    assert!(
        (before + 600_000..=now_ms() + 600_000).contains(&sbx.expires_unix_ms),
        "expires {} for a 600 s ttl created at {before}",
        sbx.expires_unix_ms
    );
    // Create asks for the ttl; once the clone is done, set-timeout asks for what is left.
    let asked: Vec<(&str, u64)> = server
        .fake
        .timeouts
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _, _)| *id == sid)
        .map(|(_, what, t)| (*what, *t))
        .collect();
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0], ("create", 600));
    assert_eq!(asked[1].0, "set");
    assert!((595..=600).contains(&asked[1].1), "{asked:?}");
    // The expiry survives a get (kept in the sandbox's metadata, not E2B's endAt).
    let got = svc
        .get_sandbox(Request::new(GetSandboxRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.expires_unix_ms, sbx.expires_unix_ms);
    assert!(
        !got.labels.keys().any(|k| k.starts_with("forkyard.")),
        "{:?}",
        got.labels
    );

    // Stop pauses; start resumes with the time left, not a fixed default.
    let stopped = svc
        .stop_sandbox(Request::new(StopSandboxRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stopped.state, SandboxState::Stopped as i32);
    let started = svc
        .start_sandbox(Request::new(StartSandboxRequest {
            sandbox_id: sbx.id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(started.state, SandboxState::Ready as i32);
    let resumed = server
        .fake
        .timeouts
        .lock()
        .unwrap()
        .last()
        .cloned()
        .unwrap();
    assert_eq!((resumed.0.as_str(), resumed.1), (sid.as_str(), "resume"));
    assert!((590..=600).contains(&resumed.2), "{resumed:?}");

    // A sandbox whose ttl ran out while paused is destroyed instead of resumed.
    let short = svc
        .create_sandbox(Request::new(create_req(&repo, 1)))
        .await
        .unwrap()
        .into_inner();
    svc.stop_sandbox(Request::new(StopSandboxRequest {
        sandbox_id: short.id.clone(),
    }))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let err = svc
        .start_sandbox(Request::new(StartSandboxRequest {
            sandbox_id: short.id.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("ttl"), "{err:?}");
    let short_sid = short.id.trim_start_matches("e2b-");
    assert!(
        !server
            .fake
            .sandboxes
            .lock()
            .unwrap()
            .contains_key(short_sid)
    );
}

type Events =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<PtyEvent, tonic::Status>> + Send>>;

async fn until(events: &mut Events, want: &str) -> String {
    let mut seen = String::new();
    let res = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.next().await {
            match ev.unwrap().event.unwrap() {
                Event::Output(b) => {
                    seen.push_str(&String::from_utf8_lossy(&b));
                    if seen.contains(want) {
                        return;
                    }
                }
                other => panic!("unexpected {other:?} before {want:?}; output {seen:?}"),
            }
        }
    })
    .await;
    assert!(res.is_ok(), "no {want:?} in {seen:?}");
    seen
}

#[tokio::test]
async fn e2b_pty_takes_input_resizes_and_is_interrupted_by_ctrl_c() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let server = fake_e2b::start(KEY).await;
    let svc = SandboxService::with_backends(open(tmp.path(), &server.url).await);
    let sbx = svc
        .create_sandbox(Request::new(create_req(&repo, 600)))
        .await
        .unwrap()
        .into_inner();

    let script = "read line; echo got-$line; stty size; \
                  trap 'stty size; echo winched' WINCH; echo ready; \
                  while :; do sleep 0.1; done";
    let mut events: Events = svc
        .start_pty(Request::new(StartPtyRequest {
            sandbox_id: sbx.id.clone(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
            rows: 20,
            cols: 70,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let Some(Ok(PtyEvent {
        event: Some(Event::PtyId(pty)),
    })) = events.next().await
    else {
        panic!("the first event names the pty")
    };
    let write = |data: &str| WritePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        data: data.as_bytes().to_vec(),
    };

    svc.write_pty(Request::new(write("abc\n"))).await.unwrap();
    let out = until(&mut events, "ready\r\n").await;
    assert!(
        out.contains("abc\r\n"),
        "the terminal echoes input: {out:?}"
    );
    assert!(out.contains("got-abc\r\n20 70\r\n"), "{out:?}");

    svc.resize_pty(Request::new(ResizePtyRequest {
        sandbox_id: sbx.id.clone(),
        pty_id: pty.clone(),
        rows: 33,
        cols: 101,
    }))
    .await
    .unwrap();
    until(&mut events, "33 101\r\nwinched").await;

    svc.write_pty(Request::new(write("\x03"))).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = events.next().await {
            if let Some(Event::Exit(e)) = ev.unwrap().event {
                return e;
            }
        }
        panic!("no exit event")
    })
    .await
    .unwrap();
    assert_eq!(
        exit.exit_code, 130,
        "^C ends the command with SIGINT: {exit:?}"
    );
    let err = svc.write_pty(Request::new(write("x"))).await.unwrap_err();
    assert_eq!(
        err.code(),
        Code::NotFound,
        "the pty is gone with its command"
    );
}

#[tokio::test]
async fn e2b_pty_command_is_killed_when_the_stream_is_dropped() {
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let server = fake_e2b::start(KEY).await;
    let svc = SandboxService::with_backends(open(tmp.path(), &server.url).await);
    let sbx = svc
        .create_sandbox(Request::new(create_req(&repo, 600)))
        .await
        .unwrap()
        .into_inner();
    let marker = common::unique_sleep();
    let mut events: Events = svc
        .start_pty(Request::new(StartPtyRequest {
            sandbox_id: sbx.id.clone(),
            argv: vec!["sleep".into(), marker.clone()],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        events.next().await,
        Some(Ok(PtyEvent {
            event: Some(Event::PtyId(_))
        }))
    ));
    assert!(
        common::eventually(Duration::from_secs(10), || !common::host_pids_with(&marker)
            .is_empty())
        .await
    );
    drop(events);
    assert!(
        common::eventually(Duration::from_secs(10), || common::host_pids_with(&marker)
            .is_empty())
        .await,
        "hanging up kills the command through envd's SendSignal"
    );
}
