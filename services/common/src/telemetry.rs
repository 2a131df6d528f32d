//! Logging: JSON lines when stderr is not a terminal (services under a supervisor),
//! human-readable text on a terminal. `RUST_LOG` filters, default `info`.

use std::io::IsTerminal;
use tracing_subscriber::{EnvFilter, fmt};

pub fn init(service: &'static str) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,temporalio_sdk_core=warn,temporalio_client=warn"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = if std::io::stderr().is_terminal() {
        builder.try_init()
    } else {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init()
    };
    if result.is_ok() {
        tracing::info!(service, version = env!("CARGO_PKG_VERSION"), "starting");
    }
}
