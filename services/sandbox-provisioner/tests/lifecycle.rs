//! Sandbox lifecycle against real git and bubblewrap: create, idempotency, errors,
//! restart, listing, health and patches.

mod common;

use common::{exec_req, fixture, git, open};
use forkyard_proto::sandbox::v1::{
    CollectPatchRequest, CreateSandboxRequest, DestroySandboxRequest, HealthCheckRequest,
    SandboxState,
};
use std::collections::HashMap;

#[tokio::test]
async fn created_sandbox_has_the_repo_on_the_new_branch_at_the_base_commit() {
    let f = fixture().await;
    let sbx = f.create().await;
    assert!(sbx.id.starts_with("sbx-"), "{}", sbx.id);
    assert_eq!(sbx.backend, "local");
    assert_eq!(sbx.state, SandboxState::Ready as i32);
    assert_eq!(sbx.base_commit, git(&f.repo, &["rev-parse", "main"]));
    assert_eq!(sbx.owner_endpoint, "http://127.0.0.1:50052");

    let out = f
        .sh(
            &sbx.id,
            "git -c safe.directory='*' rev-parse --abbrev-ref HEAD && cat README.md",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "forkyard-fork-1\nhello\nworld\n");
    assert!(
        f.state
            .join("sandboxes")
            .join(&sbx.id)
            .join("sandbox.json")
            .is_file()
    );
}

#[tokio::test]
async fn base_ref_selects_the_starting_commit() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-2");
    req.base_ref = "feature".into();
    let sbx = f.core.create(req).await.unwrap();
    assert_eq!(sbx.base_commit, git(&f.repo, &["rev-parse", "feature"]));
    let out = f.sh(&sbx.id, "cat feature.txt").await;
    assert_eq!(out.stdout, "f\n");

    let mut req = f.request("forkyard-fork-3");
    req.base_ref = "no-such-ref".into();
    let err = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("base_ref"), "{}", err.message());
}

#[tokio::test]
async fn an_unclonable_repo_is_a_failed_precondition_and_leaves_nothing() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.repo = f.tmp.path().join("does-not-exist").display().to_string();
    let err = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        err.message().contains("does-not-exist"),
        "{}",
        err.message()
    );
    let gone = common::eventually(std::time::Duration::from_secs(5), || {
        std::fs::read_dir(f.state.join("sandboxes"))
            .unwrap()
            .next()
            .is_none()
    })
    .await;
    assert!(gone, "half-created sandbox left behind");
    assert!(f.core.list(&HashMap::new()).is_empty());
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field() {
    let f = fixture().await;
    for (field, mutate) in [
        (
            "branch",
            Box::new(|r: &mut CreateSandboxRequest| r.branch = "bad..branch".into())
                as Box<dyn Fn(&mut _)>,
        ),
        (
            "branch",
            Box::new(|r: &mut CreateSandboxRequest| r.branch = String::new()),
        ),
        (
            "backend",
            Box::new(|r: &mut CreateSandboxRequest| r.backend = "e2b".into()),
        ),
        (
            "repo",
            Box::new(|r: &mut CreateSandboxRequest| r.repo = String::new()),
        ),
    ] {
        let mut req = f.request("forkyard-fork-1");
        mutate(&mut req);
        let err = tonic::Status::from(f.core.create(req).await.unwrap_err());
        assert_eq!(
            err.code(),
            tonic::Code::InvalidArgument,
            "{field}: {}",
            err.message()
        );
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let mut env_req = exec_req("sbx-x", &["true"]);
    env_req.env.insert("BAD-NAME".into(), "1".into());
    let err = tonic::Status::from(f.core.exec(env_req).await.unwrap_err());
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = tonic::Status::from(f.core.get("sbx-nope").unwrap_err());
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn same_idempotency_key_returns_the_same_sandbox_even_concurrently() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.idempotency_key = "run-1/fork-1".into();
    let (a, b) = tokio::join!(f.core.create(req.clone()), f.core.create(req.clone()));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.id, b.id);
    let c = f.core.create(req).await.unwrap();
    assert_eq!(a.id, c.id);
    assert_eq!(f.core.list(&HashMap::new()).len(), 1);
    assert_eq!(
        std::fs::read_dir(f.state.join("sandboxes"))
            .unwrap()
            .count(),
        1
    );

    let mut other = f.request("forkyard-fork-2");
    other.idempotency_key = "run-1/fork-2".into();
    assert_ne!(f.core.create(other).await.unwrap().id, a.id);
}

