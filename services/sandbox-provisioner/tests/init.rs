//! A sandbox that starts once: every command of a sandbox runs under its one long-lived
//! bubblewrap (its init), and what a command leaves behind is cleaned up as before.

mod common;

use common::{eventually, exec_req, fixture, fixture_with, host_pids_with, unique_sleep};
use forkyard_proto::sandbox::v1::{DestroySandboxRequest, StartSandboxRequest, StopSandboxRequest};
use std::time::Duration;

/// A `sleep` in a session of its own, given time to get there before the command ends.
fn detach(marker: &str) -> String {
    format!("setsid sleep {marker} >/dev/null 2>&1 </dev/null & sleep 0.5")
}

/// The start time of the sandbox's pid 1 (its bubblewrap), in clock ticks since boot.
const PID1_START: &str = "cut -d' ' -f22 /proc/1/stat";

#[tokio::test]
async fn every_command_of_a_sandbox_runs_under_one_bubblewrap() {
    let f = fixture().await;
    let sbx = f.create().await;
    let first = f.sh(&sbx.id, PID1_START).await;
    assert_eq!(first.exit_code, 0, "{}", first.stderr);
    for _ in 0..5 {
        let again = f.sh(&sbx.id, PID1_START).await;
        assert_eq!(again.stdout, first.stdout, "a new bubblewrap started");
    }
    // The same bubblewrap on the host, whatever ran in it, and no reaper process of its
    // own (a fork of it, the same command line): the init is the sandbox's pid 1.
    let workspace = f.state.join("sandboxes").join(&sbx.id).join("workspace");
    let bind = format!("{} /workspace", workspace.display());
    let bwraps = host_pids_with(&bind);
    assert_eq!(bwraps.len(), 1, "{bwraps:?}");
    let out = f.sh(&sbx.id, "echo $PPID").await;
    assert_eq!(out.stdout, "1\n", "{out:?}");
    f.sh(&sbx.id, "true").await;
    assert_eq!(host_pids_with(&bind), bwraps);
    let other = f.create().await;
    let theirs = f.sh(&other.id, PID1_START).await;
    assert_eq!(theirs.exit_code, 0, "{}", theirs.stderr);
}

#[tokio::test]
async fn what_a_command_leaves_in_its_group_dies_with_it_and_the_rest_at_destroy() {
    let f = fixture().await;
    let sbx = f.create().await;
    let in_group = unique_sleep();
    // The background sleep holds the command's stdout: the exec still ends when its
    // command does, not when the sleep (300 s or more) lets go of the pipe. (What an
    // exec takes is `make bench-provisioner`'s figure.)
    let out = f
        .sh(&sbx.id, &format!("sleep {in_group} & echo left"))
        .await;
    assert_eq!((out.exit_code, out.stdout.as_str()), (0, "left\n"));
    let held_for: f64 = in_group.parse().unwrap();
    assert!(
        (out.duration_ms as f64) < held_for * 1000.0,
        "the exec waited for the background process holding its stdout: {out:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || host_pids_with(&in_group)
            .is_empty())
        .await,
        "the command's process group outlived it"
    );
    // A process that left the command's group (a session of its own) stays, until the
    // sandbox is stopped or destroyed.
    let escaped = unique_sleep();
    let out = f.sh(&sbx.id, &detach(&escaped)).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    assert!(
        eventually(Duration::from_secs(5), || !host_pids_with(&escaped)
            .is_empty())
        .await,
        "the detached process never ran"
    );
    assert_eq!(f.sh(&sbx.id, "echo still").await.stdout, "still\n");
    f.core
        .stop(StopSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || host_pids_with(&escaped)
            .is_empty())
        .await,
        "a stop left a process running"
    );
    f.core
        .start(StartSandboxRequest {
            sandbox_id: sbx.id.clone(),
        })
        .await
        .unwrap();
    let escaped = unique_sleep();
    f.sh(&sbx.id, &detach(&escaped)).await;
    assert!(
        eventually(Duration::from_secs(5), || !host_pids_with(&escaped)
            .is_empty())
        .await
    );
    f.core
        .destroy(DestroySandboxRequest {
            sandbox_id: sbx.id.clone(),
            reason: "done".into(),
        })
        .await
        .unwrap();
    assert!(
        host_pids_with(&escaped).is_empty(),
        "destroy left a process running"
    );
    let workspace = f.state.join("sandboxes").join(&sbx.id).join("workspace");
    assert!(host_pids_with(&workspace.display().to_string()).is_empty());
}

#[tokio::test]
async fn a_timeout_kills_the_command_not_the_sandbox() {
    let f = fixture().await;
    let sbx = f.create().await;
    let before = f.sh(&sbx.id, PID1_START).await.stdout;
    let marker = unique_sleep();
    let mut req = exec_req(
        &sbx.id,
        &["sh", "-c", &format!("sleep {marker}; echo never")],
    );
    req.timeout_secs = 1;
    let out = f.core.exec(req).await.unwrap();
    assert!(out.timed_out, "{out:?}");
    assert!(
        host_pids_with(&marker).is_empty(),
        "the timed-out command lives on"
    );
    assert_eq!(f.sh(&sbx.id, PID1_START).await.stdout, before);
}

