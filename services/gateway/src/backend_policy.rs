//! Where a run's sandboxes are made (`LaunchRunRequest.backend`): the operator's default
//! when the run names none, a backend the tenant may use, and one the provisioners offer.
//!
//! What the provisioners offer is theirs to say: they hold the backends' credentials
//! (an E2B API key), so a provisioner without one does not offer e2b, and a setting of
//! the gateway's own would drift from theirs. The gateway asks one replica
//! (`SandboxProvisioner.ListBackends`, through the balanced channel its creates use:
//! the replicas of one deployment share their configuration) and keeps the answer for
//! [`FRESH`]; when no replica answers, the last answer stands, and without one only the
//! operator's default is taken (a launch does not fail because a provisioner restarts;
//! nothing but the default is ever accepted unconfirmed).

use crate::{activities::sandboxes::SandboxLocal, error::GatewayError};
use forkyard_proto::sandbox::v1::ListBackendsRequest;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

pub const DEFAULT_SETTING: &str = "--default-backend (FORKYARD_DEFAULT_BACKEND)";
pub const TENANT_SETTING: &str = "--tenant-backends (FORKYARD_TENANT_BACKENDS)";
/// How long the provisioners' answer is used before they are asked again.
const FRESH: Duration = Duration::from_secs(15);
/// Longest the question may take at a launch.
const ASK_DEADLINE: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub struct BackendPolicy {
    default: String,
    /// Per tenant (`*`: every tenant not named) the backends its runs may use; empty:
    /// every tenant may use every backend offered.
    tenants: BTreeMap<String, Vec<String>>,
    offered: Option<Offered>,
}

impl Default for BackendPolicy {
    /// Local for everyone, nothing asked (only the default is accepted).
    fn default() -> Self {
        Self {
            default: "local".to_owned(),
            tenants: BTreeMap::new(),
            offered: None,
        }
    }
}

/// When the provisioners answered, and what they offer.
type Answer = (Instant, Vec<String>);

/// The provisioners' answer, asked again once older than [`FRESH`].
#[derive(Clone)]
struct Offered {
    sandboxes: SandboxLocal,
    last: Arc<Mutex<Option<Answer>>>,
}

impl std::fmt::Debug for Offered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offered").finish_non_exhaustive()
    }
}

fn known(name: &str) -> bool {
    forkyard_proto::BACKENDS.contains(&name)
}

impl BackendPolicy {
    /// From the settings: the default backend and `tenant=local,e2b;*=local`.
    pub fn from_settings(default: &str, tenants: Option<&str>) -> Result<Self, String> {
        let default = default.trim().to_owned();
        if !known(&default) {
            return Err(format!(
                "{DEFAULT_SETTING}: {default:?} is not a backend (one of: {})",
                forkyard_proto::BACKENDS.join(", ")
            ));
        }
        let tenants = match tenants {
            Some(text) => crate::egress_policy::parse_map(TENANT_SETTING, text)?,
            None => BTreeMap::new(),
        };
        for (tenant, names) in &tenants {
            if let Some(bad) = names.iter().find(|n| !known(n)) {
                return Err(format!(
                    "{TENANT_SETTING}: tenant {tenant}: {bad:?} is not a backend"
                ));
            }
        }
        Ok(Self {
            default,
            tenants,
            offered: None,
        })
    }

    /// Ask these provisioners what they offer.
    #[must_use]
    pub fn asking(mut self, sandboxes: SandboxLocal) -> Self {
        self.offered = Some(Offered {
            sandboxes,
            last: Arc::default(),
        });
        self
    }

    pub fn default_backend(&self) -> &str {
        &self.default
    }