#[tokio::test]
async fn a_restarted_provisioner_finds_its_sandboxes_and_drops_broken_ones() {
    let f = fixture().await;
    let mut req = f.request("forkyard-fork-1");
    req.idempotency_key = "k1".into();
    req.labels = HashMap::from([("forkyard.run_id".to_owned(), "r1".to_owned())]);
    let sbx = f.core.create(req.clone()).await.unwrap();
    f.sh(&sbx.id, "echo changed > new.txt").await;
    // An interrupted create: a directory without a record.
    let broken = f.state.join("sandboxes").join("sbx-broken");
    std::fs::create_dir_all(broken.join("workspace")).unwrap();

    // One provisioner per state directory: the restart waits for this one to go.
    let common::Fixture {
        tmp: _tmp,
        state,
        core,
        ..
    } = f;
    let restarted = {
        let opening = tokio::spawn(async move { open(&state).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !opening.is_finished(),
            "a second provisioner opened the same state dir"
        );
        drop(core);
        opening.await.unwrap()
    };
    let found = restarted.get(&sbx.id).unwrap();
    assert_eq!(found.base_commit, sbx.base_commit);
    assert_eq!(found.labels, sbx.labels);
    assert_eq!(found.created_unix_ms, sbx.created_unix_ms);
    assert!(!broken.exists(), "broken sandbox directory kept");
    assert_eq!(restarted.list(&HashMap::new()).len(), 1);
    assert_eq!(
        restarted.create(req).await.unwrap().id,
        sbx.id,
        "idempotency key forgotten"
    );
    let out = restarted
        .exec(exec_req(&sbx.id, &["cat", "new.txt"]))
        .await
        .unwrap();
    assert_eq!(out.stdout, "changed\n");
}

#[tokio::test]
async fn list_filters_by_every_label_of_the_selector() {
    let f = fixture().await;
    for (run, fork) in [("r1", "1"), ("r1", "2"), ("r2", "1")] {
        let mut req = f.request(&format!("b-{run}-{fork}"));
        req.labels = HashMap::from([
            ("forkyard.run_id".into(), run.into()),
            ("forkyard.fork".into(), fork.into()),
        ]);
        f.core.create(req).await.unwrap();
    }
    let sel = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(f.core.list(&HashMap::new()).len(), 3);
    assert_eq!(f.core.list(&sel(&[("forkyard.run_id", "r1")])).len(), 2);
    let one = f
        .core
        .list(&sel(&[("forkyard.run_id", "r1"), ("forkyard.fork", "2")]));
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].branch, "b-r1-2");
    assert!(f.core.list(&sel(&[("forkyard.run_id", "r3")])).is_empty());
}

