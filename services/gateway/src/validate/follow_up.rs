//! A search's follow-up prompt (`Search.follow_up`): a template over what a kept fork
//! ended with, checked at launch and rendered by the run workflow for the
//! branches it makes of that fork (text in, text out: deterministic).

use super::MAX_PROMPT_BYTES;

/// What a template may name, about the kept fork a branch continues.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The run's prompt.
    pub prompt: &'a str,
    /// The kept fork's number.
    pub fork: u32,
    /// The round the branch belongs to (the kept fork's, plus one).
    pub round: u32,
    pub verify_exit_code: i32,
    /// The end of the kept fork's verify output.
    pub verify_output: &'a str,
}

/// The names a template may use, in braces.
pub const NAMES: &[&str] = &[
    "prompt",
    "fork",
    "round",
    "verify_exit_code",
    "verify_output",
];

/// Why `template` cannot be rendered, if it cannot: a name it does not know, a brace
/// left open or closed alone.
pub fn check(template: &str) -> Result<(), String> {
    expand(template, |_| String::new()).map(|_| ())
}

/// `template` with each name replaced by its fact; the run's prompt again when it is
/// empty. Cut at the prompt's limit (it reaches the agent as one environment variable).
pub fn render(template: &str, facts: &Facts<'_>) -> Result<String, String> {
    if template.trim().is_empty() {
        return Ok(facts.prompt.to_owned());
    }
    let mut text = expand(template, |name| match name {
        "prompt" => facts.prompt.to_owned(),
        "fork" => facts.fork.to_string(),
        "round" => facts.round.to_string(),
        "verify_exit_code" => facts.verify_exit_code.to_string(),
        _ => facts.verify_output.to_owned(),
    })?;
    if text.len() > MAX_PROMPT_BYTES {
        let mut cut = MAX_PROMPT_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    Ok(text)
}

/// `template` with `{name}` replaced by `value(name)` for each known name, `{{` and `}}`
/// by a brace.
fn expand(template: &str, value: impl Fn(&str) -> String) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
        } else if tail.starts_with('}') {
            return Err("a '}' closes nothing (write '}}' for a brace)".into());
        } else {
            let Some(end) = tail.find('}') else {
                return Err("a '{' is never closed (write '{{' for a brace)".into());
            };
            let name = &tail[1..end];
            if !NAMES.contains(&name) {
                return Err(format!(
                    "{{{name}}} names nothing (one of: {})",
                    NAMES.join(", ")
                ));
            }
            out.push_str(&value(name));
            rest = &tail[end + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts<'static> {
        Facts {
            prompt: "fix the bug",
            fork: 3,
            round: 2,
            verify_exit_code: 101,
            verify_output: "test parse ... FAILED",
        }
    }

    #[test]
    fn names_are_replaced_and_doubled_braces_are_braces() {
        let t = "Round {round}, from fork {fork} ({verify_exit_code}): {verify_output}\n\
                 {prompt}; keep {{x}} as it is";
        assert_eq!(
            render(t, &facts()).unwrap(),
            "Round 2, from fork 3 (101): test parse ... FAILED\nfix the bug; keep {x} as it is"
        );
    }

    #[test]
    fn an_empty_template_is_the_runs_prompt_again() {
        assert_eq!(render("  ", &facts()).unwrap(), "fix the bug");
        assert!(check("").is_ok());
    }

    #[test]
    fn unknown_names_and_lone_braces_are_refused_with_the_reason() {
        for (t, says) in [
            ("{verify}", "{verify} names nothing"),
            ("{ prompt}", "names nothing"),
            ("fix {prompt", "never closed"),
            ("fix } it", "closes nothing"),
        ] {
            let why = check(t).unwrap_err();
            assert!(why.contains(says), "{t}: {why}");
        }
    }

    #[test]
    fn a_long_rendering_is_cut_at_the_prompts_limit_on_a_character() {
        let output = "é".repeat(MAX_PROMPT_BYTES);
        let f = Facts {
            verify_output: &output,
            ..facts()
        };
        let text = render("x{verify_output}", &f).unwrap();
        assert!(text.len() <= MAX_PROMPT_BYTES && text.len() >= MAX_PROMPT_BYTES - 1);
    }
}
