//! Warm copies against a real git repository in a temp dir.

use super::{
    tests::{git, repo, walk},
    *,
};
use crate::local::{
    isolation::uids,
    storage::{layout::RECORD, repo::git_index},
};
use forkyard_common::git_refs::local_commit;
use std::os::unix::fs::MetadataExt as _;

const TIMEOUT: Duration = Duration::from_secs(60);

fn warm_names(template: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(template.join(warm_copy::DIR))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Until `done` holds, for at most 20 s (the copies are made by a thread of their own).
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything of `ws` but its branch: each path, its kind, mode, size, mtime (to the
/// nanosecond) and content.
fn contents(ws: &Path) -> Vec<(PathBuf, u32, u64, i64, i64, Vec<u8>)> {
    let mut all: Vec<_> = walk(ws)
        .into_iter()
        .filter(|p| !p.ends_with(".git/HEAD") && !p.starts_with(ws.join(".git/refs/heads")))
        .map(|p| {
            let m = std::fs::symlink_metadata(&p).unwrap();
            let body = if m.file_type().is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                std::fs::read(&p).unwrap()
            };
            let rel = p.strip_prefix(ws).unwrap().to_path_buf();
            (rel, m.mode(), m.size(), m.mtime(), m.mtime_nsec(), body)
        })
        .collect();
    all.sort();
    all
}

/// Templates under `tmp` keeping up to `copies` warm copies each (at least `min`),
/// within 1 GiB, given to `uids` when the replica hands uids out.
fn with_copies(
    tmp: &Path,
    copies: usize,
    min: usize,
    uids: Option<Arc<uids::SandboxUids>>,
) -> Templates {
    Templates::open(tmp.join("templates"), 0)
        .unwrap()
        .with_warm(
            WarmBounds {
                copies,
                bytes: 1 << 30,
                min,
            },
            uids,
        )
}

/// What a create does: a warm copy placed as the sandbox's directory `sbx`, else the
/// directory made and the template copied. The new workspace, and how it was made.
async fn create(
    t: &Templates,
    dir: &Path,
    sbx: &Path,
    branch: &str,
    commit: &str,
) -> (PathBuf, Copied) {
    let _turn = t.turn().await.unwrap();
    let placed = t.take(dir, sbx).await;
    if placed.is_none() {
        std::fs::create_dir(sbx).unwrap();
    }
    let ws = sbx.join("workspace");
    let copied = t
        .copy(dir.to_path_buf(), &ws, branch, commit, placed)
        .await
        .unwrap();
    (ws, copied)
}

#[tokio::test]
async fn creates_take_warm_copies_as_fresh_as_a_copy_each_once_and_within_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let root = tmp.path().join("templates");
    // Run as root (as here), copies are given to sandbox uids ahead of time too.
    let uids = uids::SandboxUids::new(2_000_000_000, 100).map(Arc::new);
    let t = with_copies(tmp.path(), 3, 0, uids.clone());
    let dir = t.ensure(path, &commit, TIMEOUT).await.unwrap();

    // The first create copies the template; it asks for one copy ahead.
    let (fresh, copied) = create(&t, &dir, &tmp.path().join("fresh"), "fork-1", &commit).await;
    assert!(!fresh.parent().unwrap().join(RECORD).exists());
    assert_eq!(Some(copied.index), git_index::checksum_of(&fresh));
    // Given its uid as it is made (no second walk at register).
    assert_eq!(copied.uid != 0, uids.is_some());
    eventually("one warm copy", || t.warm.ready() == 1);
    let first = warm_names(&dir);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(!first[0].ends_with(".tmp"), "{first:?}");

    let uids = uids.as_ref();
    second_create_takes_the_copy(&t, &dir, tmp.path(), &commit, &fresh, &first[0], uids).await;
    copies_follow_creates_within_the_bound(&t, &dir, tmp.path(), &commit).await;
    creates_at_once_take_one_each(&t, &dir, tmp.path(), &commit, &fresh, uids).await;
    let newer_dir = newer_template_replaces_the_copies(&t, &dir, &r, tmp.path(), uids).await;

    // A restarted replica knows none of the last run's copies: they are removed.
    drop(t);
    let again = Templates::open(root, 0).unwrap();
    assert!(warm_names(&newer_dir).is_empty());
    assert_eq!(again.warm.ready(), 0);
}