/// The first check runs a command inside the sandbox; for the next 10 s that probe
/// vouches for the replica's sandbox runtime and checks only look at each workspace.
#[tokio::test]
async fn health_check_probes_inside_once_then_checks_each_workspace() {
    let f = fixture().await;
    let sbx = f.create().await;
    let other = f.create().await;
    let h = f
        .core
        .health(HealthCheckRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    assert!(h.healthy, "{}", h.detail);
    assert!(h.detail.contains("inside"), "{}", h.detail);
    let h = f
        .core
        .health(HealthCheckRequest {
            sandbox_id: other.id.clone(),
        })
        .await
        .unwrap();
    assert!(h.healthy, "{}", h.detail);
    assert!(h.detail.contains("probed"), "{}", h.detail);
    f.sh(&other.id, "rm -rf .git").await;
    let h = f
        .core
        .health(HealthCheckRequest {
            sandbox_id: other.id,
        })
        .await
        .unwrap();
    assert!(!h.healthy, "{}", h.detail);
    assert!(h.detail.contains(".git"), "{}", h.detail);
    let gone = f
        .core
        .health(HealthCheckRequest {
            sandbox_id: "sbx-0000".into(),
        })
        .await;
    assert!(gone.is_err(), "an unknown sandbox is not found");
}

#[tokio::test]
async fn collect_patch_returns_the_changes_with_their_diffstat() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .sh(&sbx.id, "printf 'hello\\nthere\\nworld\\n' > README.md && rm old.txt && echo new > added.txt && printf '\\000\\001\\002' > blob.bin")
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let p = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(p.base_commit, sbx.base_commit);
    assert!(!p.truncated);
    assert_eq!(p.patch_bytes, p.patch.len() as u64);
    assert!(p.patch.contains("+there"), "{}", p.patch);
    assert!(
        p.patch.contains("diff --git a/added.txt b/added.txt"),
        "{}",
        p.patch
    );
    assert!(p.patch.contains("GIT binary patch"), "{}", p.patch);
    let d = p.diffstat.unwrap();
    // README +1, old.txt -2, added.txt +1, blob.bin binary (0/0).
    assert_eq!((d.files_changed, d.insertions, d.deletions), (4, 2, 2));

    // The patch applies to the base commit on the host.
    let check = f.tmp.path().join("check");
    git(
        f.tmp.path(),
        &[
            "clone",
            "-q",
            f.repo.to_str().unwrap(),
            check.to_str().unwrap(),
        ],
    );
    std::fs::write(f.tmp.path().join("p.diff"), &p.patch).unwrap();
    git(
        &check,
        &[
            "apply",
            "--check",
            f.tmp.path().join("p.diff").to_str().unwrap(),
        ],
    );

    let cut = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 40,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(cut.truncated);
    assert_eq!(cut.patch.len(), 40);
    assert_eq!(cut.patch_bytes, p.patch_bytes);
    let _ = f
        .core
        .destroy(DestroySandboxRequest {
            sandbox_id: sbx.id,
            reason: "test".into(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn collect_patch_does_not_run_the_agents_hooks_or_config() {
    let f = fixture().await;
    let sbx = f.create().await;
    // An agent plants a hook and an external diff tool; neither may run, on the host or inside.
    let out = f
        .sh(
            &sbx.id,
            "printf '#!/bin/sh\\ntouch /workspace/HOOK_RAN\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && \
             git config diff.external /workspace/ext.sh && printf '#!/bin/sh\\ntouch /workspace/EXT_RAN\\n' > ext.sh && chmod +x ext.sh && \
             git config diff.noprefix true && echo x >> README.md",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let p = f
        .core
        .collect_patch(CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        p.patch.contains("diff --git a/README.md b/README.md"),
        "{}",
        p.patch
    );
    let ws = common::own_files(&f.state, &sbx.id);
    assert!(ws.join(".git").is_dir(), "{}", ws.display());
    assert!(!ws.join("EXT_RAN").exists());
    assert!(!ws.join("HOOK_RAN").exists());
}

#[tokio::test]
async fn collect_patch_keeps_gits_warnings_out_of_the_diffstat_and_names_a_failed_step() {
    let f = fixture().await;
    let sbx = f.create().await;
    // core.autocrlf makes `git add` warn on stderr about every LF file it stages.
    let out = f
        .sh(
            &sbx.id,
            "git config core.autocrlf true && printf 'a\\nb\\n' > lf1.txt && printf 'c\\n' > lf2.txt",
        )
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let req = || CollectPatchRequest {
        sandbox_id: sbx.id.clone(),
        max_bytes: 0,
        ..Default::default()
    };
    let p = f.core.collect_patch(req()).await.unwrap();
    let d = p.diffstat.unwrap();
    assert_eq!((d.files_changed, d.insertions, d.deletions), (2, 3, 0));
    assert!(p.patch.contains("+++ b/lf1.txt"), "{}", p.patch);

    // A fresh index lock makes `git add` fail (with a new file to stage: with every
    // file tracked, the patch needs no add): the error says which step and why.
    let out = f
        .sh(&sbx.id, "touch .git/index.lock && echo d > lf3.txt")
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let status = tonic::Status::from(f.core.collect_patch(req()).await.unwrap_err());
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("git add in the sandbox failed")
            && status.message().contains("index.lock"),
        "{}",
        status.message()
    );

    // A lock left seconds ago by an add that was cut off (a collection whose caller died)
    // is removed, and the retried collection succeeds.
    let out = f
        .sh(&sbx.id, "touch -d '1 minute ago' .git/index.lock")
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let p = f
        .core
        .collect_patch(req())
        .await
        .expect("stale lock removed");
    assert!(p.patch.contains("+++ b/lf1.txt"), "{}", p.patch);
}

#[tokio::test]
async fn workspaces_are_private_and_the_state_dir_is_not_a_repo_source() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture().await;
    let sbx = f.create().await;
    for dir in [
        f.state.join("sandboxes"),
        f.state.join("sandboxes").join(&sbx.id),
    ] {
        // Others may at most pass through (a sandbox's own uid opens its workspace).
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o766, 0o700, "{} is {mode:o}", dir.display());
    }
    if forkyard_common::testing::requires(
        forkyard_common::testing::Need::Root,
        rustix::process::geteuid().is_root(),
        "this part: the workspace's own mode, given to a sandbox uid",
    ) {
        let ws = common::own_files(&f.state, &sbx.id);
        let mode = std::fs::metadata(&ws).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o700,
            "the workspace is {mode:o}: readable by other host users"
        );
    }
    // Another sandbox's workspace cannot be cloned into a new one.
    let mut req = f.request("steal");
    req.repo = f
        .state
        .join("sandboxes")
        .join(&sbx.id)
        .join("workspace")
        .display()
        .to_string();
    let status = tonic::Status::from(f.core.create(req).await.unwrap_err());
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("repo"), "{}", status.message());
}

