//! The `local` backend's own latency, in process (no gRPC, no Temporal): create-to-ready
//! and destroy of one sandbox at a time over N sandboxes (default 200), the first command
//! in a fresh sandbox, and M sandboxes alive at once (default 100) with the process's
//! peak RSS. Real git, real bubblewrap, real cgroups when the host allows them.
//! Then the same one at a time on an image (a `docker save` archive made here, unpacked
//! into the image cache by the first create; the others find it cached).
//! Sizes: `FORKYARD_BENCH_SANDBOXES` (default 200), `FORKYARD_BENCH_ALIVE` (default 100).
//! Prints figures only; the goals (docs/performance.md) are for a human to read.

#[path = "../../services/sandbox-provisioner/tests/common/test_image.rs"]
mod test_image;

use forkyard_proto::sandbox::v1::{CreateSandboxRequest, DestroySandboxRequest, ExecRequest};
use forkyard_sandbox_provisioner::{Config, Provisioner};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    println!(
        "  {name:<28} n={:<4} p50 {:>7.2} ms  p99 {:>7.2} ms  max {:>7.2} ms",
        v.len(),
        percentile(&v, 0.5),
        percentile(&v, 0.99),
        v.last().copied().unwrap_or(0.0)
    );
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn create_req(repo: &str, n: usize) -> CreateSandboxRequest {
    CreateSandboxRequest {
        repo: repo.to_owned(),
        branch: format!("forkyard-fork-{n}"),
        ..Default::default()
    }
}

fn true_req(id: &str) -> ExecRequest {
    ExecRequest {
        sandbox_id: id.to_owned(),
        argv: vec!["true".into()],
        ..Default::default()
    }
}

async fn destroy(core: &Arc<Provisioner>, id: &str) {
    core.destroy(DestroySandboxRequest {
        sandbox_id: id.to_owned(),
        reason: "bench".into(),
    })
    .await
    .expect("destroy");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env_usize("FORKYARD_BENCH_SANDBOXES", 200);
    let alive = env_usize("FORKYARD_BENCH_ALIVE", 100);
    let tmp = tempfile::Builder::new()
        .prefix("forkyard-bench-prov-")
        .tempdir()?;
    // Run as root, the provisioner runs each sandbox as a uid of its own, whose
    // bubblewrap passes through here to the workspace (search only).
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )?;
    let src = tmp.path().join("repo");
    forkyard_tests::repo::create(&src)?;
    let repo = src.to_string_lossy().into_owned();
    let mut config = Config::new(tmp.path().join("state"), "http://127.0.0.1:0");
    config.default_ttl = Duration::ZERO;
    let images = tmp.path().join("images");
    std::fs::create_dir(&images)?;
    test_image::save_image(&images, "bench.tar", true);
    config.image_archive_dir = Some(images);
    // `FORKYARD_SANDBOX_UID_BASE=0`: sandboxes as root, for an A/B of the uid per sandbox.
    if let Ok(base) = std::env::var("FORKYARD_SANDBOX_UID_BASE") {
        config.sandbox_uid_base = base.parse()?;
    }
    // The forwarder is the sandboxes' init: without it every command gets a bubblewrap
    // of its own. `FORKYARD_SANDBOX_INIT=false` for that A/B.
    config.forwarder_path = Some(match std::env::var_os("FORKYARD_EGRESS_FORWARDER") {
        Some(p) => p.into(),
        None => std::env::current_exe()?
            .parent()
            .and_then(|deps| deps.parent())
            .map(|dir| dir.join("sandbox-egress-forwarder"))
            .filter(|p| p.is_file())
            .ok_or_else(|| anyhow::anyhow!("no sandbox-egress-forwarder next to the bench: cargo build --release -p forkyard-sandbox-provisioner"))?,
    });
    if let Ok(v) = std::env::var("FORKYARD_SANDBOX_INIT") {
        config.sandbox_init = v.parse()?;
    }
    // `FORKYARD_WORKSPACE_OVERLAY=false`: templates copied, for an A/B of the overlays.
    if let Ok(v) = std::env::var("FORKYARD_WORKSPACE_OVERLAY") {
        config.workspace_overlay = v.parse()?;
    }
    let config_uid_base = config.sandbox_uid_base;
    let core_init = config.sandbox_init;
    let core: Arc<Provisioner> = Provisioner::open(config)
        .await
        .map_err(anyhow::Error::msg)?;
    let rss_before = status_kib("VmRSS:");
    println!(
        "provisioner bench (local backend, in process): {n} sandboxes one at a time, {alive} alive at once, sandbox uids from {}, {}",
        match config_uid_base {
            0 => "off (root)".to_owned(),
            b => b.to_string(),
        },
        if core_init {
            "commands under each sandbox's init"
        } else {
            "a bubblewrap per command"
        }
    );

    // Warm-up: page cache, git's and bwrap's first runs.
    for i in 0..5 {
        let s = core.create(create_req(&repo, i)).await?;
        core.exec(true_req(&s.id)).await?;
        destroy(&core, &s.id).await;
    }

    let (mut create, mut first, mut second, mut destroy_ms) = (vec![], vec![], vec![], vec![]);
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let s = core.create(create_req(&repo, i)).await?;
        create.push(ms(t.elapsed()));
        let t = Instant::now();
        let out = core.exec(true_req(&s.id)).await?;
        anyhow::ensure!(out.exit_code == 0, "true failed: {}", out.stderr);
        first.push(ms(t.elapsed()));
        let t = Instant::now();
        core.exec(true_req(&s.id)).await?;
        second.push(ms(t.elapsed()));
        let t = Instant::now();
        destroy(&core, &s.id).await;
        destroy_ms.push(ms(t.elapsed()));
    }
    let total = started.elapsed();
    let ready: Vec<f64> = create.iter().zip(&first).map(|(c, f)| c + f).collect();
    report("create (Ready returned)", create);
    report("create + first exec `true`", ready);
    report("exec `true` (first)", first);
    report("exec `true` (second)", second);
    report("destroy", destroy_ms);
    println!("  {n} sandboxes in {:.2} s", total.as_secs_f64());

    // Many alive at once.
    let t = Instant::now();
    let mut ids = Vec::with_capacity(alive);
    for i in 0..alive {
        ids.push(core.create(create_req(&repo, i)).await?.id);
    }
    let created = t.elapsed();
    let t = Instant::now();
    let mut execs = Vec::new();
    for id in &ids {
        let t = Instant::now();
        core.exec(true_req(id)).await?;
        execs.push(ms(t.elapsed()));
    }
    let exec_all = t.elapsed();
    let listed = core.list(&Default::default()).len();
    let rss_alive = status_kib("VmRSS:");
    let t = Instant::now();
    for id in &ids {
        destroy(&core, id).await;
    }
    let destroyed = t.elapsed();
    println!("  {alive} alive at once ({listed} listed):");
    println!(
        "    created in {:.2} s ({:.2} ms each), exec `true` in each in {:.2} s, destroyed in {:.2} s ({:.2} ms each)",
        created.as_secs_f64(),
        ms(created) / alive as f64,
        exec_all.as_secs_f64(),
        destroyed.as_secs_f64(),
        ms(destroyed) / alive as f64
    );
    report("exec `true` with all alive", execs);
    println!(
        "    bench process RSS: {} KiB at start, {} KiB with {alive} alive, peak {} KiB",
        rss_before,
        rss_alive,
        status_kib("VmHWM:")
    );
    on_image(&core, &repo, n).await?;
    isolations(
        &core,
        &repo,
        env_usize("FORKYARD_BENCH_GVISOR_SANDBOXES", 20),
    )
    .await?;
    with_history(&core, tmp.path()).await?;
    with_worktree(&core, tmp.path()).await
}