/// The second takes it: the same files as a copy, to the nanosecond, on its branch.
async fn second_create_takes_the_copy(
    t: &Templates,
    dir: &Path,
    tmp: &Path,
    commit: &str,
    fresh: &Path,
    first: &str,
    uids: Option<&Arc<uids::SandboxUids>>,
) {
    let (b, copied) = create(t, dir, &tmp.join("b"), "team/fork-2", commit).await;
    // With its record file, empty, made ahead too (`Store::save_new` writes it).
    let record = std::fs::metadata(b.parent().unwrap().join(RECORD)).unwrap();
    assert_eq!(record.len(), 0);
    let refs = b.join(".git/refs/heads");
    assert!(
        !refs.join(warm_copy::BRANCH_FILE).exists(),
        "the ref made ahead is the branch's"
    );
    assert!(
        !warm_names(dir).contains(&first.to_owned()),
        "the copy was renamed away"
    );
    assert_eq!(contents(&b), contents(fresh));
    assert_eq!(Some(copied.index), git_index::checksum_of(&b));
    if uids.is_some() {
        assert_ne!(copied.uid, 0);
        // The branch's directory too, made at the create: git in the sandbox writes its
        // ref's lock file there.
        let team = b.join(".git/refs/heads/team");
        for f in [b.clone(), b.join("README.md"), b.join(".git/index"), team] {
            let owner = std::fs::symlink_metadata(&f).unwrap().uid();
            assert_eq!(owner, copied.uid, "{f:?}");
        }
    }
    // Owned by its sandbox uid: git run as root here is told that is fine.
    let in_b = |args: &[&str]| git(&b, &[&["-c", "safe.directory=*"], args].concat());
    assert_eq!(in_b(&["rev-parse", "--abbrev-ref", "HEAD"]), "team/fork-2");
    assert_eq!(in_b(&["rev-parse", "HEAD"]), commit);
    assert_eq!(in_b(&["status", "--porcelain"]), "");
    in_b(&["fsck", "--no-progress"]);
}

/// As many copies as creates in the last minute, at most the bound: 2, then 3.
async fn copies_follow_creates_within_the_bound(
    t: &Templates,
    dir: &Path,
    tmp: &Path,
    commit: &str,
) {
    eventually("two warm copies", || t.warm.ready() == 2);
    for n in 3..8 {
        let sbx = tmp.join(format!("w{n}"));
        create(t, dir, &sbx, &format!("fork-{n}"), commit).await;
    }
    eventually("three warm copies", || t.warm.ready() == 3);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(warm_names(dir).len(), 3, "{:?}", warm_names(dir));
}

/// Creates at once each take a copy of their own.
async fn creates_at_once_take_one_each(
    t: &Templates,
    dir: &Path,
    tmp: &Path,
    commit: &str,
    fresh: &Path,
    uids: Option<&Arc<uids::SandboxUids>>,
) {
    let sandboxes: Vec<PathBuf> = (0..3).map(|n| tmp.join(format!("c{n}"))).collect();
    let made = futures::future::join_all(
        sandboxes
            .iter()
            .enumerate()
            .map(|(n, sbx)| async move { create(t, dir, sbx, &format!("c-{n}"), commit).await }),
    )
    .await;
    let mut given: Vec<u32> = made.iter().map(|(_, c)| c.uid).collect();
    let names: Vec<PathBuf> = made.iter().map(|(ws, _)| ws.clone()).collect();
    for (ws, (_, copied)) in names.iter().zip(made) {
        assert_eq!(contents(ws), contents(fresh));
        assert_eq!(Some(copied.index), git_index::checksum_of(ws));
    }
    given.sort_unstable();
    given.dedup();
    assert_eq!(
        given.len(),
        if uids.is_some() { 3 } else { 1 },
        "a uid each"
    );
    std::fs::write(names[0].join("README.md"), "mine\n").unwrap();
    assert_eq!(
        std::fs::read_to_string(names[1].join("README.md")).unwrap(),
        "hello\n"
    );
}

/// A newer commit's template replaces this one, its copies with it. The newer template's directory.
async fn newer_template_replaces_the_copies(
    t: &Templates,
    dir: &Path,
    r: &Path,
    tmp: &Path,
    uids: Option<&Arc<uids::SandboxUids>>,
) -> PathBuf {
    let path = r.to_str().unwrap();
    eventually("copies made again", || t.warm.ready() == 3);
    let pooled: Vec<u32> = warm_names(dir)
        .iter()
        .map(|n| {
            std::fs::metadata(dir.join(warm_copy::DIR).join(n).join("workspace"))
                .unwrap()
                .uid()
        })
        .collect();
    std::fs::write(r.join("README.md"), "two\n").unwrap();
    git(r, &["commit", "-qam", "two"]);
    let newer = local_commit(path, "main").unwrap();
    let newer_dir = t.ensure(path, &newer, TIMEOUT).await.unwrap();
    assert!(!dir.exists(), "the older template and its copies are gone");
    if let Some(uids) = uids {
        // Their uids are free again (no copy is made within the quiet time after a create).
        for uid in pooled {
            assert!(uids.hold(uid), "uid {uid} given back");
            uids.release(uid);
        }
    }
    create(t, &newer_dir, &tmp.join("e"), "fork-e", &newer).await;
    eventually("a copy of the newer template", || {
        warm_names(&newer_dir).len() == 1 && t.warm.ready() == 1
    });
    newer_dir
}

