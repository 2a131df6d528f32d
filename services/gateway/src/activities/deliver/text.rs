//! What a delivery writes for people: each fork's commit message, and its pull
//! request's title and Markdown body summarising the run (forks, verify, cost, ranking).

use forkyard_proto::common::v1::{ForkResult, ForkStatus, VerifyStatus};

/// How much of the prompt a title or a message quotes.
const PROMPT_LINE: usize = 72;
const PROMPT_QUOTE: usize = 2000;

/// What a delivery knows of its run to describe it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RunFacts {
    pub run_id: String,
    pub prompt: String,
    pub driver: String,
    pub model: String,
    pub verify_command: String,
    pub winner: u32,
    pub ranking: Vec<u32>,
    /// Every fork's compact result (no patches).
    pub forks: Vec<ForkResult>,
    pub cost_micros: i64,
}

fn first_line(text: &str, max: usize) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if line.chars().count() <= max {
        return line.to_owned();
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// The default commit message: what was asked, and which run, fork, driver and model.
pub fn commit_message(facts: &RunFacts, fork: u32) -> String {
    let model = if facts.model.is_empty() {
        "default model"
    } else {
        &facts.model
    };
    format!(
        "{}\n\nFork {fork} of Forkyard run {}: {} ({model}).\n\nForkyard-Run: {}\nForkyard-Fork: {fork}\n",
        first_line(&facts.prompt, PROMPT_LINE),
        facts.run_id,
        facts.driver,
        facts.run_id,
    )
}

pub fn pr_title(facts: &RunFacts, fork: u32) -> String {
    format!(
        "{} (forkyard fork {fork})",
        first_line(&facts.prompt, PROMPT_LINE)
    )
}

/// The pull request's body: the prompt, then every fork in ranking order (the rest
/// after), with this one marked.
pub fn pr_body(facts: &RunFacts, fork: u32) -> String {
    let mut out = format!(
        "Fork **{fork}** of Forkyard run `{}`{}.\n\n",
        facts.run_id,
        if facts.winner == fork {
            ", the run's winner"
        } else {
            ""
        }
    );
    let quoted: String = facts.prompt.chars().take(PROMPT_QUOTE).collect();
    for line in quoted.lines() {
        out.push_str(&format!("> {}\n", md_escape(line)));
    }
    out.push_str(&format!(
        "\nDriver `{}`{}; verify: {}; the run cost {}.\n\n",
        facts.driver,
        if facts.model.is_empty() {
            String::new()
        } else {
            format!(", model `{}`", facts.model)
        },
        if facts.verify_command.is_empty() {
            "none".to_owned()
        } else {
            format!("`{}`", md_escape(&facts.verify_command))
        },
        forkyard_proto::Usd::from_micros(facts.cost_micros),
    ));
    out.push_str(&forks_table(facts, fork));
    out
}

/// Every fork of the run in ranking order (the rest after), `this` one marked.
fn forks_table(facts: &RunFacts, this: u32) -> String {
    let mut out = "| rank | fork | status | verify | cost | changes |\n|---|---|---|---|---|---|\n"
        .to_owned();
    let mut order: Vec<u32> = facts.ranking.clone();
    order.extend(
        facts
            .forks
            .iter()
            .map(|f| f.fork)
            .filter(|n| !facts.ranking.contains(n)),
    );
    for n in order {
        let Some(f) = facts.forks.iter().find(|f| f.fork == n) else {
            continue;
        };
        let rank = facts
            .ranking
            .iter()
            .position(|r| *r == n)
            .map_or("–".to_owned(), |i| (i + 1).to_string());
        let name = if n == this {
            format!("**{n}** (this)")
        } else {
            n.to_string()
        };
        out.push_str(&format!(
            "| {rank} | {name} | {} | {} | {} | {} |\n",
            status(f),
            verify(f),
            forkyard_proto::Usd::from_micros(f.cost_micros),
            changes(f)
        ));
    }
    out
}

fn status(f: &ForkResult) -> &'static str {
    match ForkStatus::try_from(f.status) {
        Ok(ForkStatus::Succeeded) => "succeeded",
        Ok(ForkStatus::Failed) => "failed",
        Ok(ForkStatus::Cancelled) => "cancelled",
        Ok(ForkStatus::TimedOut) => "timed out",
        _ => "not finished",
    }
}

fn verify(f: &ForkResult) -> &'static str {
    match VerifyStatus::try_from(f.verify) {
        Ok(VerifyStatus::Passed) => "passed",
        Ok(VerifyStatus::Failed) => "failed",
        Ok(VerifyStatus::TimedOut) => "timed out",
        _ => "–",
    }
}

fn changes(f: &ForkResult) -> String {
    f.diffstat.as_ref().map_or("–".to_owned(), |d| {
        format!(
            "{} files, +{} −{}",
            d.files_changed, d.insertions, d.deletions
        )
    })
}

/// Text a caller wrote, shown as text: Markdown's and HTML's active characters escaped.
fn md_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if "\\`*_[]<>|#!".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkyard_proto::common::v1::DiffStat;

    fn facts() -> RunFacts {
        let fork = |n, status: ForkStatus, verify: VerifyStatus| ForkResult {
            fork: n,
            status: status as i32,
            verify: verify as i32,
            cost_micros: 1_250_000,
            diffstat: Some(DiffStat {
                files_changed: 2,
                insertions: 10,
                deletions: 3,
            }),
            ..Default::default()
        };
        RunFacts {
            run_id: "run-x".into(),
            prompt: "Fix the <b>parser</b>\nand more".into(),
            driver: "claude-code".into(),
            model: "claude-sonnet".into(),
            verify_command: "cargo test".into(),
            winner: 2,
            ranking: vec![2, 1],
            forks: vec![
                fork(1, ForkStatus::Succeeded, VerifyStatus::Failed),
                fork(2, ForkStatus::Succeeded, VerifyStatus::Passed),
                fork(3, ForkStatus::Failed, VerifyStatus::Unspecified),
            ],
            cost_micros: 3_750_000,
        }
    }

    #[test]
    fn the_body_ranks_every_fork_and_marks_this_one() {
        let body = pr_body(&facts(), 2);
        assert!(
            body.starts_with("Fork **2** of Forkyard run `run-x`, the run's winner."),
            "{body}"
        );
        assert!(
            body.contains("> Fix the \\<b\\>parser\\</b\\>\n> and more\n"),
            "{body}"
        );
        let rows: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| rank"))
            .collect();
        assert_eq!(rows.len(), 3, "{body}");
        assert!(
            rows[0].starts_with("| 1 | **2** (this) | succeeded | passed |"),
            "{}",
            rows[0]
        );
        assert!(
            rows[1].starts_with("| 2 | 1 | succeeded | failed |"),
            "{}",
            rows[1]
        );
        assert!(rows[2].starts_with("| – | 3 | failed | – |"), "{}", rows[2]);
        assert!(rows[0].contains("2 files, +10 −3"), "{}", rows[0]);
    }

    #[test]
    fn the_commit_message_names_run_fork_driver_and_model() {
        let msg = commit_message(&facts(), 1);
        assert!(msg.starts_with("Fix the <b>parser</b>\n\nFork 1 of Forkyard run run-x: claude-code (claude-sonnet)."), "{msg}");
        assert!(
            msg.ends_with("Forkyard-Run: run-x\nForkyard-Fork: 1\n"),
            "{msg}"
        );
        assert_eq!(
            pr_title(&facts(), 3),
            "Fix the <b>parser</b> (forkyard fork 3)"
        );
    }
}
