//! End to end: a run on an image. Each fork's sandbox runs on the image, so a verify
//! command that needs a tool only the image has passes there and fails without it; a
//! malformed image is refused at launch naming the field, and an image the
//! provisioners cannot use fails every fork saying why, leaving no sandbox behind.

#[path = "../../services/sandbox-provisioner/tests/common/test_image.rs"]
mod test_image;

use forkyard_proto::{
    common::v1::{ForkStatus, VerifyStatus},
    gateway::v1::{LaunchRunRequest, RunState, gateway_client::GatewayClient},
};
use forkyard_tests::{
    Mesh,
    mesh::MeshOptions,
    repo,
    support::{fork_result, launch, left_after_settling, wait_finished, workspaces_left},
};
use std::time::Duration;
use tonic::{Code, transport::Channel};

type Gateway = GatewayClient<Channel>;

const AGENT: &str =
    r#"echo "fork $FORKYARD_FORK" > done.txt; printf '{"total_cost_usd": 0.001}\n'"#;

fn on_image(src: &std::path::Path, image: &str) -> LaunchRunRequest {
    LaunchRunRequest {
        image: image.into(),
        verify_command: "imagetool".into(),
        ..launch(src, 2, 2, AGENT)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_verify_with_a_tool_only_their_image_has() {
    let images = tempfile::tempdir().unwrap();
    test_image::save_image(images.path(), "tool.tar", true);
    let mesh = Mesh::start_with(MeshOptions {
        env: vec![(
            "FORKYARD_IMAGE_ARCHIVE_DIR".into(),
            images.path().display().to_string(),
        )],
        ..Default::default()
    })
    .await
    .expect("mesh starts");
    let src = tempfile::tempdir().unwrap();
    repo::create(src.path()).unwrap();
    let mut gw = Gateway::new(mesh.channel("gateway").await.unwrap());

    let mut req = on_image(src.path(), "archive:tool.tar");
    req.request_id = "on-image".into();
    let run = launch_and_wait(&mut gw, req).await;
    assert_eq!(run.0.state, RunState::Completed as i32, "{:#?}", run.0);
    for fork in 1..=2 {
        let f = fork_result(&mut gw, &run.1, fork).await;
        assert_eq!(f.status, ForkStatus::Succeeded as i32, "{f:#?}");
        assert_eq!(f.verify, VerifyStatus::Passed as i32, "{f:#?}");
        assert!(
            f.verify_output_tail.contains("image tool from the image"),
            "{f:#?}"
        );
        assert!(f.patch.contains(&format!("+fork {fork}")), "{}", f.patch);
    }

    // The same run without the image: the provisioner's host has no imagetool.
    let mut req = on_image(src.path(), "");
    req.request_id = "no-image".into();
    let run = launch_and_wait(&mut gw, req).await;
    let f = fork_result(&mut gw, &run.1, 1).await;
    assert_eq!(f.verify, VerifyStatus::Failed as i32, "{f:#?}");

    // Malformed: refused at launch, naming the field.
    let err = gw
        .launch_run(on_image(src.path(), "archive:../etc"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("image"), "{}", err.message());

    // Unusable on the provisioners: every fork fails saying why, nothing is left.
    let mut req = on_image(src.path(), "archive:missing.tar");
    req.request_id = "missing".into();
    let run = launch_and_wait(&mut gw, req).await;
    assert_eq!(run.0.state, RunState::Failed as i32, "{:#?}", run.0);
    for f in &run.0.forks {
        assert!(
            f.error.contains("archive:missing.tar") && f.error.contains("no archive"),
            "{f:#?}"
        );
    }
    let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(left.is_empty(), "{left:?}");

    // Hostile: a lower layer's link to a host directory, then a whiteout through it.
    // Every fork fails naming the image and the entry; the directory is untouched.
    let canary = images.path().join("canary");
    std::fs::create_dir(&canary).unwrap();
    std::fs::write(canary.join("keep"), "the host's\n").unwrap();
    let link = {
        let mut shell = test_image::shell_layer_tar();
        shell.truncate(shell.len() - 1024); // its end-of-archive blocks: more entries follow
        let mut b = tar::Builder::new(shell);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "evil", &canary).unwrap();
        b.into_inner().unwrap()
    };
    let whiteout = {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o644);
        b.append_data(&mut h, "evil/.wh.keep", std::io::empty())
            .unwrap();
        b.into_inner().unwrap()
    };
    test_image::save_layers(images.path(), "hostile.tar", &[link, whiteout]);
    let mut req = on_image(src.path(), "archive:hostile.tar");
    req.request_id = "hostile".into();
    let run = launch_and_wait(&mut gw, req).await;
    assert_eq!(run.0.state, RunState::Failed as i32, "{:#?}", run.0);
    for f in &run.0.forks {
        assert!(
            f.error.contains("archive:hostile.tar")
                && f.error.contains("evil")
                && f.error.contains("symbolic link"),
            "{f:#?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(canary.join("keep")).unwrap(),
        "the host's\n"
    );
    let left = left_after_settling(|| workspaces_left(mesh.state_dir())).await;
    assert!(left.is_empty(), "{left:?}");
}

async fn launch_and_wait(
    gw: &mut Gateway,
    req: LaunchRunRequest,
) -> (forkyard_proto::gateway::v1::Run, String) {
    let run_id = gw.launch_run(req).await.unwrap().into_inner().run_id;
    let run = wait_finished(gw, &run_id, Duration::from_secs(120)).await;
    (run, run_id)
}
