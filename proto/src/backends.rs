//! A run's backends as people write them (`forkyard fork --backend`, the console's
//! form): one name (`e2b`), or a list with shares (`local:40,e2b`). The names are
//! checked against [`BACKENDS`](crate::BACKENDS) here; the gateway checks the rest (each
//! name once, a share on every entry but the last, the tenant's policy).

use crate::gateway::v1::BackendShare;

/// `text` as LaunchRun takes it: one backend (`backend`, empty for the operator's
/// default), or a list with shares (`backends`) once it has a comma or a share.
pub fn parse(text: &str) -> Result<(String, Vec<BackendShare>), String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok((String::new(), Vec::new()));
    }
    let mut list = Vec::new();
    for entry in text.split(',') {
        let (name, share) = entry.split_once(':').unwrap_or((entry, ""));
        let name = name.trim();
        if !crate::BACKENDS.contains(&name) {
            return Err(format!(
                "{name:?}: one of: {}, or a list such as local:40,e2b",
                crate::BACKENDS.join(", ")
            ));
        }
        let max_concurrent = match share.trim() {
            "" => 0,
            n => n
                .parse()
                .map_err(|_| format!("{entry:?}: a share is a number of forks (local:40)"))?,
        };
        list.push(BackendShare {
            name: name.to_owned(),
            max_concurrent,
        });
    }
    if text.contains([',', ':']) {
        Ok((String::new(), list))
    } else {
        Ok((text.to_owned(), Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_a_list_with_shares_or_why_not() {
        assert_eq!(parse(" e2b ").unwrap(), ("e2b".into(), vec![]));
        assert_eq!(parse("").unwrap(), (String::new(), vec![]));
        let (one, list) = parse("local:40, e2b").unwrap();
        assert_eq!(one, "");
        let shares: Vec<(&str, u32)> = list
            .iter()
            .map(|b| (b.name.as_str(), b.max_concurrent))
            .collect();
        assert_eq!(shares, [("local", 40), ("e2b", 0)]);
        assert!(
            parse("modal")
                .unwrap_err()
                .starts_with("\"modal\": one of: local, e2b")
        );
        assert!(
            parse("local:x,e2b")
                .unwrap_err()
                .contains("a share is a number")
        );
        assert!(parse("local:2,modal").unwrap_err().starts_with("\"modal\""));
    }
}
