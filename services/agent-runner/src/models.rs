//! Model configuration: aliases (`sonnet` → a model id) and the price table, built in
//! and overridable from a JSON file (`--models-file`, `FORKYARD_MODELS_FILE`).
//!
//! ```json
//! { "aliases": { "sonnet": "claude-sonnet-4-5" },
//!   "prices": { "claude-sonnet-4-5": { "input": 3.0, "output": 15.0,
//!                                      "cache_read": 0.3, "cache_write": 3.75 } },
//!   "default_price": { "input": 3.0, "output": 15.0 } }
//! ```
//! Prices are US dollars per million tokens. A file's entries are added to (and replace)
//! the built-in ones.

use forkyard_proto::common::v1::Usage;
use serde::Deserialize;
use std::{collections::BTreeMap, path::Path};

/// USD per million tokens, per kind of token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cache_read: f64,
    pub cache_write: f64,
}

impl Price {
    const fn new(input: f64, output: f64, cache_read: f64, cache_write: f64) -> Self {
        Self {
            input,
            output,
            cache_read,
            cache_write,
        }
    }

    /// What `usage` costs in micro-USD, rounded up (a fraction of a micro-dollar is
    /// still spend).
    pub fn cost_micros(&self, usage: &Usage) -> i64 {
        // micro-USD = tokens × (USD per MTok) × 1e6 / 1e6 = tokens × USD per MTok.
        let micro = usage.input_tokens as f64 * self.input
            + usage.output_tokens as f64 * self.output
            + usage.cache_read_tokens as f64 * self.cache_read
            + usage.cache_write_tokens as f64 * self.cache_write;
        forkyard_proto::Usd::charged(micro).micros()
    }

