use super::code_name;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

fn count(side: &str, method: &str, code: &str) -> u64 {
    let metrics = if side == "server" {
        &super::SERVER
    } else {
        &super::CLIENT
    };
    metrics.requests.with_label_values(&[method, code]).get()
}

/// Both layers see the call's real status: OK from the trailers of a normal response,
/// NOT_FOUND from a trailers-only error response.
#[tokio::test]
async fn both_sides_count_calls_by_method_and_code() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("known", tonic_health::ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(super::GrpcServerLayer)
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut client = HealthClient::new(super::traced_channel(channel));
    let method = "grpc.health.v1.Health/Check";
    let ask = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    client.check(ask("known")).await.expect("known service");
    let err = client.check(ask("unknown")).await.expect_err("unknown");
    assert_eq!(err.code(), tonic::Code::NotFound);
    // The server records when its response body is done, just after the client has it.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for side in ["server", "client"] {
        assert_eq!(count(side, method, "OK"), 1, "{side}");
        assert_eq!(count(side, method, "NOT_FOUND"), 1, "{side}");
    }
}

#[test]
fn codes_have_canonical_names() {
    assert_eq!(code_name(0), "OK");
    assert_eq!(code_name(3), "INVALID_ARGUMENT");
    assert_eq!(code_name(16), "UNAUTHENTICATED");
    assert_eq!(code_name(99), "UNKNOWN");
}
