//! The open-files limit: the replica's raised, its sandboxes' the one it was started with.
//! A binary of its own: it changes its process's limit, which every test of a binary
//! shares under plain `cargo test`.

mod common;

use rustix::process::{Resource, getrlimit, setrlimit};

/// A replica started under systemd's soft limit of open files (1,024; 256 here) raises
/// it to the hard limit: hundreds of sandboxes' commands and walks over deep trees need
/// more. Its sandboxes' commands get the limit it was started with (programs size
/// tables by it, some close every descriptor up to it), with the sandbox's init (the
/// default) and without one.
#[tokio::test]
async fn a_replica_raises_its_open_files_limit_and_its_sandboxes_get_the_one_it_started_with() {
    let mut limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum;
    limit.current = Some(256);
    setrlimit(Resource::Nofile, limit).unwrap();
    let f = common::fixture().await;
    assert_eq!(getrlimit(Resource::Nofile).current, hard);
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, "ulimit -n; ulimit -Hn").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let hard_text = hard.map_or("unlimited".to_owned(), |h| h.to_string());
    assert_eq!(out.stdout, format!("256\n{hard_text}\n"));

    let f = common::fixture_with(|_, c| c.sandbox_init = false).await;
    let sbx = f.create().await;
    let out = f.sh(&sbx.id, "ulimit -n").await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "256\n");

    // A busy replica holds more descriptors than the sandboxes' limit: a sandbox still
    // starts (its descriptors are put in place before the limit is lowered).
    let held: Vec<std::fs::File> = (0..300)
        .map(|_| std::fs::File::open("/dev/null").unwrap())
        .collect();
    for f in [common::fixture().await, f] {
        let sbx = f.create().await;
        let out = f.sh(&sbx.id, "ulimit -n").await;
        assert_eq!(out.exit_code, 0, "{}", out.stderr);
        assert_eq!(out.stdout, "256\n");
    }
    drop(held);
}
