//! The new-run form's image, egress and delivery fields, for e2e_console: each launch the
//! gateway refuses shows its message next to the field it names (a pull request without
//! a push, a push of a local repository's forks, a private egress address), the section
//! kept open and nothing started; one it takes runs with the egress the form named.

use super::Console;
use crate::tenant_calls::{self, Gw, list_ids, wait_closed};
use forkyard_proto::gateway::v1::RunState;
use std::{path::Path, time::Duration};

/// The form for one fork with its delivery section open: `selects` picks options (`#push`, `#pull_requests`), `fields` types.
async fn fill(c: &Console, src: &Path, selects: &[(&str, &str)], fields: &[(&str, &str)]) {
    c.fill_one_fork(src, "deliver it", "deliver").await;
    for (id, value) in selects {
        c.click(&format!("{id} option[value=\"{value}\"]")).await;
    }
    for (id, value) in fields {
        c.b.fill(id, value).await.unwrap();
    }
}

/// Submit, and the message shown next to `field`: it starts with what the gateway named.
async fn refused_at(c: &Console, field: &str, named: &str) {
    c.submit_new_run().await;
    let error = c.b.text_of(&format!("#{field}-error")).await;
    assert!(error.starts_with(named), "{field} error: {error:?}");
    let open =
        c.b.execute("return document.getElementById('deliver').open")
            .await;
    assert_eq!(open.unwrap(), true, "the refused field is shown");
}

pub async fn delivery_from_form(c: &Console, gw: &mut Gw, key: &str, src: &Path) {
    let runs_before = list_ids(gw, key).await;
    fill(c, src, &[("#pull_requests", "winner")], &[]).await;
    refused_at(c, "pull_requests", "delivery.pull_requests").await;
    fill(c, src, &[("#push", "winner")], &[]).await;
    refused_at(c, "push", "delivery.push").await;
    fill(c, src, &[], &[("#egress", "pypi.org, 10.0.0.7")]).await;
    refused_at(c, "egress", "egress").await;
    c.b.execute("document.getElementById('deliver').scrollIntoView(); return true")
        .await
        .unwrap();
    c.shot("12-delivery-refused").await;
    assert_eq!(
        list_ids(gw, key).await,
        runs_before,
        "a refused form started a run"
    );

    fill(c, src, &[], &[("#egress", "pypi.org")]).await;
    c.submit_new_run().await;
    let run_id = c.launched_run_id().await;
    let run = tenant_calls::get(gw, key, &run_id).await.expect("the run");
    let spec = run.spec.expect("spec");
    assert_eq!(spec.egress, ["pypi.org"]);
    assert_eq!((spec.image.as_str(), spec.delivery), ("", None));
    let run = wait_closed(gw, key, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
}
