//! `--jq EXPR`: the command's JSON filtered by a jq expression, as gh does it: each
//! result on its own line, a string printed raw (jq -r), anything else as compact JSON.
//! The language is jaq's (jq's core, its standard library with regular expressions and
//! `@csv`/`@tsv`/`@base64`, dates).

use jaq_core::{
    Compiler, Ctx, Vars, data,
    load::{Arena, File, Loader, lex, parse},
    unwrap_valr,
};
use jaq_json::Val;

type Filter = jaq_core::Filter<data::JustLut<Val>>;

/// jq's `@csv` and `@tsv`, which the jaq command defines and its libraries do not.
const FORMATS: &str = r#"
def @csv: if type != "array" then error("cannot csv-format \(type), only an array") end
  | map(if type == "string" then "\"" + (split("\"") | join("\"\"")) + "\""
        elif . == null then ""
        elif type == "array" or type == "object" then error("cannot csv-format \(type) in a row")
        else tojson end)
  | join(",");
def @tsv: if type != "array" then error("cannot tsv-format \(type), only an array") end
  | map(if type == "string" then split("\\") | join("\\\\") | split("\t") | join("\\t")
          | split("\n") | join("\\n") | split("\r") | join("\\r")
        elif . == null then ""
        elif type == "array" or type == "object" then error("cannot tsv-format \(type) in a row")
        else tojson end)
  | join("\t");
"#;

/// `code` compiled, or why not in one line (`--jq: expected ... at ...`).
fn compile(code: &str) -> Result<Filter, String> {
    let formats = jaq_core::load::parse(FORMATS, |p| p.defs())
        .ok_or("the @csv and @tsv definitions do not parse")?;
    let defs = jaq_core::defs()
        .chain(jaq_std::defs())
        .chain(jaq_json::defs())
        .chain(formats);
    let funs = jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let arena = Arena::default();
    let modules = Loader::new(defs)
        .load(&arena, File { code, path: () })
        .map_err(|errs| {
            let why: Vec<String> = errs.into_iter().flat_map(|(_, e)| load_error(e)).collect();
            why.join("; ")
        })?;
    Compiler::default()
        .with_funs(funs)
        .compile(modules)
        .map_err(|errs| {
            let why: Vec<String> = errs
                .into_iter()
                .flat_map(|(_, undefined)| undefined)
                .map(|(name, u)| format!("undefined {} {name}", u.as_str()))
                .collect();
            why.join("; ")
        })
}

fn load_error(e: jaq_core::load::Error<&str>) -> Vec<String> {
    use jaq_core::load::Error;
    match e {
        Error::Io(errs) => errs.into_iter().map(|(p, e)| format!("{p}: {e}")).collect(),
        Error::Lex(errs) => errs
            .into_iter()
            .map(|(expect, at): lex::Error<&str>| expected(expect.as_str(), at))
            .collect(),
        Error::Parse(errs) => errs
            .into_iter()
            .map(|(expect, at): parse::Error<&str>| expected(expect.as_str(), at))
            .collect(),
    }
}

/// "expected X at `rest`": `at` is the expression's text from where it went wrong.
fn expected(what: &str, at: &str) -> String {
    if at.is_empty() {
        format!("expected {what} at the end")
    } else {
        let at: String = at.chars().take(20).collect();
        format!("expected {what} at `{at}`")
    }
}

/// clap's check of `--jq`: a bad expression is a usage error, before any call is made.
pub fn check(code: &str) -> Result<String, String> {
    compile(code).map(|_| code.to_owned())
}

/// `json` (one JSON document) through `code`: the lines to print. A filter that fails
/// on this input (`.[0]` of an object) is an error naming jq's reason.
pub fn apply(code: &str, json: &str) -> anyhow::Result<String> {
    let filter = compile(code).map_err(|e| anyhow::anyhow!("--jq: {e}"))?;
    let input = jaq_json::read::parse_single(json.as_bytes())
        .map_err(|e| anyhow::anyhow!("--jq: the output is not JSON: {e}"))?;
    let ctx = Ctx::<data::JustLut<Val>>::new(&filter.lut, Vars::new([]));
    let mut out = String::new();
    for v in filter.id.run((ctx, input)).map(unwrap_valr) {
        let v = v.map_err(|e| anyhow::anyhow!("--jq: {e}"))?;
        match &v {
            Val::TStr(s) => out.push_str(&String::from_utf8_lossy(s)),
            other => out.push_str(&other.to_string()),
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{apply, check};

    const RUN: &str = r#"{"runId":"run-1","winner":2,"forks":[{"fork":1,"status":"FORK_STATUS_FAILED"},{"fork":2,"status":"FORK_STATUS_SUCCEEDED","costMicros":"120"}]}"#;

    #[test]
    fn strings_print_raw_and_the_rest_as_compact_json() {
        assert_eq!(apply(".runId", RUN).unwrap(), "run-1\n");
        assert_eq!(apply(".winner", RUN).unwrap(), "2\n");
        assert_eq!(
            apply(".forks[1]", RUN).unwrap(),
            "{\"fork\":2,\"status\":\"FORK_STATUS_SUCCEEDED\",\"costMicros\":\"120\"}\n"
        );
        assert_eq!(
            apply(
                r#".forks[] | select(.status | test("SUCCEEDED")) | .fork"#,
                RUN
            )
            .unwrap(),
            "2\n"
        );
        assert_eq!(
            apply(r#".forks[] | [.fork, .status, null] | @csv"#, RUN).unwrap(),
            "1,\"FORK_STATUS_FAILED\",\n2,\"FORK_STATUS_SUCCEEDED\",\n"
        );
        assert_eq!(
            apply(r#"["a\tb", "c\"d", 3] | @tsv, @csv"#, RUN).unwrap(),
            "a\\tb\tc\"d\t3\n\"a\tb\",\"c\"\"d\",3\n"
        );
        assert_eq!(apply(r#".runId | @base64"#, RUN).unwrap(), "cnVuLTE=\n");
        assert_eq!(apply(".forks | length", RUN).unwrap(), "2\n");
        assert_eq!(apply(".nope", RUN).unwrap(), "null\n");
    }

    #[test]
    fn a_bad_expression_says_where_and_a_failing_one_says_why() {
        let e = check(".forks[").unwrap_err();
        assert!(e.contains("expected"), "{e}");
        let e = check("nosuchfunction").unwrap_err();
        assert!(
            e.contains("undefined") && e.contains("nosuchfunction"),
            "{e}"
        );
        let e = apply(".runId[0]", RUN).unwrap_err().to_string();
        assert!(e.starts_with("--jq: cannot index"), "{e}");
    }
}
