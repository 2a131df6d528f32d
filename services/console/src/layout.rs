//! The page every view sits in.

use crate::session::Session;
use maud::{DOCTYPE, Markup, html};

/// A whole page. `session` (absent on error pages made before one is known) adds the
/// sign-out button for a visitor with a key.
pub fn page(title: &str, session: Option<&Session>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Forkyard" }
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/runs" { "Forkyard" }
                    nav aria-label="main" { a href="/runs" { "Runs" } }
                    @if let Some(s) = session.filter(|s| s.key.is_some()) {
                        form.signout method="post" action="/logout" {
                            (csrf_field(s))
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" { (body) }
            }
        }
    }
}

/// The hidden CSRF field of every form.
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}