#[tokio::test]
async fn no_command_can_kill_the_init_and_one_that_dies_is_replaced_at_the_next_command() {
    let f = fixture().await;
    let sbx = f.create().await;
    let before = f.sh(&sbx.id, PID1_START).await.stdout;
    // The init is the sandbox's pid 1: a signal from inside, SIGKILL too, does not reach
    // it, and the sandbox goes on under it.
    let out = f
        .sh(
            &sbx.id,
            "kill -KILL $PPID; kill -TERM 1; kill -KILL 1; echo alive",
        )
        .await;
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "alive\n"),
        "{out:?}"
    );
    assert_eq!(f.sh(&sbx.id, PID1_START).await.stdout, before);

    let marker = unique_sleep();
    let core = f.core.clone();
    let id = sbx.id.clone();
    let sleeper = marker.clone();
    let waiting = tokio::spawn(async move { core.exec(exec_req(&id, &["sleep", &sleeper])).await });
    // Running under this init before it dies (a busy machine may start the task late,
    // and then a new init would run it).
    assert!(
        eventually(Duration::from_secs(10), || !host_pids_with(&marker)
            .is_empty())
        .await,
        "the command never started"
    );
    // The init dies as the OOM killer would kill it: from outside. It is the parent of
    // every command.
    let sleep_pid = host_pids_with(&marker)[0];
    let stat = std::fs::read_to_string(format!("/proc/{sleep_pid}/stat")).unwrap();
    let init_pid: i32 = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|ppid| ppid.parse().ok())
        .unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &init_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let other = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("a command of a dead init never ended")
        .unwrap()
        .unwrap();
    assert_ne!(other.exit_code, 0, "{other:?}");
    let after = f.sh(&sbx.id, &format!("echo back; {PID1_START}")).await;
    assert_eq!(after.exit_code, 0, "{}", after.stderr);
    assert!(after.stdout.starts_with("back\n"), "{after:?}");
    assert_ne!(after.stdout.trim_start_matches("back\n"), before);
}

#[tokio::test]
async fn what_a_command_leaves_reparented_to_the_init_is_reaped() {
    let f = fixture().await;
    let sbx = f.create().await;
    // Each command leaves a process in its group (killed when it ends) and one in a
    // session of its own (ending a moment later): both reparented to the init, neither
    // may stay a zombie (each would hold a pid of the sandbox's).
    for _ in 0..20 {
        let script = "(sleep 5; true) & setsid sleep 0.05 >/dev/null 2>&1 </dev/null &";
        let out = f.sh(&sbx.id, script).await;
        assert_eq!(out.exit_code, 0, "{}", out.stderr);
    }
    let zombies = "sleep 0.5; grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l";
    let out = f.sh(&sbx.id, zombies).await;
    assert_eq!(out.stdout.trim(), "0", "zombies left: {out:?}");
}

