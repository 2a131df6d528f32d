//! Who is calling: API keys (bearer tokens) mapping to tenants, or, with `--auth none`,
//! everyone as the `default` tenant.
//!
//! The gate (a tower layer around the Gateway service only, so `grpc.health.v1` and
//! reflection stay open for probes) authenticates each call, applies the limits and
//! hands the handlers a [`Tenant`] in the request's extensions.

pub mod config;
pub mod gate;
pub use forkyard_keys as keys;
pub mod limits;

use keys::KeyStore;
use std::collections::HashSet;
use tonic::{Status, codegen::http::HeaderMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Callers send `authorization: Bearer fyk_…` keys made with `forkyard keys create`.
    ApiKey,
    /// No authentication: every call is the `default` tenant's (local use only).
    None,
}

/// The tenant of every call when authentication is off.
pub const DEFAULT_TENANT: &str = "default";

/// What a caller does with a run: an admin tenant (`--admin-tenants`) reads every
/// tenant's runs, and changes only its own (`api::runs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    Read,
    Change,
}

/// The caller, as the gate established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// Authenticated by a key (false: `--auth none`).
    pub authenticated: bool,
    /// May manage the janitor's schedule (every caller when authentication is off).
    pub admin: bool,
}

impl Tenant {
    /// The tenant of an unauthenticated gateway.
    pub fn default_tenant() -> Self {
        Self {
            name: DEFAULT_TENANT.to_owned(),
            authenticated: false,
            admin: true,
        }
    }

    /// The run id for a caller's request id. With keys, request ids are per tenant (two
    /// tenants using the same request id get two runs, and neither learns of the other);
    /// `.` is not in tenant names, so `<tenant>.` cannot be forged by another tenant.
    pub fn run_id_for(&self, request_id: &str) -> String {
        if self.authenticated {
            format!("run-{}.{request_id}", self.name)
        } else {
            format!("run-{request_id}")
        }
    }

    /// The tenant's ledger account (its spending limit); `None` without authentication,
    /// where runs keep stand-alone accounts as before.
    pub fn account_id(&self) -> Option<String> {
        self.authenticated.then(|| format!("tenant-{}", self.name))
    }
}

pub enum Authenticator {
    None,
    Keys {
        store: KeyStore,
        admins: HashSet<String>,
    },
}

impl Authenticator {
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Tenant, Status> {
        let (store, admins) = match self {
            Self::None => return Ok(Tenant::default_tenant()),
            Self::Keys { store, admins } => (store, admins),
        };
        let Some(value) = headers.get("authorization") else {
            return Err(Status::unauthenticated(
                "missing api key: send `authorization: Bearer <key>` (make one with `forkyard keys create`)",
            ));
        };
        let key = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| Status::unauthenticated("authorization: expected `Bearer <api key>`"))?;
        match store.verify(key).await {
            Ok(Some(name)) => Ok(Tenant {
                admin: admins.contains(&name),
                name,
                authenticated: true,
            }),
            // Unknown, malformed and revoked keys look the same to the caller.
            Ok(None) => Err(Status::unauthenticated("invalid or revoked api key")),
            Err(e) => {
                tracing::error!(error = %e, "api key lookup failed");
                Err(Status::unavailable("cannot check api keys right now"))
            }
        }
    }
}
