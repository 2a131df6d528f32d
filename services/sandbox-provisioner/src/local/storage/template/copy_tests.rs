//! A template's copy given to a sandbox uid: git's objects shared read-only, everything
//! else the sandbox's, against a real repository and real uids (run as root, as here).

use super::{
    tests::{git, repo},
    *,
};
use crate::local::{base::shared::is_shared, isolation::uids};
use forkyard_common::git_refs::local_commit;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

/// Every path under `dir`, directories included.
fn everything(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(everything(&p));
        }
        out.push(p);
    }
    out
}

/// `script` run by `sh` in `ws` as `uid`, as a sandbox's command would be.
fn as_uid(uid: u32, ws: &Path, script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={uid}"),
            "--clear-groups".into(),
            "sh".into(),
            "-c".into(),
            script.into(),
        ])
        .current_dir(ws)
        .env("HOME", ws)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap()
}

fn packs(ws: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(ws.join(".git/objects/pack"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    all.sort();
    all
}

#[tokio::test]
async fn a_copy_given_to_a_uid_shares_gits_objects_read_only_and_owns_the_rest() {
    let Some(uids) = uids::SandboxUids::new(2_000_000_000, 100).map(Arc::new) else {
        forkyard_common::testing::requires(
            forkyard_common::testing::Need::Root,
            false,
            "sandboxes with uids of their own, sharing git's objects",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // The sandboxes' uids pass through to their workspaces, as through `sandboxes/`.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let t = Templates::open(tmp.path().join("templates"), 0)
        .unwrap()
        .with_warm(WarmBounds::OFF, Some(uids.clone()));
    let dir = t
        .ensure(path, &commit, Duration::from_secs(60))
        .await
        .unwrap();
    let template_packs = packs(&dir.join("workspace"));
    assert!(!template_packs.is_empty());
    let before = contents(&template_packs);

    let make = |name: &str, branch: &str| {
        let (t, dir, commit) = (&t, dir.clone(), commit.clone());
        let ws = tmp.path().join(name).join("workspace");
        let branch = branch.to_owned();
        async move {
            std::fs::create_dir(ws.parent().unwrap()).unwrap();
            std::fs::set_permissions(ws.parent().unwrap(), std::fs::Permissions::from_mode(0o711))
                .unwrap();
            let _turn = t.turn().await.unwrap();
            let copied = t.copy(dir, &ws, &branch, &commit, None).await.unwrap();
            (ws, copied.uid)
        }
    };
    let (a, uid_a) = make("a", "team/x-fork-1").await;
    let (b, uid_b) = make("b", "team/x-fork-2").await;
    assert!(uid_a != 0 && uid_b != 0 && uid_a != uid_b);

    let shared = objects_shared_and_the_rest_owned(&a, uid_a, &template_packs);
    let shared_meta = shared_files_unchangeable(&a, uid_a, &shared);
    git_works_as_in_a_copy_of_its_own(&a, uid_a, &shared_meta);
    template_and_other_copy_untouched(&dir, &template_packs, &before, &b, uid_b);
}

/// The bytes of each of `files`.
fn contents(files: &[PathBuf]) -> Vec<Vec<u8>> {
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// The object files are the template's own, read-only; everything else is the uid's,
/// the directory the branch's name needed included. The shared files.
fn objects_shared_and_the_rest_owned(
    a: &Path,
    uid_a: u32,
    template_packs: &[PathBuf],
) -> Vec<PathBuf> {
    for (p, t) in packs(a).iter().zip(template_packs) {
        let (m, tm) = (std::fs::metadata(p).unwrap(), std::fs::metadata(t).unwrap());
        assert_eq!(
            (m.ino(), m.uid(), m.mode() & 0o777),
            (tm.ino(), 0, 0o444),
            "{p:?}"
        );
    }
    let shared: Vec<PathBuf> = packs(a);
    for p in everything(a).into_iter().filter(|p| !shared.contains(p)) {
        let owner = std::fs::symlink_metadata(&p).unwrap().uid();
        assert_eq!(owner, uid_a, "{p:?}");
    }
    assert_eq!(std::fs::metadata(a).unwrap().mode() & 0o777, 0o700);
    // A warm copy's bytes leave out what it shares.
    let pack_bytes: u64 = template_packs
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum();
    assert_eq!(copy::shared_bytes(a), pack_bytes);
    assert!(a.join(".git/refs/heads/team/x-fork-1").is_file());
    shared
}

/// The sandbox cannot change a shared file: not its content, not its mode. The shared
/// pack's metadata.
fn shared_files_unchangeable(a: &Path, uid_a: u32, shared: &[PathBuf]) -> std::fs::Metadata {
    let pack = shared
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "pack"))
        .unwrap();
    let name = pack.file_name().unwrap().to_str().unwrap();
    let out = as_uid(uid_a, a, &format!("printf x >> .git/objects/pack/{name}"));
    assert!(!out.status.success(), "appended to a shared object file");
    let out = as_uid(uid_a, a, &format!("chmod u+w .git/objects/pack/{name}"));
    assert!(!out.status.success(), "changed a shared object file's mode");
    let shared_meta = std::fs::metadata(pack).unwrap();
    assert!(is_shared(&shared_meta));
    uids::chown_tree(a, uid_a).unwrap();
    assert_eq!(
        std::fs::metadata(pack).unwrap().uid(),
        0,
        "a walk giving the workspace away leaves it"
    );
    shared_meta
}

/// Git as the sandbox works as in a copy of its own: commits on its branch (the ref
/// under `team/`), repacks (removing its links), and the repository stays whole.
fn git_works_as_in_a_copy_of_its_own(a: &Path, uid_a: u32, shared_meta: &std::fs::Metadata) {
    let out = as_uid(
        uid_a,
        a,
        "echo changed > README.md && git -c user.name=a -c user.email=a@b commit -qam change \
         && git gc -q --prune=now && git fsck --no-progress && git rev-parse --abbrev-ref HEAD",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "team/x-fork-1");
    let now: Vec<u64> = packs(a)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().ino())
        .collect();
    assert!(
        !now.contains(&shared_meta.ino()),
        "the repack left the shared pack"
    );
}

/// The template and the other copy are untouched.
fn template_and_other_copy_untouched(
    dir: &Path,
    template_packs: &[PathBuf],
    before: &[Vec<u8>],
    b: &Path,
    uid_b: u32,
) {
    let after: Vec<Vec<u8>> = contents(template_packs);
    assert!(before == after, "the template's objects changed");
    git(&dir.join("workspace"), &["fsck", "--no-progress"]);
    let out = as_uid(uid_b, b, "git fsck --no-progress && git status --porcelain");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
}

#[tokio::test]
async fn without_sandbox_uids_every_file_is_copied() {
    let tmp = tempfile::tempdir().unwrap();
    let r = repo(tmp.path());
    let path = r.to_str().unwrap();
    let commit = local_commit(path, "").unwrap();
    let t = Templates::open(tmp.path().join("templates"), 0)
        .unwrap()
        .with_warm(WarmBounds::OFF, None);
    let ws = tmp.path().join("w");
    t.workspace(path, &commit, "fork-1", &ws, Duration::from_secs(60))
        .await
        .unwrap();
    let dir = t
        .ensure(path, &commit, Duration::from_secs(60))
        .await
        .unwrap();
    for (p, t) in packs(&ws).iter().zip(packs(&dir.join("workspace"))) {
        let (m, tm) = (std::fs::metadata(p).unwrap(), std::fs::metadata(t).unwrap());
        assert_ne!(m.ino(), tm.ino(), "{p:?} is the template's");
        assert_eq!(m.nlink(), 1);
    }
}
