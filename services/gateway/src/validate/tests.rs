//! The launch checks: defaults filled in, bad input refused naming its field.

use super::*;
use forkyard_proto::common::v1::AgentSpec;
use tonic::Code;

fn ok_req() -> LaunchRunRequest {
    LaunchRunRequest {
        repo: "/tmp/x".into(),
        prompt: "do it".into(),
        forks: 3,
        max_concurrent: 2,
        budget_usd: "1".into(),
        agent: Some(AgentSpec {
            driver: "command".into(),
            command: "true".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn refused(req: LaunchRunRequest, field_name: &str) {
    let err = launch_spec(&req, &Limits::default()).expect_err("accepted bad input");
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with(field_name),
        "{:?} does not name {field_name}",
        status.message()
    );
}

#[test]
fn accepts_a_good_request_with_defaults() {
    let spec = launch_spec(&ok_req(), &Limits::default()).unwrap();
    assert_eq!(spec.branch, "forkyard");
    assert_eq!(spec.fork_timeout_secs, DEFAULT_FORK_TIMEOUT_SECS);
    assert_eq!(spec.budget_micros, 1_000_000);
    assert_eq!(
        spec.fork_budget_micros, 333_333,
        "budget shared evenly by default"
    );
    assert_eq!(spec.verify_timeout_secs, DEFAULT_VERIFY_TIMEOUT_SECS);
}

/// A run open for branches keeps its max_concurrent past its forks, and shares its
/// budget among that many: branches of a 1-fork run can run side by side.
#[test]
fn a_run_open_for_branches_keeps_its_concurrency_and_shares_its_budget_by_it() {
    let req = LaunchRunRequest {
        forks: 1,
        max_concurrent: 4,
        branch_window_secs: 60,
        ..ok_req()
    };
    let spec = launch_spec(&req, &Limits::default()).unwrap();
    assert_eq!(spec.max_concurrent, 4);
    assert_eq!(spec.fork_budget_micros, 250_000);
    let closed = LaunchRunRequest {
        branch_window_secs: 0,
        ..req
    };
    let spec = launch_spec(&closed, &Limits::default()).unwrap();
    assert_eq!(
        (spec.max_concurrent, spec.fork_budget_micros),
        (1, 1_000_000)
    );
}

#[test]
fn bad_input_names_the_field() {
    type Edit = fn(&mut LaunchRunRequest);
    let cases: [(Edit, &str); 10] = [
        (|r| r.forks = 0, "forks"),
        (|r| r.forks = 5000, "forks"),
        (|r| r.prompt = " ".into(), "prompt"),
        (|r| r.max_concurrent = 0, "max_concurrent"),
        (|r| r.budget_usd = "-5".into(), "budget_usd"),
        (|r| r.budget_usd = String::new(), "budget_usd"),
        (|r| r.repo = String::new(), "repo"),
        (|r| r.branch = "a..b".into(), "branch"),
        (
            |r| r.agent.as_mut().unwrap().driver = "gpt-pilot".into(),
            "agent.driver",
        ),
        (
            |r| r.agent.as_mut().unwrap().command = String::new(),
            "agent.command",
        ),
    ];
    for (edit, field) in cases {
        let mut r = ok_req();
        edit(&mut r);
        refused(r, field);
    }
}

#[test]
fn request_ids_map_to_stable_run_ids() {
    assert_eq!(run_id_for("abc-1").unwrap(), "run-abc-1");
    assert!(run_id_for("has space").is_err());
    assert!(run_id_for("").is_err());
}

#[test]
fn a_model_name_with_a_newline_or_a_space_is_refused() {
    let with_model = |model: &str| LaunchRunRequest {
        agent: Some(AgentSpec {
            driver: "claude-code".into(),
            model: model.into(),
            ..Default::default()
        }),
        ..ok_req()
    };
    for bad in [
        "sonnet\nFORKYARD_INJECTED=1",
        "sonnet\r",
        "son net",
        "\t",
        "a\0b",
        &"m".repeat(201),
    ] {
        refused(with_model(bad), "agent.model");
    }
    for good in [
        "",
        "sonnet",
        "claude-sonnet-4-5",
        "gpt-5",
        "openai/gpt-oss:20b",
    ] {
        assert!(
            launch_spec(&with_model(good), &Limits::default()).is_ok(),
            "{good:?}"
        );
    }
}

#[test]
fn the_isolation_is_a_known_level_or_empty_and_reaches_the_spec() {
    assert_eq!(
        launch_spec(&ok_req(), &Limits::default())
            .unwrap()
            .isolation,
        ""
    );
    for name in ["bubblewrap", "gvisor", " gvisor "] {
        let req = LaunchRunRequest {
            isolation: name.into(),
            ..ok_req()
        };
        let spec = launch_spec(&req, &Limits::default()).unwrap();
        assert_eq!(spec.isolation, name.trim());
    }
    for bad in ["kata", "GVISOR", "gvisor,bubblewrap"] {
        refused(
            LaunchRunRequest {
                isolation: bad.into(),
                ..ok_req()
            },
            "isolation",
        );
    }
}

/// Empty (the operator's default, filled in at admission) or a known backend; anything
/// else is refused naming `backend`, whatever the provisioners offer.
#[test]
fn the_backend_is_a_known_one_or_empty_and_reaches_the_spec() {
    assert_eq!(
        launch_spec(&ok_req(), &Limits::default()).unwrap().backend,
        ""
    );
    for name in ["local", "e2b", " e2b "] {
        let req = LaunchRunRequest {
            backend: name.into(),
            ..ok_req()
        };
        let spec = launch_spec(&req, &Limits::default()).unwrap();
        assert_eq!(spec.backend, name.trim());
    }
    for bad in ["modal", "E2B", "local,e2b", "k8s"] {
        refused(
            LaunchRunRequest {
                backend: bad.into(),
                ..ok_req()
            },
            "backend",
        );
    }
}

fn share(name: &str, max_concurrent: u32) -> forkyard_proto::gateway::v1::BackendShare {
    forkyard_proto::gateway::v1::BackendShare {
        name: name.into(),
        max_concurrent,
    }
}

/// A run over several backends: the list reaches the spec trimmed, with `backend` left
/// empty; every wrong shape is refused naming the entry's field.
#[test]
fn a_backends_list_is_checked_entry_by_entry() {
    let req = LaunchRunRequest {
        backends: vec![share(" local ", 40), share("e2b", 0)],
        ..ok_req()
    };
    let spec = launch_spec(&req, &Limits::default()).unwrap();
    assert_eq!(spec.backend, "");
    assert_eq!(spec.backends, vec![share("local", 40), share("e2b", 0)]);
    let cases: [(Vec<_>, &str, &str); 4] = [
        (
            vec![share("local", 2), share("local", 0)],
            "",
            "backends[1].name",
        ),
        (
            vec![share("local", 2), share("modal", 0)],
            "",
            "backends[1].name",
        ),
        (
            vec![share("local", 0), share("e2b", 3)],
            "",
            "backends[0].max_concurrent",
        ),
        (vec![share("local", 2)], "e2b", "backends"),
    ];
    for (backends, backend, name) in cases {
        refused(
            LaunchRunRequest {
                backends,
                backend: backend.into(),
                ..ok_req()
            },
            name,
        );
    }
}

fn searching(rounds: u32, keep: u32, branches: u32) -> LaunchRunRequest {
    LaunchRunRequest {
        forks: 4,
        max_concurrent: 4,
        search: Some(forkyard_proto::gateway::v1::Search {
            rounds,
            keep,
            branches,
            follow_up: "{prompt}; it failed with {verify_output}".into(),
        }),
        ..ok_req()
    }
}

/// A search's forks are every round's: they share the budget, count against the run's
/// limit, and may run as many at once as asked for.
#[test]
fn a_search_shares_its_budget_among_every_rounds_forks() {
    let spec = launch_spec(&searching(3, 2, 3), &Limits::default()).unwrap();
    let s = spec.search.as_ref().unwrap();
    assert_eq!((s.rounds, s.keep, s.branches), (3, 2, 3));
    // 4 + 2 * 2 * 3 = 16 forks.
    assert_eq!(spec.fork_budget_micros, 1_000_000 / 16);
    assert_eq!(spec.max_concurrent, 4);
    assert_eq!(planned_forks(4, spec.search.as_ref()), 16);
    let small = Limits {
        max_forks: 15,
        ..Limits::default()
    };
    let e = tonic::Status::from(launch_spec(&searching(3, 2, 3), &small).unwrap_err());
    assert!(
        e.message().starts_with("search: may start 16 forks"),
        "{}",
        e.message()
    );
}

#[test]
fn a_bad_search_names_its_field() {
    let cases = [
        (searching(1, 2, 2), "search.rounds"),
        (searching(11, 2, 2), "search.rounds"),
        (searching(2, 0, 2), "search.keep"),
        (searching(2, 5, 2), "search.keep"),
        (searching(2, 2, 0), "search.branches"),
    ];
    for (req, field) in cases {
        refused(req, field);
    }
    let mut unknown = searching(2, 2, 2);
    unknown.search.as_mut().unwrap().follow_up = "fix {tests}".into();
    refused(unknown, "search.follow_up");
    // Every driver continues a fork, the built-in ones too.
    let mut builtin = searching(2, 2, 2);
    builtin.agent = Some(AgentSpec {
        driver: "anthropic".into(),
        ..Default::default()
    });
    assert!(launch_spec(&builtin, &Limits::default()).is_ok());
}
