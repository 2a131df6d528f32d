use super::*;

#[test]
fn gateway_messages_land_on_their_field() {
    assert_eq!(field_of("budget_usd: must be a positive amount"), "budget");
    assert_eq!(field_of("agent.model: \"x\" is not a model name"), "model");
    assert_eq!(field_of("forks: must be at least 1"), "forks");
    assert_eq!(field_of("repo: not a git repository"), "repo");
    assert_eq!(field_of("the tenant's limit is spent"), "");
    assert_eq!(field_of("search.keep: at most forks (3)"), "keep");
    assert_eq!(
        field_of("backends[1].name: \"modal\" is not offered"),
        "backend"
    );
    assert_eq!(
        field_of("max_concurrent: must be at least 1"),
        "max_concurrent"
    );
    assert_eq!(
        field_of("branch_window_secs: at most 86400"),
        "branch_window"
    );
}

#[test]
fn placement_and_search_reach_the_launch() {
    let f = NewRunForm {
        forks: "4".into(),
        max_concurrent: "2".into(),
        backend: "local:1, e2b".into(),
        isolation: "gvisor".into(),
        branch_window: "60".into(),
        rounds: "3".into(),
        keep: "2".into(),
        follow_up: "round {round}: {verify_output}".into(),
        ..NewRunForm::blank()
    };
    let req = f.to_request().unwrap();
    assert_eq!((req.forks, req.max_concurrent), (4, 2));
    assert_eq!(req.backend, "");
    let shares: Vec<_> = req
        .backends
        .iter()
        .map(|b| (b.name.as_str(), b.max_concurrent))
        .collect();
    assert_eq!(shares, [("local", 1), ("e2b", 0)]);
    assert_eq!(
        (req.isolation.as_str(), req.branch_window_secs),
        ("gvisor", 60)
    );
    assert_eq!(
        req.search,
        Some(Search {
            rounds: 3,
            keep: 2,
            branches: 1,
            follow_up: "round {round}: {verify_output}".into(),
        })
    );
    // Left empty: every fork at once, no search, the operator's backend.
    let plain = NewRunForm::blank().to_request().unwrap();
    assert_eq!(plain.max_concurrent, plain.forks);
    assert_eq!((plain.search, plain.backend.as_str()), (None, ""));
}

#[test]
fn the_form_becomes_a_launch() {
    let f = NewRunForm {
        repo: " /tmp/r ".into(),
        forks: "3".into(),
        driver: "command".into(),
        labels: "team=a, kind = demo".into(),
        ..NewRunForm::blank()
    };
    let req = f.to_request().unwrap();
    assert_eq!(
        (req.repo.as_str(), req.forks, req.max_concurrent),
        ("/tmp/r", 3, 3)
    );
    assert_eq!(req.labels["kind"], "demo");
    assert!(req.request_id.starts_with("console-"));
}

#[test]
fn the_forms_own_refusals_name_the_field() {
    let f = NewRunForm {
        forks: "three".into(),
        labels: "oops".into(),
        backend: "modal".into(),
        rounds: "two".into(),
        ..NewRunForm::blank()
    };
    let errors = f.to_request().unwrap_err();
    assert!(errors["forks"].starts_with("forks:"));
    assert!(errors["labels"].starts_with("labels:"));
    assert!(errors["backend"].starts_with("backend: \"modal\""));
    assert!(errors["rounds"].starts_with("rounds:"));
}

#[test]
fn image_egress_and_delivery_reach_the_launch() {
    let f = NewRunForm {
        image: " archive:rust.tar ".into(),
        egress: "crates, pypi.org:443,, *.example.com ".into(),
        push: "verified".into(),
        pull_requests: "each".into(),
        draft: "on".into(),
        ..NewRunForm::blank()
    };
    let req = f.to_request().unwrap();
    assert_eq!(req.image, "archive:rust.tar");
    assert_eq!(req.egress, ["crates", "pypi.org:443", "*.example.com"]);
    let d = req.delivery.expect("a delivery");
    assert_eq!(
        (d.push(), d.pull_requests(), d.draft),
        (Push::Verified, PullRequests::Each, true)
    );
    // Left empty (or "none"): nothing delivered, no egress, the host's tools.
    let plain = NewRunForm {
        push: "none".into(),
        ..NewRunForm::blank()
    };
    let req = plain.to_request().unwrap();
    assert_eq!(
        (req.delivery, req.egress.len(), req.image.as_str()),
        (None, 0, "")
    );
    // A pull request without a push is the gateway's to refuse, naming the field.
    let pr_only = NewRunForm {
        pull_requests: "winner".into(),
        ..NewRunForm::blank()
    };
    let d = pr_only.to_request().unwrap().delivery.unwrap();
    assert_eq!(
        (d.push(), d.pull_requests()),
        (Push::None, PullRequests::Winner)
    );
}

#[test]
fn delivery_and_sandbox_messages_land_on_their_field() {
    assert_eq!(field_of("image: \"UP\" is not an image reference"), "image");
    assert_eq!(field_of("egress: 10.0.0.7 is a private address"), "egress");
    assert_eq!(
        field_of("delivery.pull_requests: a pull request needs a push"),
        "pull_requests"
    );
    assert_eq!(
        field_of("delivery.push: tenant a has no git credentials"),
        "push"
    );
    assert_eq!(field_of("delivery.author_name: no newlines"), "push");
    let bad = NewRunForm {
        push: "everything".into(),
        ..NewRunForm::blank()
    };
    let errors = bad.to_request().unwrap_err();
    assert!(
        errors["push"].starts_with("push: \"everything\""),
        "{errors:?}"
    );
}