    /// The backend `tenant`'s run asked for (`asked`, checked by `validate`; empty: the
    /// default), or why not: outside the tenant's policy PERMISSION_DENIED, not offered
    /// by the provisioners INVALID_ARGUMENT, both naming `backend`.
    pub async fn resolve(&self, tenant: &str, asked: &str) -> Result<String, GatewayError> {
        let name = match asked.trim() {
            "" => self.default.as_str(),
            n => n,
        };
        if let Some(allowed) = self.tenants.get(tenant).or_else(|| self.tenants.get("*"))
            && !allowed.iter().any(|a| a == name)
        {
            return Err(GatewayError::PermissionDenied(format!(
                "backend: {name} is outside tenant {tenant}'s backends ({}; {TENANT_SETTING})",
                allowed.join(", ")
            )));
        }
        let offered = match self.offered().await {
            Ok(offered) => offered,
            // The provisioners never answered: the operator's default is taken on trust
            // (its creates fail, saying why, if it is not there after all).
            Err(_) if name == self.default => return Ok(name.to_owned()),
            Err(e) => return Err(e),
        };
        if offered.iter().any(|o| o == name) {
            return Ok(name.to_owned());
        }
        Err(GatewayError::field(
            "backend",
            format!(
                "{name} is not offered by this mesh's provisioners (they offer: {})",
                offered.join(", ")
            ),
        ))
    }

    /// What the provisioners offer: asked at most every [`FRESH`], the last answer when
    /// they cannot be asked, UNAVAILABLE when they never answered.
    async fn offered(&self) -> Result<Vec<String>, GatewayError> {
        let Some(o) = &self.offered else {
            return Ok(vec![self.default.clone()]);
        };
        let last = o
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((at, names)) = &last
            && at.elapsed() < FRESH
        {
            return Ok(names.clone());
        }
        let mut client = o.sandboxes.creates();
        let asked =
            tokio::time::timeout(ASK_DEADLINE, client.list_backends(ListBackendsRequest {}));
        match asked.await {
            Ok(Ok(answer)) => {
                let names = answer.into_inner().backends;
                *o.last.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), names.clone()));
                Ok(names)
            }
            failed => {
                let why = match failed {
                    Ok(Err(s)) => s.message().to_owned(),
                    _ => "no answer within 3 s".to_owned(),
                };
                tracing::warn!(error = %why, "provisioners not asked which backends they offer");
                last.map(|(_, names)| names).ok_or_else(|| {
                    GatewayError::Unavailable(format!(
                        "backend: the sandbox provisioners cannot be asked which backends they offer: {why}"
                    ))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn code(r: Result<String, GatewayError>) -> (Code, String) {
        let s = tonic::Status::from(r.unwrap_err());
        (s.code(), s.message().to_owned())
    }

    #[tokio::test]
    async fn empty_is_the_default_and_a_tenant_policy_bounds_the_rest() {
        let p = BackendPolicy::from_settings("local", Some("team-a=local,e2b;*=local")).unwrap();
        assert_eq!(p.resolve("team-b", "").await.unwrap(), "local");
        let (c, m) = code(p.resolve("team-b", "e2b").await);
        assert_eq!(c, Code::PermissionDenied);
        assert!(
            m.starts_with("backend: e2b is outside tenant team-b's"),
            "{m}"
        );
        // Allowed, but nobody asked the provisioners: only the default is offered.
        let (c, m) = code(p.resolve("team-a", "e2b").await);
        assert_eq!(c, Code::InvalidArgument);
        assert!(m.starts_with("backend: e2b is not offered"), "{m}");
    }

    #[test]
    fn settings_name_what_is_wrong() {
        let e = BackendPolicy::from_settings("k8s", None).unwrap_err();
        assert!(
            e.contains("FORKYARD_DEFAULT_BACKEND") && e.contains("k8s"),
            "{e}"
        );
        let e = BackendPolicy::from_settings("local", Some("a=local,kata")).unwrap_err();
        assert!(
            e.contains("FORKYARD_TENANT_BACKENDS") && e.contains("kata"),
            "{e}"
        );
        let p = BackendPolicy::from_settings(" e2b ", None).unwrap();
        assert_eq!(p.default_backend(), "e2b");
    }
}