#[tokio::test]
async fn collect_patch_never_runs_fsmonitor_or_filters_on_the_host() {
    let f = fixture().await;
    let sbx = f.create().await;
    let marker = f.tmp.path().join("ran-on-host");
    let cmd = format!("sh -c 'echo ran > {}'", marker.display());
    let script = format!(
        "git config core.fsmonitor \"{cmd}\"; \
         git config filter.evil.clean \"{cmd}; cat\"; git config diff.evil.textconv \"{cmd}; cat\"; \
         echo '* filter=evil diff=evil' > .gitattributes; echo change >> README.md"
    );
    let out = f.sh(&sbx.id, &script).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    // The collection itself must work: a test that passed because it failed would
    // prove nothing about where git ran.
    let patch = f
        .core
        .collect_patch(forkyard_proto::sandbox::v1::CollectPatchRequest {
            sandbox_id: sbx.id.clone(),
            max_bytes: 0,
            ..Default::default()
        })
        .await
        .expect("the patch is collected");
    assert!(patch.patch.contains("+change"), "{}", patch.patch);
    assert!(
        !marker.exists(),
        "an agent-configured git command ran on the host"
    );
}

#[tokio::test]
async fn a_destroy_whose_caller_hangs_up_midway_still_finishes() {
    let f = fixture().await;
    let sbx = f.create().await;
    let dir = f.state.join("sandboxes").join(&sbx.id);
    assert!(dir.is_dir());
    // The caller gives up at once (as a killed gateway's call does): the future is polled
    // into the destroy and dropped.
    let req = forkyard_proto::sandbox::v1::DestroySandboxRequest {
        sandbox_id: sbx.id.clone(),
        reason: "caller went away".into(),
    };
    let _ = tokio::time::timeout(std::time::Duration::from_micros(1), f.core.destroy(req)).await;
    let gone = common::eventually(std::time::Duration::from_secs(10), || {
        f.core.get(&sbx.id).is_err() && !dir.exists()
    })
    .await;
    assert!(
        gone,
        "the sandbox was left half destroyed: {:?}",
        f.core.get(&sbx.id)
    );
}
