//! The new-run form's placement and search fields, for e2e_console: a search the gateway
//! refuses shows its message next to the field it names, the fields kept open; one it
//! takes starts a search whose second round branches the first round's fork.

use super::Console;
use crate::tenant_calls::{self, Gw, wait_closed};
use forkyard_proto::gateway::v1::{RunState, Search};
use std::{path::Path, time::Duration};

/// The form for one fork with its placement and search section open, then `fields`.
async fn fill(c: &Console, src: &Path, fields: &[(&str, &str)]) {
    c.fill_one_fork(src, "search it", "more").await;
    for (id, value) in fields {
        c.b.fill(id, value).await.unwrap();
    }
}

pub async fn search_from_form(c: &Console, gw: &mut Gw, key: &str, src: &Path) {
    // Two kept of one fork: the gateway's refusal lands on "Kept each round".
    fill(c, src, &[("#rounds", "2"), ("#keep", "2")]).await;
    c.submit_new_run().await;
    let error = c.b.text_of("#keep-error").await;
    assert!(error.starts_with("search.keep"), "keep error: {error:?}");
    let open =
        c.b.execute("return document.getElementById('more').open")
            .await;
    assert_eq!(open.unwrap(), true, "the refused field is shown");
    c.b.execute("document.getElementById('more').scrollIntoView(); return true")
        .await
        .unwrap();
    c.shot("10-search-refused").await;

    let fields = [
        ("#rounds", "2"),
        ("#keep", "1"),
        ("#branches", "1"),
        ("#follow_up", "round {round}: go on"),
        ("#max_concurrent", "1"),
        ("#backend", "local"),
    ];
    fill(c, src, &fields).await;
    c.submit_new_run().await;
    let run_id = c.launched_run_id().await;
    let run = tenant_calls::get(gw, key, &run_id).await.expect("the run");
    let spec = run.spec.expect("spec");
    assert_eq!(
        spec.search,
        Some(Search {
            rounds: 2,
            keep: 1,
            branches: 1,
            follow_up: "round {round}: go on".into(),
        })
    );
    assert_eq!((spec.max_concurrent, spec.backend.as_str()), (1, "local"));
    let run = wait_closed(gw, key, &run_id, Duration::from_secs(120)).await;
    assert_eq!(run.state, RunState::Completed as i32, "{run:#?}");
    let lineage: Vec<(u32, u32)> = run.forks.iter().map(|f| (f.fork, f.parent_fork)).collect();
    assert_eq!(lineage, [(1, 0), (2, 1)], "round 2 branched fork 1");
    // The page counts the branch among the run's forks (it said "2 / 1").
    c.b.goto(&c.url(&format!("/runs/{run_id}"))).await.unwrap();
    // Read once the live view's first patch has redrawn it (a redraw replaces the element).
    let two = "const s = document.getElementById('run-summary'); \
               return !!s && document.body.dataset.live === 'finished' && s.innerText.includes('forks done 2 / 2')";
    c.b.wait_for(two, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the run page never counted 2 / 2: {e}"));
    c.shot("11-search-run").await;
}
