//! Tenancy end to end: API keys made with the `forkyard keys` CLI, every isolation rule
//! (another tenant's run is NOT_FOUND for every run RPC), unauthenticated and revoked
//! callers, open health probes, tenant ledger accounts and limits, and one tenant's
//! flood refused while another tenant's run completes.

// Shared by the suites that call as tenants; each uses part of it.
#[allow(dead_code)]
mod tenant_calls;

use forkyard_proto::{
    budget::v1::{
        AccountKind, CreateAccountRequest, GetAccountRequest, RaiseBudgetRequest as LedgerRaise,
        budget_ledger_client::BudgetLedgerClient,
    },
    gateway::v1::{
        CancelRunRequest, LaunchRunRequest, ListRunsRequest, RunState, StartCleanupRequest,
        WatchRunRequest, gateway_client::GatewayClient,
    },
};
use forkyard_tests::{Mesh, mesh::MeshOptions, repo};
use std::{
    path::Path,
    time::{Duration, Instant},
};
use tenant_calls::{
    Gw, assert_admin_reads_only, assert_invisible, get, keys, launch_req, list_ids, new_key,
    wait_closed, with_key,
};
use tonic::{Code, transport::Channel};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

type Ledger = BudgetLedgerClient<Channel>;

/// A mesh with API keys on: each tenant may spend $5 and run one fork at a time, and
/// hold two watches open; `ops` is an operator.
async fn tenant_mesh() -> anyhow::Result<Mesh> {
    Mesh::start_with(MeshOptions {
        api_keys: true,
        env: vec![
            ("FORKYARD_TENANT_BUDGET_USD".into(), "5".into()),
            ("FORKYARD_TENANT_MAX_CONCURRENT_FORKS".into(), "1".into()),
            ("FORKYARD_ADMIN_TENANTS".into(), "ops".into()),
            ("FORKYARD_TENANT_WATCHES".into(), "2".into()),
        ],
        ..Default::default()
    })
    .await
}

/// The keys of teams A and B (and B's key id) and the operators', made with the CLI,
/// whose listing shows the keys but not their secrets.
struct TeamKeys {
    a: String,
    id_b: String,
    b: String,
    ops: String,
}

fn team_keys(mesh: &Mesh) -> TeamKeys {
    let (_, key_a) = new_key(mesh, "team-a");
    let (id_b, key_b) = new_key(mesh, "team-b");
    let (_, key_ops) = new_key(mesh, "ops");
    let listed = keys(mesh, &["list"]);
    assert!(
        listed.contains("team-a") && listed.contains(&id_b),
        "{listed}"
    );
    assert!(!listed.contains(&key_a), "keys list must not show secrets");
    TeamKeys {
        a: key_a,
        id_b,
        b: key_b,
        ops: key_ops,
    }
}

