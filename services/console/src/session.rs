//! The visitor's session: the API key cookie, the CSRF token, and the headers every
//! response carries.
//!
//! CSRF is a double submit: a random token in an http-only cookie, repeated in every
//! form; a POST whose field differs from its cookie is refused. With `SameSite=Strict`
//! on both cookies another site's form reaches us without them anyway; the token also
//! covers browsers and proxies that ignore SameSite.

use crate::{AppState, ConsoleError, gateway::ApiKey};
use axum::{
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, header},
    middleware::Next,
    response::Response,
};

pub const KEY_COOKIE: &str = "fy_key";
pub const CSRF_COOKIE: &str = "fy_csrf";

/// No inline script or style, nothing from elsewhere, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'";

/// What a handler knows of its visitor.
#[derive(Clone, Debug)]
pub struct Session {
    pub key: Option<ApiKey>,
    pub csrf: String,
    /// Set-Cookie carries `Secure`.
    pub secure: bool,
}

impl Session {
    /// Refuse a form whose token is not this session's.
    pub fn check_csrf(&self, submitted: &str) -> Result<(), ConsoleError> {
        if !submitted.is_empty() && constant_time_eq(submitted.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(ConsoleError::Csrf)
        }
    }

    /// A `Set-Cookie` value for `name`; `None` clears it.
    pub fn cookie(&self, name: &str, value: Option<&str>) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        match value {
            Some(v) => format!("{name}={v}; Path=/; HttpOnly; SameSite=Strict{secure}"),
            None => format!("{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}"),
        }
    }
}

/// A form body (`application/x-www-form-urlencoded`) as `T`.
pub fn parse_form<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ConsoleError> {
    serde_urlencoded::from_bytes(body).map_err(|e| ConsoleError::BadRequest(format!("form: {e}")))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

fn new_token() -> String {
    // Two v4 ids: 244 bits from the OS's random source.
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Middleware: the session in the request's extensions (a new CSRF token when the
/// visitor has none), and the security headers on every response.
pub async fn layer(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let headers = req.headers();
    let secure = state.secure_cookies
        || headers
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let existing = cookie(headers, CSRF_COOKIE)
        .filter(|t| t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned);
    let fresh = existing.is_none();
    let session = Session {
        key: cookie(headers, KEY_COOKIE).and_then(ApiKey::parse),
        csrf: existing.unwrap_or_else(new_token),
        secure,
    };
    let set_csrf = fresh.then(|| session.cookie(CSRF_COOKIE, Some(&session.csrf)));
    req.extensions_mut().insert(session);
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    if let Some(c) = set_csrf.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.append(header::SET_COOKIE, c);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Pages hold a tenant's data: never kept by a shared cache.
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session {
            key: None,
            csrf: "ab".repeat(32),
            secure: false,
        }
    }

    #[test]
    fn csrf_must_match_the_cookie() {
        let s = session();
        assert!(s.check_csrf(&"ab".repeat(32)).is_ok());
        assert!(s.check_csrf("").is_err());
        assert!(s.check_csrf(&"ac".repeat(32)).is_err());
        assert!(s.check_csrf("ab").is_err());
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_over_https() {
        let mut s = session();
        let c = s.cookie(KEY_COOKIE, Some("k"));
        assert!(
            c.contains("HttpOnly") && c.contains("SameSite=Strict"),
            "{c}"
        );
        assert!(!c.contains("Secure"), "{c}");
        s.secure = true;
        assert!(s.cookie(KEY_COOKIE, None).ends_with("; Secure"));
        assert!(s.cookie(KEY_COOKIE, None).contains("Max-Age=0"));
    }

    #[test]
    fn finds_a_cookie_among_several() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, "a=1; fy_key=fyk_x".parse().unwrap());
        h.append(header::COOKIE, "fy_csrf=t".parse().unwrap());
        assert_eq!(cookie(&h, KEY_COOKIE), Some("fyk_x"));
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("t"));
        assert_eq!(cookie(&h, "b"), None);
    }
}
