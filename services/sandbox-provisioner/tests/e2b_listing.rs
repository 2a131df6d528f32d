//! What the rest of the mesh learns of the e2b backend through the gRPC service, against
//! the local E2B server: which backends a replica offers (the gateway asks before it
//! accepts a run's backend), and E2B sandboxes listed by their run's labels beside local
//! ones (the janitor's sweep lists them so, and destroys orphans there).

mod common;

use common::{fake_e2b, make_repo};
use forkyard_proto::{
    labels,
    sandbox::v1::{
        CreateSandboxRequest, DestroySandboxRequest, ListBackendsRequest, ListSandboxesRequest,
        sandbox_provisioner_server::SandboxProvisioner,
    },
};
use forkyard_sandbox_provisioner::{
    Backends, Config, Provisioner, SandboxService,
    e2b::{ApiKey, E2bConfig},
};
use std::{collections::HashMap, time::Duration};
use tonic::Request;

const KEY: &str = "e2b_test_key_list_77";

async fn service(tmp: &std::path::Path, server: &str, key: Option<&str>) -> SandboxService {
    let config = Config::new(tmp.join("state"), "http://127.0.0.1:50052");
    let e2b = E2bConfig {
        api_url: server.into(),
        domain: server.into(),
        api_key: key.map(ApiKey::new),
        request_timeout: Duration::from_secs(2),
        ..E2bConfig::default()
    };
    let core = Provisioner::open(config).await.expect("open provisioner");
    SandboxService::with_backends(Backends::open(core, e2b).expect("open backends"))
}

async fn offered(svc: &SandboxService) -> Vec<String> {
    svc.list_backends(Request::new(ListBackendsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .backends
}

async fn listed(svc: &SandboxService, selector: &[(&str, &str)]) -> Vec<(String, String)> {
    let label_selector: HashMap<String, String> = selector
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    svc.list_sandboxes(Request::new(ListSandboxesRequest { label_selector }))
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .into_iter()
        .map(|s| (s.id, s.backend))
        .collect()
}

#[tokio::test]
async fn e2b_is_offered_only_with_a_key_and_its_sandboxes_are_listed_by_labels() {
    let server = fake_e2b::start(KEY).await;
    let tmp = common::let_through(tempfile::tempdir().unwrap());
    let repo = make_repo(tmp.path());
    let without = service(&tmp.path().join("a"), &server.url, None).await;
    assert_eq!(offered(&without).await, ["local"]);
    let svc = service(&tmp.path().join("b"), &server.url, Some(KEY)).await;
    assert_eq!(offered(&svc).await, ["local", "e2b"]);

    let run = |backend: &str, id: &str| CreateSandboxRequest {
        backend: backend.into(),
        repo: repo.to_string_lossy().into_owned(),
        branch: format!("{backend}-1"),
        labels: HashMap::from([
            (labels::RUN_ID.to_owned(), id.to_owned()),
            (labels::WORKFLOW_ID.to_owned(), id.to_owned()),
        ]),
        ..Default::default()
    };
    let on_e2b = svc
        .create_sandbox(Request::new(run("e2b", "run-a")))
        .await
        .unwrap()
        .into_inner();
    let on_local = svc
        .create_sandbox(Request::new(run("local", "run-a")))
        .await
        .unwrap()
        .into_inner();
    let mut of_run = listed(&svc, &[(labels::RUN_ID, "run-a")]).await;
    of_run.sort();
    assert_eq!(
        of_run,
        [
            (on_e2b.id.clone(), "e2b".to_owned()),
            (on_local.id.clone(), "local".to_owned())
        ]
    );
    assert!(listed(&svc, &[(labels::RUN_ID, "run-b")]).await.is_empty());
    // A replica without the key lists no E2B sandbox (it could not destroy one).
    assert!(
        listed(&without, &[(labels::RUN_ID, "run-a")])
            .await
            .is_empty()
    );
    for id in [on_e2b.id, on_local.id] {
        svc.destroy_sandbox(Request::new(DestroySandboxRequest {
            sandbox_id: id,
            reason: "test".into(),
        }))
        .await
        .unwrap();
    }
    assert!(server.fake.sandboxes.lock().unwrap().is_empty());
}
