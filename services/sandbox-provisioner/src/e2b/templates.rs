//! Which E2B template a sandbox on an image starts from. E2B builds templates from
//! images (`e2b template build` on a Dockerfile) ahead of time; it does not pull an image
//! at create. So the operator names, for each image a run may ask for, the template
//! built from it (`FORKYARD_E2B_TEMPLATES`); an image with no template is refused.

use crate::error::{ProvisionerError, Result};
use std::collections::BTreeMap;

/// Image reference (as a run names it) → E2B template id or alias.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates(BTreeMap<String, String>);

/// `IMAGE=TEMPLATE` items (blank ones ignored); the error names the bad item.
pub fn parse(items: &[String]) -> std::result::Result<Templates, String> {
    let mut map = BTreeMap::new();
    for item in items.iter().map(|i| i.trim()).filter(|i| !i.is_empty()) {
        let Some((image, template)) = item.split_once('=') else {
            return Err(format!("{item:?} is not IMAGE=TEMPLATE"));
        };
        let (image, template) = (image.trim(), template.trim());
        forkyard_common::image_reference::parse(image)?;
        let template_ok = !template.is_empty()
            && template.len() <= 128
            && template
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b));
        if !template_ok {
            return Err(format!("{item:?}: {template:?} is not an E2B template id"));
        }
        if map.insert(image.to_owned(), template.to_owned()).is_some() {
            return Err(format!("{image} is listed twice"));
        }
    }
    Ok(Templates(map))
}

impl Templates {
    /// `None` for no image (the backend's default template); the image's template; or
    /// why the image cannot run here.
    pub fn for_image(&self, image: &str) -> Result<Option<&str>> {
        if image.is_empty() {
            return Ok(None);
        }
        forkyard_common::image_reference::parse(image)
            .map_err(|e| ProvisionerError::invalid("image", e))?;
        self.0.get(image).map(|t| Some(t.as_str())).ok_or_else(|| {
            ProvisionerError::FailedPrecondition(format!(
                "image {image}: no E2B template is built from it here (FORKYARD_E2B_TEMPLATES lists {})",
                if self.0.is_empty() {
                    "none".to_owned()
                } else {
                    self.0.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_map_images_to_templates_and_bad_ones_are_named() {
        let t = parse(&[
            "python:3.12=py312".into(),
            " ghcr.io/acme/node:22@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef = node-22 ".into(),
            "".into(),
        ])
        .unwrap();
        assert_eq!(t.for_image("python:3.12").unwrap(), Some("py312"));
        assert_eq!(t.for_image("").unwrap(), None);
        let e = t.for_image("python:3.13").unwrap_err().to_string();
        assert!(
            e.contains("python:3.13") && e.contains("python:3.12"),
            "{e}"
        );
        assert!(t.for_image("UPPER:case").is_err());
        for bad in ["python", "python:3.12=", "Bad Ref=t", "a=b c", "a=x,a=y"] {
            let items: Vec<String> = bad.split(',').map(String::from).collect();
            assert!(parse(&items).is_err(), "{bad}");
        }
    }
}
