//! gRPC errors carry the standard `google.rpc` details clients act on: a `BadRequest`
//! naming the field of bad input, an `ErrorInfo` with a stable reason and the service's
//! domain, a `RetryInfo` where waiting helps; the messages stay as they were. Read
//! through tonic's `StatusExt` and through the real grpcurl.

use forkyard_proto::{
    budget::v1::{ReserveRequest, budget_ledger_client::BudgetLedgerClient},
    gateway::v1::{GetRunRequest, LaunchRunRequest, gateway_client::GatewayClient},
    sandbox::v1::{CreateSandboxRequest, sandbox_provisioner_client::SandboxProvisionerClient},
};
use forkyard_tests::{Mesh, repo, support::launch};
use tonic::Code;
use tonic_types::StatusExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_their_field_reason_and_retry_advice() {
    let mesh = Mesh::start().await.expect("mesh");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = GatewayClient::new(mesh.channel("gateway").await.unwrap());

    // Bad input at the gateway: the field, in the message and in the details.
    let bad = gw
        .launch_run(LaunchRunRequest {
            forks: 0,
            ..launch(src.path(), 1, 1, "true")
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(bad.message().starts_with("forks"), "{bad:?}");
    let violations = bad
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    assert_eq!(violations[0].field, "forks", "{violations:?}");
    let info = bad.get_details_error_info().expect("ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("INVALID_ARGUMENT", "gateway.forkyard")
    );

    // An unknown run: its own reason, and no advice to retry.
    let missing = gw
        .get_run(GetRunRequest {
            run_id: "run-00000000000000000000000000000000".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        missing.get_details_error_info().expect("ErrorInfo").reason,
        "RUN_NOT_FOUND"
    );
    assert!(missing.get_details_retry_info().is_none());

    // The internal services speak the same way.
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await.unwrap());
    let bad = ledger
        .reserve(ReserveRequest {
            account_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let violations = bad
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    assert_eq!(violations[0].field, "account_id", "{bad:?}");
    assert_eq!(
        bad.get_details_error_info().unwrap().domain,
        "budget-ledger.forkyard"
    );
    let mut prov =
        SandboxProvisionerClient::new(mesh.channel("sandbox-provisioner").await.unwrap());
    let bad = prov
        .create_sandbox(CreateSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    let violations = bad
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    assert_eq!(violations[0].field, "repo", "{bad:?}");

    // grpcurl, as an operator meets the error, shows the details.
    let out =
        std::process::Command::new(std::env::var("GRPCURL").unwrap_or_else(|_| "grpcurl".into()))
            .args([
                "-plaintext",
                "-d",
                r#"{"forks": 0, "repo": "/x", "prompt": "p"}"#,
            ])
            .arg(format!("127.0.0.1:{}", mesh.port("gateway")))
            .arg("forkyard.gateway.v1.Gateway/LaunchRun")
            .output()
            .expect("grpcurl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(r#""fieldViolations":[{"field":"forks""#),
        "{text}"
    );
}

/// A replica that cannot serve yet says when to come back.
#[test]
fn unavailable_and_resource_exhausted_advise_a_retry() {
    let s: tonic::Status =
        forkyard_gateway::error::GatewayError::ResourceExhausted("tenant limit".into()).into();
    assert!(
        s.get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .is_some()
    );
    let s: tonic::Status = forkyard_gateway::error::GatewayError::Temporal("down".into()).into();
    assert_eq!(
        s.get_details_error_info().unwrap().reason,
        "TEMPORAL_UNAVAILABLE"
    );
    assert!(s.get_details_retry_info().is_some());
}