/// A repository with a worktree of 2,000 files in 200 directories: 20 sandboxes alive at
/// once, made one at a time. A copy of the template costs the worktree; an overlay
/// (`FORKYARD_WORKSPACE_OVERLAY`, on where the kernel allows) does not.
async fn with_worktree(core: &Arc<Provisioner>, tmp: &std::path::Path) -> anyhow::Result<()> {
    let src = tmp.join("worktree");
    forkyard_tests::repo::create(&src)?;
    for d in 0..200 {
        let dir = src.join(format!("src/m{d}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..10 {
            std::fs::write(
                dir.join(format!("f{f}.rs")),
                format!("// {d} {f}\nfn f() {{}}\n"),
            )?;
        }
    }
    forkyard_tests::repo::commit_all(&src, "a worktree of 2,000 files")?;
    let repo = src.to_string_lossy().into_owned();
    let s = core.create(create_req(&repo, 0)).await?;
    destroy(core, &s.id).await;
    let (mut create, mut ids) = (vec![], vec![]);
    for i in 0..20 {
        let t = Instant::now();
        ids.push(core.create(create_req(&repo, i)).await?.id);
        create.push(ms(t.elapsed()));
    }
    for id in &ids {
        destroy(core, id).await;
    }
    println!("  a worktree of 2,000 files (20 sandboxes alive, one at a time):");
    report("create (template cached)", create);
    Ok(())
}

/// A repository whose history is far larger than its worktree (64 MiB of objects, a
/// 10-byte worktree), as most real ones are: 20 sandboxes of it alive at once, made one
/// at a time, and what each adds to the disk. With a uid per sandbox its copies share
/// the template's git objects; `FORKYARD_SANDBOX_UID_BASE=0` (no uids) copies them.
async fn with_history(core: &Arc<Provisioner>, tmp: &std::path::Path) -> anyhow::Result<()> {
    const MIB: usize = 64;
    let src = tmp.join("history");
    forkyard_tests::repo::create(&src)?;
    // Incompressible bytes, so the pack is as large as the history.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: Vec<u8> = (0..MIB << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(src.join("big.bin"), big)?;
    forkyard_tests::repo::commit_all(&src, "a large file")?;
    std::fs::remove_file(src.join("big.bin"))?;
    forkyard_tests::repo::commit_all(&src, "the large file goes")?;
    let repo = src.to_string_lossy().into_owned();
    let free = || -> anyhow::Result<u64> {
        let s = rustix::fs::statvfs(tmp)?;
        Ok(s.f_bavail * s.f_frsize)
    };
    // The template, built once.
    let s = core.create(create_req(&repo, 0)).await?;
    destroy(core, &s.id).await;
    let before = free()?;
    let (mut create, mut ids) = (vec![], vec![]);
    for i in 0..20 {
        let t = Instant::now();
        ids.push(core.create(create_req(&repo, i)).await?.id);
        create.push(ms(t.elapsed()));
    }
    let added = before.saturating_sub(free()?);
    for id in &ids {
        destroy(core, id).await;
    }
    println!("  a repository with {MIB} MiB of history (20 sandboxes alive, one at a time):");
    report("create (template cached)", create);
    println!(
        "    disk per sandbox: {:.1} MiB",
        added as f64 / ids.len() as f64 / f64::from(1 << 20)
    );
    Ok(())
}

/// Sandboxes one at a time on an image: the first create unpacks it, the rest find it
/// in the cache. The image has a shell (its `true` a builtin) and nothing of the host.
async fn on_image(core: &Arc<Provisioner>, repo: &str, n: usize) -> anyhow::Result<()> {
    let req = |i| CreateSandboxRequest {
        image: "archive:bench.tar".into(),
        ..create_req(repo, i)
    };
    let sh_true = |id: &str| ExecRequest {
        argv: vec!["sh".into(), "-c".into(), "true".into()],
        ..true_req(id)
    };
    println!("  on an image ({n} sandboxes, one at a time):");
    let t = Instant::now();
    let s = core.create(req(0)).await?;
    println!(
        "    first create (image unpacked): {:.2} ms",
        ms(t.elapsed())
    );
    destroy(core, &s.id).await;
    let (mut create, mut exec) = (vec![], vec![]);
    for i in 0..n {
        let t = Instant::now();
        let s = core.create(req(i)).await?;
        create.push(ms(t.elapsed()));
        core.exec(sh_true(&s.id)).await?;
        let t = Instant::now();
        let out = core.exec(sh_true(&s.id)).await?;
        anyhow::ensure!(out.exit_code == 0, "sh -c true failed: {}", out.stderr);
        exec.push(ms(t.elapsed()));
        destroy(core, &s.id).await;
    }
    report("create (image cached)", create);
    report("exec `sh -c true` (second)", exec);
    Ok(())
}

/// The wait between a create and its first command in the bench's third series: about
/// what a fork's health check and its agent's dispatch to a runner take on the mesh.
const AFTER_CREATE: std::time::Duration = std::time::Duration::from_millis(150);

/// Each isolation level side by side, `n` sandboxes one at a time: the create, the first
/// command (which starts the sandbox's init: bubblewrap, or waits for the gVisor container
/// its create started), a second one, and a first command 150 ms after a create.
/// gVisor is skipped, saying why, where runsc cannot run.
async fn isolations(core: &Arc<Provisioner>, repo: &str, n: usize) -> anyhow::Result<()> {
    println!("  by isolation ({n} sandboxes each, one at a time):");
    for isolation in forkyard_proto::ISOLATIONS {
        let req = |i| CreateSandboxRequest {
            isolation: (*isolation).into(),
            ..create_req(repo, i)
        };
        // The first gVisor create waits for the one-time runsc probe: not counted.
        match core.create(req(0)).await {
            Ok(s) => destroy(core, &s.id).await,
            Err(e) => {
                println!("    {isolation}: not here ({e})");
                continue;
            }
        }
        let (mut create, mut first, mut second, mut later) = (vec![], vec![], vec![], vec![]);
        let mut ready = vec![];
        for i in 0..n {
            let t = Instant::now();
            let s = core.create(req(i)).await?;
            create.push(ms(t.elapsed()));
            let t = Instant::now();
            let out = core.exec(true_req(&s.id)).await?;
            anyhow::ensure!(
                out.exit_code == 0,
                "{isolation}: true failed: {}",
                out.stderr
            );
            first.push(ms(t.elapsed()));
            // Create to ready: to the first command's end, as a caller meets it (#44).
            ready.push(create[create.len() - 1] + first[first.len() - 1]);
            let t = Instant::now();
            core.exec(true_req(&s.id)).await?;
            second.push(ms(t.elapsed()));
            destroy(core, &s.id).await;
            // A fork's first command comes after its health check and its agent's
            // dispatch to a runner: a gVisor sandbox boots meanwhile (at its create).
            let s = core.create(req(i)).await?;
            tokio::time::sleep(AFTER_CREATE).await;
            let t = Instant::now();
            core.exec(true_req(&s.id)).await?;
            later.push(ms(t.elapsed()));
            destroy(core, &s.id).await;
        }
        report(&format!("{isolation} create"), create);
        report(&format!("{isolation} first exec"), first);
        report(&format!("{isolation} second exec"), second);
        report(&format!("{isolation} create to ready"), ready);
        report(
            &format!(
                "{isolation} first exec {} ms after create",
                AFTER_CREATE.as_millis()
            ),
            later,
        );
    }
    Ok(())
}