/// Health stays open; everything else wants a valid key.
async fn assert_only_valid_keys_get_in(
    mesh: &Mesh,
    gw: &mut Gw,
    src: &Path,
    key_a: &str,
) -> anyhow::Result<()> {
    let health = HealthClient::new(mesh.channel("gateway").await?)
        .check(HealthCheckRequest::default())
        .await?;
    assert_eq!(health.into_inner().status, 1, "SERVING without a key");
    let err = gw.list_runs(ListRunsRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = gw
        .launch_run(launch_req(src, "x", "true"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let flipped = if key_a.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{flipped}", &key_a[..key_a.len() - 1]);
    for bad in [forged.as_str(), "fyk_nothing", "", "Bearer"] {
        let err = get(gw, bad, "run-x").await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "key {bad:?}: {err:?}");
    }
    Ok(())
}

/// Open WatchRun streams are capped per tenant (2 here); closing one frees its slot.
async fn assert_watches_capped(gw: &mut Gw, key_a: &str, run_id: &str) -> anyhow::Result<()> {
    let watch = || {
        with_key(
            key_a,
            WatchRunRequest {
                run_id: run_id.to_owned(),
            },
        )
    };
    let w1 = gw.watch_run(watch()).await?.into_inner();
    let w2 = gw.watch_run(watch()).await?.into_inner();
    let err = gw.watch_run(watch()).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    drop(w1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match gw.watch_run(watch()).await {
            Ok(s) => {
                drop(s);
                break;
            }
            Err(e) if e.code() == Code::ResourceExhausted && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("a closed watch never freed its slot: {e:?}"),
        }
    }
    drop(w2);
    Ok(())
}

/// B cannot tell A's run from one that does not exist, and each lists only its own.
async fn assert_lists_are_per_tenant(gw: &mut Gw, team: &TeamKeys, a_run: &str, b_run: &str) {
    // The same answer as for a run that does not exist: nothing tells B the id is taken.
    let ghost = get(gw, &team.b, "run-does-not-exist").await.unwrap_err();
    assert_eq!(ghost.code(), Code::NotFound);
    assert!(list_ids(gw, &team.a).await.contains(&a_run.to_owned()));
    let b_runs = list_ids(gw, &team.b).await;
    assert_eq!(b_runs, vec![b_run.to_owned()], "B lists only its own");
    let list = |key: &str, tenant: &str| {
        with_key(
            key,
            ListRunsRequest {
                tenant: tenant.into(),
                ..Default::default()
            },
        )
    };
    let err = gw.list_runs(list(&team.b, "team-a")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().starts_with("tenant: "), "{err:?}");
    let own = gw.list_runs(list(&team.b, "team-b")).await.unwrap();
    assert_eq!(own.into_inner().runs.len(), 1);
    let err = gw.list_runs(list(&team.ops, "Team'A")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("tenant: "), "{err:?}");
}

/// An operator (`FORKYARD_ADMIN_TENANTS`) lists and reads every tenant's runs, each with
/// its tenant, or one tenant's; it changes none of them.
async fn assert_admin_reads_every_tenant(gw: &mut Gw, team: &TeamKeys, a_run: &str, b_run: &str) {
    let list = |tenant: &str| {
        with_key(
            &team.ops,
            ListRunsRequest {
                tenant: tenant.into(),
                ..Default::default()
            },
        )
    };
    let all = gw.list_runs(list("")).await.unwrap().into_inner().runs;
    let owners: Vec<(&str, &str)> = all
        .iter()
        .map(|r| (r.run_id.as_str(), r.tenant.as_str()))
        .collect();
    assert!(owners.contains(&(a_run, "team-a")), "{owners:?}");
    assert!(owners.contains(&(b_run, "team-b")), "{owners:?}");
    let only_b = gw
        .list_runs(list("team-b"))
        .await
        .unwrap()
        .into_inner()
        .runs;
    let ids: Vec<&str> = only_b.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, [b_run], "ops lists one tenant's runs when it names it");
    let run = get(gw, &team.ops, a_run)
        .await
        .expect("ops reads team-a's run");
    assert_eq!(run.spec.unwrap().tenant, "team-a");
    assert_admin_reads_only(gw, &team.ops, a_run).await;
}

/// A's run carries its tenant and draws on the tenant's ledger account.
async fn assert_run_draws_on_its_tenant(
    gw: &mut Gw,
    ledger: &mut Ledger,
    key_a: &str,
    run_id: &str,
) -> anyhow::Result<()> {
    let run = get(gw, key_a, run_id).await?;
    let spec = run.spec.clone().unwrap();
    assert_eq!(spec.tenant, "team-a");
    assert_eq!(spec.tenant_account_id, "tenant-team-a");
    let deadline = Instant::now() + Duration::from_secs(30);
    let run_account = loop {
        match ledger
            .get_account(GetAccountRequest {
                account_id: run_id.to_owned(),
            })
            .await
        {
            Ok(acc) => break acc.into_inner(),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("run account never opened: {e:?}"),
        }
    };
    assert_eq!(run_account.parent_account_id, "tenant-team-a");
    let tenant = ledger
        .get_account(GetAccountRequest {
            account_id: "tenant-team-a".into(),
        })
        .await?
        .into_inner();
    assert_eq!(tenant.kind, AccountKind::Tenant as i32);
    assert_eq!(tenant.budget_micros, 5_000_000);
    Ok(())
}

/// What a tenant may not do: start a fork past its concurrent-forks limit, fork a
/// repository outside the operator's roots, run the cleanup schedule.
async fn assert_tenant_bounds(gw: &mut Gw, src: &Path, team: &TeamKeys) -> anyhow::Result<()> {
    // A's concurrent-forks limit is 1 and its run holds it; B's own limit is untouched.
    let err = gw
        .launch_run(with_key(&team.a, launch_req(src, "second", "true")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().starts_with("max_concurrent"), "{err:?}");

    // With keys on, a tenant names local repositories only under the operator's roots
    // (the mesh allows the temp dir): any other repository of the host is refused.
    for repo in ["/usr/share", "file:///usr/share"] {
        let err = gw
            .launch_run(with_key(
                &team.b,
                LaunchRunRequest {
                    repo: repo.into(),
                    ..launch_req(src, "outside-roots", "true")
                },
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{repo}: {err:?}");
        assert!(
            err.message().contains("FORKYARD_LOCAL_REPO_ROOTS"),
            "{err:?}"
        );
    }

    // The cleanup schedule is the operators'.
    let err = gw
        .start_cleanup(with_key(&team.b, StartCleanupRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    Ok(())
}

/// A tenant whose limit is spent launches nothing; raising it lets the run start.
async fn assert_a_spent_tenant_launches_once_raised(
    mesh: &Mesh,
    gw: &mut Gw,
    ledger: &mut Ledger,
    src: &Path,
) -> anyhow::Result<()> {
    ledger
        .create_account(CreateAccountRequest {
            account_id: "tenant-team-c".into(),
            kind: AccountKind::Tenant as i32,
            budget_micros: 0,
            idempotency_key: "test/tenant-team-c".into(),
            ..Default::default()
        })
        .await?;
    let (_, key_c) = new_key(mesh, "team-c");
    let err = gw
        .launch_run(with_key(&key_c, launch_req(src, "c1", "true")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().starts_with("budget_usd"), "{err:?}");
    assert!(list_ids(gw, &key_c).await.is_empty(), "nothing started");
    ledger
        .raise_budget(LedgerRaise {
            account_id: "tenant-team-c".into(),
            amount_micros: 2_000_000,
            idempotency_key: "test/raise-c".into(),
        })
        .await?;
    let c = gw
        .launch_run(with_key(&key_c, launch_req(src, "c1", "true")))
        .await?
        .into_inner();
    let c_done = wait_closed(gw, &key_c, &c.run_id, Duration::from_secs(90)).await;
    assert_eq!(c_done.state, RunState::Completed as i32, "{c_done:#?}");
    Ok(())
}

#[tokio::test]
async fn tenants_see_and_steer_only_their_own_runs() -> anyhow::Result<()> {
    let mesh = tenant_mesh().await?;
    let src = mesh.state_dir().join("repo");
    repo::create(&src)?;
    let team = team_keys(&mesh);
    let mut gw = GatewayClient::new(mesh.channel("gateway").await?);
    assert_only_valid_keys_get_in(&mesh, &mut gw, &src, &team.a).await?;

    // A's run: long enough to steer; B uses the same request id and gets its own run.
    let a = gw
        .launch_run(with_key(&team.a, launch_req(&src, "same", "sleep 60")))
        .await?
        .into_inner();
    let b_launch = gw
        .launch_run(with_key(&team.b, launch_req(&src, "same", "true")))
        .await?
        .into_inner();
    assert!(b_launch.created, "B's request id is B's own");
    assert_ne!(a.run_id, b_launch.run_id);

    let before = get(&mut gw, &team.a, &a.run_id).await?;
    assert_invisible(&mut gw, &team.b, &a.run_id).await;
    // And B's pause, resume, cancels and raise did nothing to A's run: NOT_FOUND must not
    // be an answer given after acting.
    let after = get(&mut gw, &team.a, &a.run_id).await?;
    assert_eq!(after.state, RunState::Running as i32, "{after:#?}");
    assert_eq!(after.budget_micros, before.budget_micros, "{after:#?}");
    assert!(
        after
            .forks
            .iter()
            .all(|f| f.status != forkyard_proto::common::v1::ForkStatus::Cancelled as i32),
        "{after:#?}"
    );
    assert_watches_capped(&mut gw, &team.a, &a.run_id).await?;
    assert_lists_are_per_tenant(&mut gw, &team, &a.run_id, &b_launch.run_id).await;
    assert_admin_reads_every_tenant(&mut gw, &team, &a.run_id, &b_launch.run_id).await;
    let mut ledger = BudgetLedgerClient::new(mesh.channel("budget-ledger").await?);
    assert_run_draws_on_its_tenant(&mut gw, &mut ledger, &team.a, &a.run_id).await?;
    assert_tenant_bounds(&mut gw, &src, &team).await?;

    // A steers its own run.
    gw.cancel_run(with_key(
        &team.a,
        CancelRunRequest {
            run_id: a.run_id.clone(),
            reason: "test".into(),
        },
    ))
    .await?;
    let done = wait_closed(&mut gw, &team.a, &a.run_id, Duration::from_secs(90)).await;
    assert_eq!(done.state, RunState::Cancelled as i32);
    let b_done = wait_closed(&mut gw, &team.b, &b_launch.run_id, Duration::from_secs(90)).await;
    assert_eq!(b_done.state, RunState::Completed as i32, "{b_done:#?}");

    assert_a_spent_tenant_launches_once_raised(&mesh, &mut gw, &mut ledger, &src).await?;

    // A revoked key stops working at once.
    keys(&mesh, &["revoke", &team.id_b]);
    let err = get(&mut gw, &team.b, &b_launch.run_id).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    Ok(())
}

#[tokio::test]
async fn a_flooding_tenant_is_refused_while_another_tenants_run_completes() -> anyhow::Result<()> {
    let mesh = Mesh::start_with(MeshOptions {
        api_keys: true,
        env: vec![
            ("FORKYARD_TENANT_RATE".into(), "10".into()),
            ("FORKYARD_TENANT_BURST".into(), "20".into()),
            ("FORKYARD_TENANT_CONCURRENCY".into(), "8".into()),
        ],
        ..Default::default()
    })
    .await?;
    let src = mesh.state_dir().join("repo");
    repo::create(&src)?;
    let (_, key_a) = new_key(&mesh, "flooder");
    let (_, key_b) = new_key(&mesh, "steady");
    let channel = mesh.channel("gateway").await?;

    let mut gw_b = GatewayClient::new(channel.clone());
    let b = gw_b
        .launch_run(with_key(
            &key_b,
            launch_req(&src, "steady-1", "echo steady > steady.txt"),
        ))
        .await?
        .into_inner();

    // A: 400 calls at once, then more while B's run goes on.
    let flood = {
        let channel = channel.clone();
        let key_a = key_a.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut calls = tokio::task::JoinSet::new();
            for i in 0..400 {
                let mut gw = GatewayClient::new(channel.clone());
                let key = key_a.clone();
                calls.spawn(async move {
                    let r = if i % 2 == 0 {
                        gw.list_runs(with_key(&key, ListRunsRequest::default()))
                            .await
                            .map(|_| ())
                    } else {
                        get(&mut gw, &key, "run-nothing").await.map(|_| ())
                    };
                    r.err().map(|s| s.code())
                });
            }
            let mut codes = Vec::new();
            while let Some(c) = calls.join_next().await {
                codes.push(c.expect("call task"));
            }
            (codes, started.elapsed())
        })
    };

    let done = wait_closed(&mut gw_b, &key_b, &b.run_id, Duration::from_secs(120)).await;
    let (codes, took) = flood.await?;
    assert_eq!(done.state, RunState::Completed as i32, "{done:#?}");
    assert_eq!(done.forks_succeeded, 1, "{done:#?}");
    let exhausted = codes
        .iter()
        .filter(|c| **c == Some(Code::ResourceExhausted))
        .count();
    assert!(exhausted > 0, "the flood was never limited: {codes:?}");
    // Refusals are immediate: no call waited out its 20 s timeout.
    assert!(
        !codes.contains(&Some(Code::DeadlineExceeded)) && !codes.contains(&Some(Code::Cancelled)),
        "some calls hung: {codes:?}"
    );
    println!(
        "flood: {} calls, {exhausted} RESOURCE_EXHAUSTED, in {took:?}",
        codes.len()
    );
    Ok(())
}
