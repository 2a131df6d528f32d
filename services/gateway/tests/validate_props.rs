//! Property tests of the gateway's validators: random and hostile requests (huge prompts,
//! many and huge labels, control characters, absurd numbers) never panic, and every
//! refusal is INVALID_ARGUMENT whose message starts with the offending field's name.
//! (The RPCs themselves get the same treatment over gRPC in tests/tests/e2e_fuzz.rs.)

use forkyard_gateway::{
    auth::{Tenant, keys::check_tenant},
    error::GatewayError,
    search::list_query,
    validate::{Limits, check_run_id, launch_spec, run_id_for},
};
use forkyard_proto::{
    common::v1::AgentSpec,
    gateway::v1::{LaunchRunRequest, RunState, Search},
};
use proptest::prelude::*;
use std::collections::HashMap;

/// Fields of LaunchRunRequest: a refusal names one of them first.
const FIELDS: &[&str] = &[
    "backend",
    "search",
    "image",
    "isolation",
    "request_id",
    "repo",
    "base_ref",
    "branch",
    "prompt",
    "forks",
    "max_concurrent",
    "budget_usd",
    "agent",
    "fork_timeout_secs",
    "labels",
    "verify_command",
    "verify_timeout_secs",
    "stop_on_first_verified",
    "fork_budget_usd",
];

/// Strings a hostile caller sends: empty, huge, control characters, quotes, unicode.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        ".{0,40}",
        "[\\x00-\\x1f'\"\\\\;=]{1,20}",
        (1usize..200_000).prop_map(|n| "x".repeat(n)),
        (0usize..2000).prop_map(|n| "{[(".repeat(n)),
        Just("../../etc/passwd".to_owned()),
        Just("run-' OR 1=1 --".to_owned()),
        Just("\u{202e}\u{0}\u{feff}".to_owned()),
    ]
}

fn absurd_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u32::MAX),
        Just(u32::MAX - 1),
        any::<u32>()
    ]
}

fn labels() -> impl Strategy<Value = HashMap<String, String>> {
    prop_oneof![
        prop::collection::hash_map(nasty_string(), nasty_string(), 0..4),
        // Many labels, and deeply "nested" keys.
        (0usize..300).prop_map(|n| (0..n)
            .map(|i| (format!("k{i}{}", "/a".repeat(i % 50)), "v".repeat(i)))
            .collect()),
    ]
}

fn request() -> impl Strategy<Value = LaunchRunRequest> {
    (
        (
            nasty_string(),
            nasty_string(),
            nasty_string(),
            nasty_string(),
        ),
        (absurd_u32(), absurd_u32(), absurd_u32(), absurd_u32()),
        (
            nasty_string(),
            nasty_string(),
            nasty_string(),
            nasty_string(),
        ),
        (labels(), any::<bool>(), nasty_string(), nasty_string()),
    )
        .prop_map(
            |(
                (request_id, repo, base_ref, branch),
                (forks, max_concurrent, fork_timeout_secs, verify_timeout_secs),
                (prompt, budget_usd, driver, command),
                (labels, stop_on_first_verified, verify_command, image),
            )| LaunchRunRequest {
                request_id,
                repo,
                base_ref,
                branch,
                prompt,
                forks,
                max_concurrent,
                budget_usd: budget_usd.clone(),
                agent: Some(AgentSpec {
                    driver,
                    command,
                    ..Default::default()
                }),
                fork_timeout_secs,
                labels,
                verify_command,
                verify_timeout_secs,
                stop_on_first_verified,
                fork_budget_usd: budget_usd,
                egress: Vec::new(),
                // The image's nasty string, the isolation's too: each names its field.
                isolation: image.chars().rev().collect(),
                backend: image.to_uppercase(),
                branch_window_secs: 0,
                backends: Vec::new(),
                // Some runs search, with absurd figures and a hostile template.
                search: (fork_timeout_secs % 3 == 0).then(|| Search {
                    rounds: verify_timeout_secs % 13,
                    keep: forks % 7,
                    branches: max_concurrent % 5,
                    follow_up: image.chars().take(64).collect(),
                }),
                image,
                delivery: None,
            },
        )
}

fn assert_names_a_field(e: &GatewayError, fields: &[&str]) {
    let status = tonic::Status::from(match e {
        GatewayError::InvalidArgument(m) => GatewayError::InvalidArgument(m.clone()),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    });
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        fields.iter().any(|f| status.message().starts_with(f)),
        "message does not start with a field name: {:?}",
        status.message()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn launch_validation_never_panics_and_names_the_field(req in request()) {
        match launch_spec(&req, &Limits::default()) {
            Ok(spec) => {
                // What passes is within the limits.
                prop_assert!(spec.forks >= 1 && spec.forks <= Limits::default().max_forks);
                prop_assert!(spec.prompt.len() <= forkyard_gateway::validate::MAX_PROMPT_BYTES);
                // A search's later rounds grow past the launch's forks.
                prop_assert!(spec.max_concurrent >= 1);
                prop_assert!(spec.max_concurrent <= spec.forks || spec.search.is_some());
                if let Some(s) = &spec.search {
                    prop_assert!((2..=10).contains(&s.rounds) && s.keep >= 1 && s.branches >= 1);
                    prop_assert!(s.keep <= spec.forks);
                }
            }
            Err(e) => assert_names_a_field(&e, FIELDS),
        }
    }

    #[test]
    fn ids_and_amounts_never_panic(s in nasty_string()) {
        if let Err(e) = run_id_for(&s) {
            assert_names_a_field(&e, &["request_id"]);
        }
        match check_run_id(&s) {
            Ok(()) => prop_assert!(s.starts_with("run-")),
            Err(GatewayError::RunNotFound(_)) => {}
            Err(e) => assert_names_a_field(&e, &["run_id"]),
        }
        if let Ok(amount) = forkyard_proto::Usd::parse(&s) {
            prop_assert!(amount.micros() >= 0);
        }
        if check_tenant(&s).is_ok() {
            // A valid tenant never breaks out of a quoted query or a run id.
            prop_assert!(!s.contains(['\'', '"', '\\', '.', ' ']));
            let t = Tenant { name: s.clone(), authenticated: true, admin: false };
            prop_assert!(run_id_for(t.run_id_for("r").trim_start_matches("run-")).is_ok());
        }
    }

    #[test]
    fn list_filters_never_panic_or_inject(labels in labels(), state in any::<i32>()) {
        let state = RunState::try_from(state).unwrap_or_default();
        match list_query(state, &labels) {
            // Every value is quoted and holds no quote of its own.
            Ok(q) => prop_assert_eq!(q.matches('\'').count() % 2, 0),
            Err(e) => assert_names_a_field(&e, &["labels"]),
        }
    }
}