#[tokio::test]
async fn a_missing_program_is_exit_127_with_its_name() {
    let f = fixture().await;
    let sbx = f.create().await;
    let out = f
        .core
        .exec(exec_req(&sbx.id, &["no-such-program-here"]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 127, "{out:?}");
    assert!(
        out.stderr.contains("no-such-program-here"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn a_bare_name_is_found_on_the_commands_own_path_as_the_shell_finds_it() {
    let f = fixture().await;
    let sbx = f.create().await;
    // On PATH, in order: a directory of the name, a file that is not executable, the
    // program; then a second program the first one hides.
    let setup = "mkdir -p a/tool b c d && printf 'echo b\\n' > b/tool \
        && printf '#!/bin/sh\\necho c \"$@\"\\n' > c/tool && chmod +x c/tool \
        && printf '#!/bin/sh\\necho d\\n' > d/tool && chmod +x d/tool";
    let out = f.sh(&sbx.id, setup).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let mut req = exec_req(&sbx.id, &["tool", "x", "y"]);
    req.env.insert(
        "PATH".into(),
        "/workspace/a:/workspace/b:/workspace/c:/workspace/d:/usr/bin:/bin".into(),
    );
    let out = f.core.exec(req).await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "c x y\n"),
        "{out:?}"
    );
    // The program sees the name it was called by, not where it was found.
    let out = f.sh(&sbx.id, "echo $0").await;
    assert_eq!(out.stdout, "sh\n", "{out:?}");
    // As `execvp` again: a file without `#!` is run by /bin/sh; a script whose
    // interpreter is missing is passed over for the next of the name.
    let setup = "mkdir -p e f && printf 'echo plain \"$@\"\\n' > e/plain && chmod +x e/plain \
        && printf '#!/no/such/interpreter\\n' > e/tool2 && chmod +x e/tool2 \
        && printf '#!/bin/sh\\necho f\\n' > f/tool2 && chmod +x f/tool2";
    let out = f.sh(&sbx.id, setup).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    for (argv, want) in [(&["plain", "z"][..], "plain z\n"), (&["tool2"][..], "f\n")] {
        let mut req = exec_req(&sbx.id, argv);
        req.env.insert(
            "PATH".into(),
            "/workspace/e:/workspace/f:/usr/bin:/bin".into(),
        );
        let out = f.core.exec(req).await.unwrap();
        assert_eq!((out.exit_code, out.stdout.as_str()), (0, want), "{out:?}");
    }
}

#[tokio::test]
async fn sh_dash_c_of_one_plain_command_runs_as_the_shell_would_run_it() {
    let f = fixture().await;
    let sbx = f.create().await;
    let setup = "cat > show <<'E'\n#!/bin/sh\nprintf '%s|' \"$#\" \"$@\" \"$V\"\nexit 3\nE\n\
        chmod +x show && echo x > data";
    let out = f.sh(&sbx.id, setup).await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let sh = |script: &str| {
        let mut req = exec_req(&sbx.id, &["sh", "-c", script]);
        req.env.insert("V".into(), "v".into());
        req.env
            .insert("PATH".into(), "/workspace:/usr/bin:/bin".into());
        f.core.exec(req)
    };
    // Started without the shell (the init's own start): words, environment, exit code.
    let out = sh("show  --task=a,b\t@x").await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (3, "2|--task=a,b|@x|v|"),
        "{out:?}"
    );
    // Not found, not executable: the codes a shell gives.
    let out = sh("no-such-agent --flag").await.unwrap();
    assert_eq!(out.exit_code, 127, "{out:?}");
    // The init's message, not a shell's: no shell was started.
    assert!(
        out.stderr.starts_with("forkyard: no-such-agent:"),
        "{}",
        out.stderr
    );
    let out = sh("./data").await.unwrap();
    assert_eq!(out.exit_code, 126, "{out:?}");
    // A path stays with the shell: a file without `#!` is a script to it.
    let out = sh("echo 'echo plain $V' > plain && chmod +x plain")
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let out = sh("./plain").await.unwrap();
    assert_eq!(
        (out.exit_code, out.stdout.as_str()),
        (0, "plain v\n"),
        "{out:?}"
    );
    // With any shell syntax, the shell.
    let out = sh("./show \"$V w\" > out; cat out").await.unwrap();
    assert_eq!(out.stdout, "1|v w|v|", "{out:?}");
    let out = sh("cd / && pwd").await.unwrap();
    assert_eq!(out.stdout, "/\n", "{out:?}");
}

#[tokio::test]
async fn with_the_init_off_each_command_gets_a_bubblewrap_of_its_own() {
    let f = fixture_with(|_, c| c.sandbox_init = false).await;
    let sbx = f.create().await;
    let out = f
        .sh(&sbx.id, "echo $$; ls /proc | grep -cE '^[0-9]+$'")
        .await;
    assert_eq!(out.exit_code, 0, "{}", out.stderr);
    let marker = unique_sleep();
    let out = f
        .sh(
            &sbx.id,
            &format!(
                "{}; grep -qs {marker} /proc/[0-9]*/cmdline && echo ran",
                detach(&marker)
            ),
        )
        .await;
    assert_eq!(out.stdout, "ran\n", "{}", out.stderr);
    assert!(
        eventually(Duration::from_secs(5), || host_pids_with(&marker)
            .is_empty())
        .await,
        "a bubblewrap per command takes everything of the command with it"
    );
}

#[tokio::test]
async fn a_command_can_neither_reach_into_its_init_nor_hold_another_sandboxs_terminal() {
    let f = fixture().await;
    let a = f.create().await;
    let b = f.create().await;
    // A terminal open in sandbox A while sandbox B's init starts.
    let mut events = f
        .core
        .start_pty(forkyard_proto::sandbox::v1::StartPtyRequest {
            sandbox_id: a.id.clone(),
            argv: vec!["sh".into()],
            rows: 24,
            cols: 80,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(events.recv().await.is_some(), "the pty never started");
    let fds = f
        .sh(
            &b.id,
            "for fd in /proc/$$/fd/*; do readlink $fd; done; true",
        )
        .await;
    assert_eq!(fds.exit_code, 0, "{}", fds.stderr);
    assert!(
        !fds.stdout.contains("ptmx") && !fds.stdout.contains("/dev/pts"),
        "a command holds a terminal it was not given: {}",
        fds.stdout
    );
    // The init (the command's parent) is not dumpable: its descriptors and memory are
    // out of the sandbox's reach although it runs as the same uid.
    let out = f
        .sh(
            &b.id,
            "ls /proc/$PPID/fd >/dev/null 2>&1 && echo reached || echo refused",
        )
        .await;
    assert_eq!(out.stdout, "refused\n", "{}", out.stderr);
    drop(events);
}
