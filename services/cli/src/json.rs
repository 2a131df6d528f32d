//! `-o json`: the standard protobuf JSON mapping (field names in lowerCamelCase, enums by
//! name, 64-bit integers as strings, default values left out), as grpcurl and every
//! protobuf library print it, read off the gateway's own descriptors.

use prost_reflect::{DescriptorPool, DynamicMessage};
use std::sync::OnceLock;

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(forkyard_proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptors built into forkyard-proto decode")
    })
}

/// `message` (of the protobuf type `full_name`, e.g. `forkyard.gateway.v1.Run`) as JSON.
pub fn to_string<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<String> {
    let dynamic = dynamic(message, full_name)?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::pretty(&mut out);
    dynamic.serialize_with_options(&mut ser, &prost_reflect::SerializeOptions::new())?;
    Ok(String::from_utf8(out)?)
}

/// `message` read again through its descriptor, which knows the JSON names.
fn dynamic<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<DynamicMessage> {
    let descriptor = pool()
        .get_message_by_name(full_name)
        .ok_or_else(|| anyhow::anyhow!("no protobuf message {full_name} in the descriptors"))?;
    Ok(DynamicMessage::decode(
        descriptor,
        message.encode_to_vec().as_slice(),
    )?)
}

#[cfg(test)]
mod tests {
    use forkyard_proto::{
        common::v1::{ForkResult, ForkStatus},
        gateway::v1::{Run, RunState},
    };

    #[test]
    fn runs_print_as_grpcurl_prints_them() {
        let run = Run {
            run_id: "run-1".into(),
            state: RunState::Completed as i32,
            cost_micros: 120_000,
            forks: vec![ForkResult {
                fork: 2,
                status: ForkStatus::Succeeded as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = super::to_string(&run, "forkyard.gateway.v1.Run").unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["runId"], "run-1", "{text}");
        assert_eq!(v["state"], "RUN_STATE_COMPLETED", "{text}");
        // int64 as a string, as the mapping says.
        assert_eq!(v["costMicros"], "120000", "{text}");
        assert_eq!(v["forks"][0]["status"], "FORK_STATUS_SUCCEEDED", "{text}");
        // Defaults are left out.
        assert!(v.get("error").is_none(), "{text}");
    }

    #[test]
    fn an_unknown_type_is_an_error_not_a_panic() {
        let run = Run::default();
        assert!(super::to_string(&run, "forkyard.nope.v1.Run").is_err());
    }
}

/// `message` as YAML, as kubectl prints an object: the same mapping as [`to_string`]
/// (field order kept), written by a YAML library in block style, keys unquoted, a
/// string quoted only where YAML would read it as another type, multi-line strings
/// (patches, output tails) as literal blocks.
pub fn to_yaml<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<String> {
    let dynamic = dynamic(message, full_name)?;
    let mut out = Vec::new();
    let mut ser = serde_norway::Serializer::new(&mut out);
    dynamic.serialize_with_options(&mut ser, &prost_reflect::SerializeOptions::new())?;
    Ok(String::from_utf8(out)?)
}

/// Anything serde serializes (keys, contexts) as YAML, written as [`to_yaml`] writes.
pub fn value_to_yaml<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    Ok(serde_norway::to_string(value)?)
}

#[cfg(test)]
mod yaml_tests {
    use forkyard_proto::{
        common::v1::{ForkResult, ForkStatus},
        gateway::v1::{Run, RunState},
    };

    /// As kubectl prints: keys bare, plain strings bare, a list's items at its key's
    /// indentation, a string that reads as a number quoted, several lines as a block.
    #[test]
    fn runs_print_as_kubectl_prints_yaml() {
        let run = Run {
            run_id: "run-1".into(),
            state: RunState::Completed as i32,
            cost_micros: 120_000,
            error: "a: \"quoted\"\nsecond line".into(),
            forks: vec![ForkResult {
                fork: 2,
                status: ForkStatus::Succeeded as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = super::to_yaml(&run, "forkyard.gateway.v1.Run").unwrap();
        assert!(
            text.starts_with("runId: run-1\nstate: RUN_STATE_COMPLETED\n"),
            "{text}"
        );
        assert!(
            text.contains("forks:\n- fork: 2\n  status: FORK_STATUS_SUCCEEDED\n"),
            "{text}"
        );
        assert!(text.contains("costMicros: '120000'\n"), "{text}");
        assert!(
            text.contains("error: |-\n  a: \"quoted\"\n  second line\n"),
            "{text}"
        );
        // And it reads back as the JSON mapping's values.
        let back: serde_json::Value = serde_norway::from_str(&text).unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&super::to_string(&run, "forkyard.gateway.v1.Run").unwrap())
                .unwrap();
        assert_eq!(back, json);
    }
}
