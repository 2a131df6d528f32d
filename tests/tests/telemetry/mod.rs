//! What e2e_telemetry checks, beside the tests themselves: a trace's spans and how they
//! hang together (spans), and each service's metrics page after a run (metrics).

pub mod metrics;
pub mod spans;
