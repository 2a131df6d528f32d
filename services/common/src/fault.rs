//! Faults a test injects at a chosen moment, in debug builds only: a named point where
//! the process dies at once, as if killed with `kill -9` there (no drain, no flush, no
//! destructors). A crash at an exact step boundary is then a test that either passes or
//! fails, instead of a race of a random kill against the step.
//!
//! `FORKYARD_FAULTS=<point>[,<point>...]` names the points. Release builds (the images,
//! the benchmarks) compile every point to nothing and never read the variable.

/// Die here if `FORKYARD_FAULTS` names `point` (debug builds only).
pub fn point(point: &str) {
    if cfg!(debug_assertions)
        && std::env::var("FORKYARD_FAULTS").is_ok_and(|list| names(&list, point))
    {
        tracing::error!(fault = point, "injected fault: this process dies here");
        std::process::abort();
    }
}

/// Whether the comma-separated `list` names `point`.
fn names(list: &str, point: &str) -> bool {
    list.split(',').any(|p| p.trim() == point)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_point_is_armed_only_by_its_whole_name() {
        let list = "finish.after-patch, other";
        assert!(super::names(list, "finish.after-patch"));
        assert!(super::names(list, "other"));
        assert!(!super::names(list, "finish.after"));
        assert!(!super::names("", "finish.after-patch"));
    }
}
