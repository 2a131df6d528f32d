//! `sh -c <script>` whose script is one plain command, started by the sandbox's init
//! as the command's own words (GNU make's rule for recipe lines). A POSIX shell given
//! one simple command with `-c` replaces itself with it (dash and bash both do), so what
//! runs, its process tree, environment, exit code and signals are the same; only the
//! shell's own start is saved: about a millisecond of CPU on a virtual machine, where
//! each process start pays glibc's CPU probe. Agents and verify commands are run this
//! way. A program that cannot be found or run is reported as a shell reports it (127,
//! 126), with the init's message on its stderr.

/// Characters that mean something to the shell (quoting, expansion, redirection,
/// globbing, lists, comments, grouping, history): a script with any of them, or any
/// character not named as plain here, goes to the shell.
fn plain(c: char) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(c, '_' | '-' | '.' | '/' | ',' | ':' | '@' | '%' | '+' | '=')
}

/// Words a shell treats as its own: keywords, builtins that act on the shell (GNU
/// make's `unix_sh_cmds`), and dash's other builtins (`echo`, `true`, ...). A builtin
/// costs the shell no second process, and an image may have the shell without a program
/// of that name, so those stay with the shell.
const SHELL_WORDS: &[&str] = &[
    ".",
    ":",
    "alias",
    "bg",
    "break",
    "case",
    "cd",
    "chdir",
    "command",
    "continue",
    "do",
    "done",
    "echo",
    "elif",
    "else",
    "esac",
    "eval",
    "exec",
    "exit",
    "export",
    "false",
    "fc",
    "fg",
    "fi",
    "for",
    "function",
    "getopts",
    "hash",
    "if",
    "in",
    "jobs",
    "kill",
    "local",
    "login",
    "logout",
    "printf",
    "pwd",
    "read",
    "readonly",
    "return",
    "select",
    "set",
    "shift",
    "source",
    "test",
    "then",
    "time",
    "times",
    "trap",
    "true",
    "type",
    "typeset",
    "ulimit",
    "umask",
    "unalias",
    "unset",
    "until",
    "wait",
    "while",
    // bash's own, where /bin/sh is bash.
    "bind",
    "builtin",
    "caller",
    "compgen",
    "complete",
    "compopt",
    "coproc",
    "declare",
    "dirs",
    "disown",
    "enable",
    "help",
    "history",
    "let",
    "mapfile",
    "popd",
    "pushd",
    "readarray",
    "shopt",
    "suspend",
];

/// The words of `argv` when it is `sh -c <one plain command>`.
pub(crate) fn unwrapped(argv: &[String]) -> Option<Vec<String>> {
    match argv {
        [sh, c, script] if matches!(sh.as_str(), "sh" | "/bin/sh") && c == "-c" => words(script),
        _ => None,
    }
}

/// The words of `script` when it is one plain command.
fn words(script: &str) -> Option<Vec<String>> {
    let words: Vec<&str> = script
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    let first = words.first()?;
    // `NAME=value cmd` sets a variable: the shell's. A path is left to the shell too: a
    // file without `#!` is a script to it, and not something the init can start.
    let plain = !first.contains('=')
        && !first.contains('/')
        && !SHELL_WORDS.contains(first)
        && script.chars().all(|c| c == ' ' || c == '\t' || plain(c));
    plain.then(|| words.into_iter().map(str::to_owned).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_shell(script: &str) -> bool {
        words(script).is_none()
    }

    #[test]
    fn one_plain_command_runs_as_its_words() {
        assert_eq!(words("cargo").unwrap(), ["cargo"]);
        assert_eq!(
            words("  python3\tagent.py --task=fix-1 a,b @x 50%  ").unwrap(),
            ["python3", "agent.py", "--task=fix-1", "a,b", "@x", "50%"]
        );
        assert_eq!(words("npx agent ./x").unwrap(), ["npx", "agent", "./x"]);
    }

    #[test]
    fn only_sh_dash_c_of_a_plain_command_is_unwrapped() {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            unwrapped(&v(&["sh", "-c", "cargo test"])),
            Some(v(&["cargo", "test"]))
        );
        assert_eq!(
            unwrapped(&v(&["/bin/sh", "-c", "python3 a.py"])),
            Some(v(&["python3", "a.py"]))
        );
        assert_eq!(unwrapped(&v(&["sh", "-c", "a && b"])), None);
        assert_eq!(unwrapped(&v(&["sh", "-c", "true"])), None, "a builtin");
        assert_eq!(unwrapped(&v(&["bash", "-c", "cargo"])), None);
        assert_eq!(unwrapped(&v(&["sh", "-c", "cargo", "name"])), None);
        assert_eq!(unwrapped(&v(&["sh", "-e", "cargo"])), None);
        assert_eq!(unwrapped(&v(&["cargo"])), None);
    }

    #[test]
    fn anything_the_shell_would_read_differently_goes_to_the_shell() {
        for s in [
            "",
            "   ",
            "echo $FORKYARD_PROMPT",
            "claude -p \"$FORKYARD_PROMPT\"",
            "a 'b c'",
            "a; b",
            "a && b",
            "a | b",
            "a > out",
            "a < in",
            "a &",
            "a\nb",
            "ls *.rs",
            "ls file?",
            "ls [ab]",
            "cat ~/x",
            "a # comment",
            "echo a\\ b",
            "(a)",
            "{ a; }",
            "echo `id`",
            "a !b",
            "FOO=1 agent",
            "cd sub",
            "exit 3",
            "export A",
            ". ./env",
            "if",
            "test -f x",
            "true",
            "echo hi",
            "printf x",
            "declare -x A",
            "./agent.sh",
            "/usr/bin/env python3",
            "echo é",
        ] {
            assert!(by_shell(s), "{s:?}");
        }
    }
}
