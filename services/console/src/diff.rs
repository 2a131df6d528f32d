//! A fork's patch (git's unified diff) as files of classified lines, and its rendering:
//! additions and deletions coloured and still marked `+` / `-`, so the diff reads
//! without colour; long files folded.

use maud::{Markup, html};

/// Files with more lines than this start folded.
const FOLD_LINES: usize = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Add,
    Del,
    Context,
    Hunk,
    /// `diff --git`, `index`, `---`/`+++`, mode and binary lines.
    Meta,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct FileDiff {
    pub path: String,
    pub lines: Vec<(LineKind, String)>,
    pub added: usize,
    pub deleted: usize,
}

/// Split `patch` into files. Text before the first `diff --git` (none in a fork's
/// patch) becomes a file with no path.
pub fn parse(patch: &str) -> Vec<FileDiff> {
    let mut files: Vec<FileDiff> = Vec::new();
    let mut in_header = false;
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("diff --git ") {
            files.push(FileDiff {
                path: path_of(rest),
                ..FileDiff::default()
            });
            in_header = true;
        }
        if files.is_empty() {
            files.push(FileDiff::default());
        }
        let file = files.last_mut().expect("one file at least");
        let kind = classify(line, &mut in_header);
        match kind {
            LineKind::Add => file.added += 1,
            LineKind::Del => file.deleted += 1,
            _ => {}
        }
        file.lines.push((kind, line.to_owned()));
    }
    files
}

fn classify(line: &str, in_header: &mut bool) -> LineKind {
    if line.starts_with("@@") {
        *in_header = false;
        return LineKind::Hunk;
    }
    // `--- a/x` and `+++ b/x` are headers only before a file's first hunk: inside one
    // they are a deleted "-- a/x" line or an added "++ b/x" line.
    if *in_header {
        return LineKind::Meta;
    }
    match line.as_bytes().first() {
        Some(b'+') => LineKind::Add,
        Some(b'-') => LineKind::Del,
        Some(b' ') | None => LineKind::Context,
        _ => LineKind::Meta,
    }
}

/// `a/x b/x` → `x` (the new name of a rename: its `b/` side).
fn path_of(rest: &str) -> String {
    match rest.rsplit_once(" b/") {
        Some((_, b)) => b.to_owned(),
        None => rest.to_owned(),
    }
}

/// The patch as a section per file (`id` prefixes the files' element ids).
pub fn render(patch: &str, id: &str) -> Markup {
    let files = parse(patch);
    html! {
        div.diff id=(id) {
            @if files.is_empty() { p.empty { "No changes." } }
            @for (i, f) in files.iter().enumerate() {
                details.file id=(format!("{id}-file-{}", i + 1)) open[f.lines.len() <= FOLD_LINES] {
                    summary {
                        span.path { (if f.path.is_empty() { "(preamble)" } else { &f.path }) }
                        " " span.add { "+" (f.added) } " " span.del { "−" (f.deleted) }
                        @if f.lines.len() > FOLD_LINES { " (" (f.lines.len()) " lines, folded)" }
                    }
                    pre.lines { @for (kind, text) in &f.lines { (line(*kind, text)) } }
                }
            }
        }
    }
}

fn line(kind: LineKind, text: &str) -> Markup {
    let class = match kind {
        LineKind::Add => "ln add",
        LineKind::Del => "ln del",
        LineKind::Context => "ln ctx",
        LineKind::Hunk => "ln hunk",
        LineKind::Meta => "ln meta",
    };
    // One element per line, the marker kept in the text: copyable as a patch.
    html! { span class=(class) { (text) "\n" } }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff --git a/src/lib.txt b/src/lib.txt
index 1111111..2222222 100644
--- a/src/lib.txt
+++ b/src/lib.txt
@@ -1,2 +1,2 @@
 one
-two
+two (fork 1)
--- not a header
diff --git a/new.txt b/new.txt
new file mode 100644
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+<script>alert(1)</script>
";

    #[test]
    fn splits_files_and_counts_lines() {
        let files = parse(PATCH);
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].path, "src/lib.txt");
        assert_eq!((files[0].added, files[0].deleted), (1, 2));
        assert_eq!(files[1].path, "new.txt");
        assert_eq!((files[1].added, files[1].deleted), (1, 0));
        assert_eq!(files[0].lines[2].0, LineKind::Meta, "--- header");
        assert_eq!(files[0].lines[8].0, LineKind::Del, "--- inside a hunk");
    }

    #[test]
    fn renders_escaped_and_marked() {
        let html = render(PATCH, "d").0;
        assert!(html.contains("&lt;script&gt;"), "{html}");
        assert!(!html.contains("<script>"), "{html}");
        assert!(
            html.contains(r#"<span class="ln add">+two (fork 1)"#),
            "{html}"
        );
        assert!(html.contains(r#"<span class="ln del">-two"#), "{html}");
    }

    #[test]
    fn empty_patch_says_so() {
        assert!(render("", "d").0.contains("No changes."));
    }
}
