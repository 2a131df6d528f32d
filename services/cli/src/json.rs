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
    let descriptor = pool()
        .get_message_by_name(full_name)
        .ok_or_else(|| anyhow::anyhow!("no protobuf message {full_name} in the descriptors"))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::pretty(&mut out);
    dynamic.serialize_with_options(&mut ser, &prost_reflect::SerializeOptions::new())?;
    Ok(String::from_utf8(out)?)
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

/// `message` as YAML: the same mapping as [`to_string`], in block style. Strings are
/// written as YAML's double-quoted scalars (JSON's escapes are YAML's), so no value can be
/// read as another type or break the layout.
pub fn to_yaml<M: prost::Message>(message: &M, full_name: &str) -> anyhow::Result<String> {
    let value: serde_json::Value = serde_json::from_str(&to_string(message, full_name)?)?;
    Ok(value_to_yaml(&value))
}

/// Any JSON value as block YAML (see [`to_yaml`]).
pub fn value_to_yaml(value: &serde_json::Value) -> String {
    let mut out = String::new();
    yaml(value, 0, &mut out);
    out
}

fn yaml(v: &serde_json::Value, indent: usize, out: &mut String) {
    use serde_json::Value;
    let pad = " ".repeat(indent);
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, item) in map {
                out.push_str(&format!("{pad}{}:", Value::String(k.clone())));
                nested(item, indent, out);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for item in items {
                out.push_str(&format!("{pad}-"));
                nested(item, indent, out);
            }
        }
        scalar => out.push_str(&format!("{pad}{scalar}\n")),
    }
}

/// After `key:` or `-`: a scalar (or an empty map or list) on the same line, anything
/// else on the lines below, indented.
fn nested(v: &serde_json::Value, indent: usize, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            yaml(v, indent + 2, out);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            yaml(v, indent + 2, out);
        }
        scalar => out.push_str(&format!(" {scalar}\n")),
    }
}

#[cfg(test)]
mod yaml_tests {
    use forkyard_proto::{
        common::v1::{ForkResult, ForkStatus},
        gateway::v1::{Run, RunState},
    };

    #[test]
    fn runs_print_as_block_yaml() {
        let run = Run {
            run_id: "run-1".into(),
            state: RunState::Completed as i32,
            error: "a: \"quoted\"\nsecond line".into(),
            forks: vec![ForkResult {
                fork: 2,
                status: ForkStatus::Succeeded as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = super::to_yaml(&run, "forkyard.gateway.v1.Run").unwrap();
        assert!(text.contains("\"runId\": \"run-1\"\n"), "{text}");
        assert!(
            text.contains("\"state\": \"RUN_STATE_COMPLETED\"\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "\"forks\":\n  -\n    \"fork\": 2\n    \"status\": \"FORK_STATUS_SUCCEEDED\"\n"
            ),
            "{text}"
        );
        // A value with a colon, quotes and a newline stays one quoted scalar.
        assert!(
            text.contains(r#""error": "a: \"quoted\"\nsecond line""#),
            "{text}"
        );
    }
}
