//! A write past a sandbox's disk limit fails inside the sandbox, on every filesystem:
//! `fallocate -l 3G` in a sandbox bound to 100 MiB used to succeed, its blocks held on
//! the host's disk until the watch killed the command and the destroy freed them. Now
//! each of the sandbox's processes has `RLIMIT_FSIZE` at the bound's wall, so the call
//! itself fails (SIGXFSZ), nothing is allocated, and files within the bound are written
//! as before. Under the sandbox's init and with a bubblewrap per command alike.

mod common;

use forkyard_proto::sandbox::v1::SandboxLimits;

async fn writes_past_the_limit_fail_inside(init: bool) {
    let f = common::fixture_with(|_, c| c.sandbox_init = init).await;
    let mut req = f.request("forkyard-fork-1");
    req.limits = Some(SandboxLimits {
        disk_bytes: 100 << 20,
        ..Default::default()
    });
    let sbx = f.core.create(req).await.unwrap();
    let out = f
        .sh(
            &sbx.id,
            "fallocate -l 3G big; echo \"fallocate $?\"; \
             head -c 52428800 /dev/zero > fits; echo \"write $?\"",
        )
        .await;
    let lines: Vec<&str> = out.stdout.lines().collect();
    // 153 = 128 + SIGXFSZ: the kernel stopped the call at the limit.
    assert_eq!(lines, ["fallocate 153", "write 0"], "init {init}: {out:?}");
    let ws = common::own_files(&f.state, &sbx.id);
    let allocated = |name: &str| {
        std::fs::metadata(ws.join(name))
            .map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
    };
    assert_eq!(allocated("big"), 0, "init {init}: fallocate allocated");
    assert!(allocated("fits") >= 50 << 20, "init {init}");
}

#[tokio::test]
async fn a_write_past_the_disk_limit_fails_inside_the_sandbox_under_its_init() {
    writes_past_the_limit_fail_inside(true).await;
}

#[tokio::test]
async fn a_write_past_the_disk_limit_fails_inside_the_sandbox_without_an_init() {
    writes_past_the_limit_fail_inside(false).await;
}