/// A floor of copies larger than the replica's uids: copies claim at most half of them
/// ahead of time, and creates get every uid of the range.
#[tokio::test]
async fn warm_copies_leave_creates_half_the_sandbox_uids() {
    let Some(uids) = uids::SandboxUids::new(2_000_000_000, 8).map(Arc::new) else {
        forkyard_common::testing::requires(
            forkyard_common::testing::Need::Root,
            false,
            "sandbox uids shared by warm copies and creates",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let t = with_copies(tmp.path(), 128, 128, Some(uids.clone()));
    let dir = t.ensure(path, &commit, TIMEOUT).await.unwrap();
    create(&t, &dir, &tmp.path().join("s0"), "fork-0", &commit).await;
    // One sandbox and three copies: half the eight uids.
    eventually("three warm copies", || t.warm.ready() == 3);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(t.warm.ready(), 3, "copies went past half the uids");
    let mut taken = Vec::new();
    for n in 1..8 {
        let sbx = tmp.path().join(format!("s{n}"));
        let (_, copied) = create(&t, &dir, &sbx, &format!("fork-{n}"), &commit).await;
        assert_ne!(copied.uid, 0, "create {n} got no uid");
        taken.push(copied.uid);
    }
    taken.sort_unstable();
    taken.dedup();
    assert_eq!(taken.len(), 7, "every create its own uid");
    assert!(uids.claim().is_err(), "all eight in use by the sandboxes");
    assert_eq!(t.warm.ready(), 0);
}

#[tokio::test]
async fn with_warm_copies_off_every_create_copies_and_nothing_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let t = Templates::open(tmp.path().join("templates"), 0)
        .unwrap()
        .with_warm(WarmBounds::OFF, None);
    for n in 0..3 {
        let ws = tmp.path().join(format!("w{n}"));
        t.workspace(path, &commit, &format!("fork-{n}"), &ws, TIMEOUT)
            .await
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let dir = t.ensure(path, &commit, TIMEOUT).await.unwrap();
    assert!(warm_names(&dir).is_empty());
}

/// Sandboxes on another filesystem than the templates (here tmpfs): a copy cannot be
/// renamed into one, so copies stop, and those already made are removed from the disk.
#[tokio::test]
async fn copies_that_cannot_be_renamed_into_sandboxes_go_and_no_more_are_made() {
    let tmp = tempfile::tempdir().unwrap();
    let Ok(other) = tempfile::tempdir_in("/dev/shm") else {
        forkyard_common::testing::skip("no /dev/shm here: no second filesystem to test with");
        return;
    };
    let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
    if dev(other.path()) == dev(tmp.path()) {
        forkyard_common::testing::skip(
            "/dev/shm is on the temp dir's filesystem: no second filesystem to test with",
        );
        return;
    }
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let t = with_copies(tmp.path(), 3, 0, None);
    let dir = t.ensure(path, &commit, TIMEOUT).await.unwrap();
    for n in 0..3 {
        create(
            &t,
            &dir,
            &tmp.path().join(format!("s{n}")),
            &format!("fork-{n}"),
            &commit,
        )
        .await;
    }
    eventually("three warm copies", || warm_names(&dir).len() == 3);

    let (ws, _) = create(&t, &dir, &other.path().join("s"), "fork-x", &commit).await;
    assert_eq!(git(&ws, &["rev-parse", "--abbrev-ref", "HEAD"]), "fork-x");
    eventually("the copies removed", || warm_names(&dir).is_empty());
    assert_eq!(t.warm.ready(), 0);
    for n in 0..3 {
        let sbx = other.path().join(format!("o{n}"));
        create(&t, &dir, &sbx, &format!("fork-o{n}"), &commit).await;
    }
    std::thread::sleep(Duration::from_millis(400));
    assert!(warm_names(&dir).is_empty(), "{:?}", warm_names(&dir));
}