    fn valid(&self) -> bool {
        [self.input, self.output, self.cache_read, self.cache_write]
            .iter()
            .all(|p| p.is_finite() && *p >= 0.0 && *p < 1e6)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct ModelsFile {
    aliases: BTreeMap<String, String>,
    prices: BTreeMap<String, Price>,
    default_price: Option<Price>,
}

#[derive(Debug, Clone)]
pub struct Models {
    pub aliases: BTreeMap<String, String>,
    prices: BTreeMap<String, Price>,
    /// For models the table does not list (a local vLLM model costs what you say).
    default_price: Price,
}

impl Default for Models {
    fn default() -> Self {
        let aliases = [
            ("sonnet", "claude-sonnet-4-5"),
            ("opus", "claude-opus-4-1"),
            ("haiku", "claude-haiku-4-5"),
        ];
        let prices = [
            ("claude-sonnet-4-5", Price::new(3.0, 15.0, 0.3, 3.75)),
            ("claude-sonnet-4-0", Price::new(3.0, 15.0, 0.3, 3.75)),
            ("claude-opus-4-1", Price::new(15.0, 75.0, 1.5, 18.75)),
            ("claude-opus-4-0", Price::new(15.0, 75.0, 1.5, 18.75)),
            ("claude-haiku-4-5", Price::new(1.0, 5.0, 0.1, 1.25)),
            ("claude-3-5-haiku-latest", Price::new(0.8, 4.0, 0.08, 1.0)),
            ("gpt-5", Price::new(1.25, 10.0, 0.125, 0.0)),
            ("gpt-5-codex", Price::new(1.25, 10.0, 0.125, 0.0)),
            ("gpt-5-mini", Price::new(0.25, 2.0, 0.025, 0.0)),
            ("gpt-4.1", Price::new(2.0, 8.0, 0.5, 0.0)),
            ("gpt-4.1-mini", Price::new(0.4, 1.6, 0.1, 0.0)),
            ("gpt-4o", Price::new(2.5, 10.0, 1.25, 0.0)),
            ("gpt-4o-mini", Price::new(0.15, 0.6, 0.075, 0.0)),
        ];
        Self {
            aliases: aliases
                .iter()
                .map(|(a, m)| ((*a).to_owned(), (*m).to_owned()))
                .collect(),
            prices: prices.iter().map(|(m, p)| ((*m).to_owned(), *p)).collect(),
            // Unknown models are priced like a mid-range hosted model rather than free,
            // so a budget still means something.
            default_price: Price::new(3.0, 15.0, 0.3, 3.75),
        }
    }
}

impl Models {
    /// The built-in table with a JSON file's entries laid over it.
    pub fn load(path: Option<&Path>) -> Result<Self, String> {
        let mut models = Self::default();
        let Some(path) = path else {
            return Ok(models);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: ModelsFile = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a models file: {e}", path.display()))?;
        for (model, price) in &file.prices {
            if !price.valid() {
                return Err(format!(
                    "{}: prices.{model}: prices must be finite, >= 0 USD per million tokens",
                    path.display()
                ));
            }
        }
        if let Some(p) = file.default_price {
            if !p.valid() {
                return Err(format!("{}: default_price is invalid", path.display()));
            }
            models.default_price = p;
        }
        models.aliases.extend(file.aliases);
        models.prices.extend(file.prices);
        Ok(models)
    }

    /// The model id for `name`: an alias's target, else `name` itself. An empty name is
    /// the `sonnet` alias for Anthropic; OpenAI-compatible servers need an explicit model.
    pub fn resolve(&self, driver: &str, name: &str) -> Result<String, String> {
        let name = name.trim();
        if name.is_empty() {
            return match driver {
                "anthropic" => Ok(self.aliases.get("sonnet").cloned().unwrap_or_default()),
                _ => Err("is empty; the openai driver needs a model name".into()),
            };
        }
        if let Some(id) = self.aliases.get(name) {
            return Ok(id.clone());
        }
        // A bare word that is neither an alias nor a model id shape is almost certainly a
        // typo ("sonet"); real ids carry a digit or a separator.
        let looks_like_id =
            name.contains(['-', '.', ':', '/', '_']) || name.chars().any(|c| c.is_ascii_digit());
        if !looks_like_id {
            let known: Vec<&str> = self.aliases.keys().map(String::as_str).collect();
            return Err(format!(
                "unknown model alias {name:?}; aliases: {}",
                known.join(", ")
            ));
        }
        Ok(name.to_owned())
    }

    /// Whether the table lists `model` (else it is priced at the default).
    pub fn knows(&self, model: &str) -> bool {
        self.prices.contains_key(model)
    }

    pub fn price(&self, model: &str) -> Price {
        self.prices
            .get(model)
            .copied()
            .unwrap_or(self.default_price)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_whole_micro_dollars_rounding_up() {
        let p = Price::new(3.0, 15.0, 0.3, 3.75);
        let u = Usage {
            input_tokens: 1000,
            output_tokens: 200,
            cache_read_tokens: 10,
            cache_write_tokens: 0,
        };
        // 3000 + 3000 + 3 micro-USD
        assert_eq!(p.cost_micros(&u), 6003);
        let tiny = Usage {
            input_tokens: 1,
            ..Default::default()
        };
        assert_eq!(Price::new(0.15, 0.0, 0.0, 0.0).cost_micros(&tiny), 1);
    }

    #[test]
    fn aliases_resolve_and_typos_are_refused() {
        let m = Models::default();
        assert_eq!(
            m.resolve("anthropic", "sonnet").unwrap(),
            "claude-sonnet-4-5"
        );
        assert_eq!(m.resolve("anthropic", "").unwrap(), "claude-sonnet-4-5");
        assert_eq!(m.resolve("openai", "gpt-4o").unwrap(), "gpt-4o");
        assert_eq!(
            m.resolve("openai", "qwen2.5-coder:7b").unwrap(),
            "qwen2.5-coder:7b"
        );
        assert!(
            m.resolve("anthropic", "sonet")
                .unwrap_err()
                .contains("sonnet")
        );
        assert!(m.resolve("openai", "").is_err());
    }

    #[test]
    fn a_file_adds_aliases_and_prices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("models.json");
        std::fs::write(
            &path,
            r#"{"aliases":{"local":"qwen-7b"},"prices":{"qwen-7b":{"input":0.1,"output":0.2}}}"#,
        )
        .unwrap();
        let m = Models::load(Some(&path)).unwrap();
        assert_eq!(m.resolve("openai", "local").unwrap(), "qwen-7b");
        assert_eq!(m.price("qwen-7b").output, 0.2);
        assert_eq!(m.resolve("anthropic", "opus").unwrap(), "claude-opus-4-1");
        std::fs::write(&path, r#"{"prices":{"x":{"input":-1}}}"#).unwrap();
        assert!(Models::load(Some(&path)).is_err());
        std::fs::write(&path, r#"{"aliasez":{}}"#).unwrap();
        assert!(Models::load(Some(&path)).is_err());
    }
}
