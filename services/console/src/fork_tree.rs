//! The run's fork tree, when some of its forks are branches of others
//! (`ForkResult.parent_fork`): nested lists, each fork with its status, so the tree
//! reads without colour and without the table. Absent for a run without branches.

use crate::format;
use forkyard_proto::{common::v1::ForkResult, gateway::v1::Run};
use maud::{Markup, html};
use std::collections::BTreeMap;

/// The tree (id `fork-tree`), or nothing when no fork has a parent.
pub fn render(run: &Run) -> Markup {
    if !run.forks.iter().any(|f| f.parent_fork > 0) {
        return html! {};
    }
    let mut children: BTreeMap<u32, Vec<&ForkResult>> = BTreeMap::new();
    for f in &run.forks {
        // A parent the run does not list (or a fork naming itself) hangs at the root.
        let parent = if f.parent_fork != f.fork && known(run, f.parent_fork) {
            f.parent_fork
        } else {
            0
        };
        children.entry(parent).or_default().push(f);
    }
    html! {
        section #fork-tree aria-labelledby="fork-tree-title" {
            h2 #fork-tree-title { "Fork tree" }
            (level(run, &children, 0, 0))
        }
    }
}

fn known(run: &Run, n: u32) -> bool {
    n >= 1 && (n as usize) <= run.forks.len()
}

/// The forks under `parent`; `depth` bounds the nesting (a cycle cannot recurse forever).
fn level(
    run: &Run,
    children: &BTreeMap<u32, Vec<&ForkResult>>,
    parent: u32,
    depth: usize,
) -> Markup {
    let Some(kids) = children.get(&parent).filter(|_| depth <= run.forks.len()) else {
        return html! {};
    };
    html! {
        ul.tree {
            @for f in kids {
                li data-fork=(f.fork) {
                    a href=(format!("/runs/{}/forks/{}", run.run_id, f.fork)) { "fork " (f.fork) }
                    " · " (format::fork_status(f.status))
                    @if f.cost_micros > 0 { " · " (format::usd(f.cost_micros)) }
                    (level(run, children, f.fork, depth + 1))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fork(n: u32, parent: u32) -> ForkResult {
        ForkResult {
            fork: n,
            parent_fork: parent,
            depth: u32::from(parent > 0),
            ..Default::default()
        }
    }

    #[test]
    fn branches_nest_under_their_parent() {
        let run = Run {
            run_id: "r".into(),
            forks: vec![fork(1, 0), fork(2, 0), fork(3, 1), fork(4, 3)],
            ..Default::default()
        };
        let html = render(&run).into_string();
        let at = |s: &str| html.find(s).unwrap();
        // fork 3 inside fork 1's item, fork 4 inside fork 3's, fork 2 after both.
        assert!(at("data-fork=\"1\"") < at("data-fork=\"3\""));
        assert!(at("data-fork=\"3\"") < at("data-fork=\"4\""));
        assert!(at("data-fork=\"4\"") < at("data-fork=\"2\""));
        assert_eq!(html.matches("<ul class=\"tree\">").count(), 3, "{html}");
    }

    #[test]
    fn no_branches_no_tree_and_cycles_end() {
        let flat = Run {
            forks: vec![fork(1, 0)],
            ..Default::default()
        };
        assert!(render(&flat).into_string().is_empty());
        let cycle = Run {
            forks: vec![fork(1, 2), fork(2, 1), fork(3, 0)],
            ..Default::default()
        };
        assert!(render(&cycle).into_string().contains("data-fork=\"3\""));
    }
}
