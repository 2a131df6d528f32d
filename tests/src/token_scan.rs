//! A git token looked for everywhere it must never be: inside a fork's sandbox while its
//! agent runs (the agent command does the looking, [`sandbox_scan`], and its report
//! comes back in the fork's patch), and after the run in what the mesh keeps (its logs,
//! the run's Temporal histories) and what it hands out or sends (fork results, pull
//! requests). Used by the delivery tests, whose token pushes branches and opens pull
//! requests.

use crate::{
    Mesh,
    leaks::{log_files, run_histories},
};
use base64::Engine as _;

/// A token no earlier run could have seen: `ghp_` and 32 random hex digits.
pub fn fresh_token() -> String {
    use std::hash::{BuildHasher as _, RandomState};
    let r = || RandomState::new().hash_one(0u8);
    format!("ghp_{:016x}{:016x}", r(), r())
}

/// Every way a token is spelled where it would leak: itself, and HTTP basic
/// authentication's `user:token` in base64 (what git sends, and what a log of headers
/// would hold).
pub fn spellings(user: &str, token: &str) -> Vec<String> {
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"));
    vec![token.to_owned(), basic]
}

pub fn assert_absent(what: &str, text: &str, secrets: &[String]) {
    for s in secrets {
        assert!(!text.contains(s.as_str()), "{what} holds the secret {s:?}");
    }
}

/// The report [`sandbox_scan`] writes into the workspace (so into the fork's patch).
pub const REPORT: &str = ".token-scan.txt";

/// Shell for an agent command: look for `secrets` in every process's environment and
/// command line the sandbox shows (`/proc/*/environ`, `/proc/*/cmdline`), every file of
/// the workspace (`.git` included) and of `$HOME`, and every git object of the
/// workspace's repository uncompressed; write how much was read and what was found to
/// [`REPORT`].
///
/// Each secret is joined from two halves at run time: the command's own text (in the
/// run's spec, the sandbox's `/proc/<shell>/cmdline`, the services' logs) never holds
/// it whole, so a finding is a leak and not the scan itself. The `/proc` list is
/// expanded before any `grep` starts, so no grep reads its own command line.
pub fn sandbox_scan(secrets: &[String]) -> String {
    let mut script = String::new();
    let mut patterns = String::new();
    for (i, s) in secrets.iter().enumerate() {
        let (a, b) = s.split_at(s.len() / 2);
        script.push_str(&format!("s{i}=$(printf '%s%s' '{a}' '{b}'); "));
        patterns.push_str(&format!(" -e \"$s{i}\""));
    }
    script.push_str(&format!(
        r#"np=0; hits=""
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  cat "$f" >/dev/null 2>&1 && np=$((np+1))
  grep -qaF{patterns} "$f" 2>/dev/null && hits="$hits $f"
done
nf=$(find "$PWD" "$HOME" -type f 2>/dev/null | wc -l)
hits="$hits $(grep -rlaF{patterns} "$PWD" "$HOME" 2>/dev/null | tr '\n' ' ')"
no=$(git cat-file --batch-all-objects --batch-check 2>/dev/null | wc -l)
nh=$(git cat-file --batch-all-objects --batch 2>/dev/null | grep -caF{patterns})
printf 'read: %s proc %s files %s objects\nfound:%s objects %s\n' "$np" "$nf" "$no" "$hits" "$nh" > {REPORT}
"#
    ));
    script
}

/// The scan's report in fork `fork`'s patch: it read the processes, files and objects a
/// fork has, and found the secret in none.
pub fn assert_sandbox_clean(fork: u32, patch: &str) {
    let line = |prefix: &str| {
        patch
            .lines()
            .find_map(|l| l.strip_prefix(&format!("+{prefix}")))
            .unwrap_or_else(|| panic!("fork {fork}: no scan report ({prefix}) in:\n{patch}"))
            .to_owned()
    };
    let read = line("read: ");
    let counts: Vec<u64> = read
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // Its own shell's environ and cmdline at least; the repository's files and objects.
    let [procs, files, objects] = counts[..] else {
        panic!("fork {fork}: read {read:?}")
    };
    assert!(
        procs >= 2 && files >= 3 && objects >= 3,
        "fork {fork}: the scan read too little to mean anything: {read}"
    );
    let found = line("found:");
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        ["objects", "0"],
        "fork {fork}: the secret is in its sandbox: {found}"
    );
}

/// The secrets are in no log of the mesh's state directory and in no Temporal history of
/// run `run_id` (of `forks` forks), its forks' and its publications' included, raw or
/// with each payload decoded; `expect` is text the decoded histories must hold, so a
/// read that found nothing cannot pass.
pub fn assert_not_kept(mesh: &Mesh, run_id: &str, forks: u32, expect: &str, secrets: &[String]) {
    let logs = log_files(mesh.state_dir());
    for service in ["gateway", "sandbox-provisioner", "agent-runner", "temporal"] {
        let wanted = format!("logs/{service}.log");
        assert!(
            logs.iter().any(|p| p.ends_with(&wanted)),
            "{wanted}: {logs:?}"
        );
    }
    for path in &logs {
        let text = String::from_utf8_lossy(&std::fs::read(path).unwrap()).into_owned();
        assert_absent(&path.display().to_string(), &text, secrets);
    }
    let histories = run_histories(mesh, run_id, forks);
    let decoded: String = histories.iter().map(|(_, h)| h.decoded.as_str()).collect();
    assert!(
        decoded.contains(expect),
        "{run_id}: {expect:?} in no payload"
    );
    for (id, h) in &histories {
        assert_absent(&format!("a payload of {id}"), &h.decoded, secrets);
        assert_absent(&format!("the history of {id}"), &h.raw, secrets);
    }
}
