use std::{env, path::PathBuf};

const PROTOS: &[&str] = &[
    "proto/forkyard/common/v1/common.proto",
    "proto/forkyard/sandbox/v1/sandbox.proto",
    "proto/forkyard/agent/v1/agent.proto",
    "proto/forkyard/budget/v1/budget.proto",
    "proto/forkyard/janitor/v1/janitor.proto",
    "proto/forkyard/gateway/v1/gateway.proto",
    "proto/forkyard/gateway/v1/keys.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("forkyard_descriptor.bin"))
        // The messages double as Temporal activity payloads, which the SDK encodes as JSON.
        .type_attribute(
            ".forkyard",
            "#[derive(serde::Serialize, serde::Deserialize)]",
        )
        .message_attribute(".forkyard", "#[serde(default)]")
        .compile_protos(PROTOS, &["proto"])?;
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
