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
use forkyard_proto::{
    gateway::v1::BackendShare,
    sandbox::v1::{BackendOffer, ListBackendsRequest, ListBackendsResponse},
};
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
type Answer = (Instant, ListBackendsResponse);

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
        self.resolve_as("backend", tenant, asked).await
    }

    /// A run over several backends: each entry resolved as `backend` is, the refusal
    /// naming `backends[i].name`.
    pub async fn resolve_list(
        &self,
        tenant: &str,
        asked: &[BackendShare],
    ) -> Result<Vec<BackendShare>, GatewayError> {
        let mut list = Vec::with_capacity(asked.len());
        for (i, b) in asked.iter().enumerate() {
            let field = format!("backends[{i}].name");
            list.push(BackendShare {
                name: self.resolve_as(&field, tenant, &b.name).await?,
                max_concurrent: b.max_concurrent,
            });
        }
        Ok(list)
    }

    async fn resolve_as(
        &self,
        field: &str,
        tenant: &str,
        asked: &str,
    ) -> Result<String, GatewayError> {
        let name = match asked.trim() {
            "" => self.default.as_str(),
            n => n,
        };
        if let Some(allowed) = self.tenants.get(tenant).or_else(|| self.tenants.get("*"))
            && !allowed.iter().any(|a| a == name)
        {
            return Err(GatewayError::PermissionDenied(format!(
                "{field}: {name} is outside tenant {tenant}'s backends ({}; {TENANT_SETTING})",
                allowed.join(", ")
            )));
        }
        let offered = match self.offered().await {
            Ok(answer) => answer.backends,
            // The provisioners never answered: the operator's default is taken on trust
            // (its creates fail, saying why, if it is not there after all).
            Err(_) if name == self.default => return Ok(name.to_owned()),
            Err(e) => return Err(e),
        };
        if offered.iter().any(|o| o == name) {
            return Ok(name.to_owned());
        }
        Err(GatewayError::field(
            field,
            format!(
                "{name} is not offered by this mesh's provisioners (they offer: {})",
                offered.join(", ")
            ),
        ))
    }

    /// Whether `backend` can give a sandbox `isolation` (non-empty), as its provisioners
    /// said: a level they have but cannot give here (gVisor where runsc cannot run) is
    /// FAILED_PRECONDITION with their reason, at launch rather than at every fork's
    /// create. Provisioners that say nothing of isolation (earlier builds), or that
    /// cannot be asked, leave it to each create, which refuses the same way.
    pub async fn check_isolation(
        &self,
        backend: &str,
        isolation: &str,
    ) -> Result<(), GatewayError> {
        let Ok(answer) = self.offered().await else {
            return Ok(());
        };
        let Some(offer) = answer.offers.iter().find(|o| o.name == backend) else {
            return Ok(());
        };
        refuse_isolation(offer, isolation)
    }

    /// What the provisioners offer: asked at most every [`FRESH`], the last answer when
    /// they cannot be asked, UNAVAILABLE when they never answered.
    async fn offered(&self) -> Result<ListBackendsResponse, GatewayError> {
        let Some(o) = &self.offered else {
            return Ok(ListBackendsResponse {
                backends: vec![self.default.clone()],
                offers: Vec::new(),
            });
        };
        let last = o
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some((at, answer)) = &last
            && at.elapsed() < FRESH
        {
            return Ok(answer.clone());
        }
        let mut client = o.sandboxes.creates();
        let asked =
            tokio::time::timeout(ASK_DEADLINE, client.list_backends(ListBackendsRequest {}));
        match asked.await {
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                *o.last.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), answer.clone()));
                Ok(answer)
            }
            failed => {
                let why = match failed {
                    Ok(Err(s)) => s.message().to_owned(),
                    _ => "no answer within 3 s".to_owned(),
                };
                tracing::warn!(error = %why, "provisioners not asked which backends they offer");
                last.map(|(_, answer)| answer).ok_or_else(|| {
                    GatewayError::Unavailable(format!(
                        "backend: the sandbox provisioners cannot be asked which backends they offer: {why}"
                    ))
                })
            }
        }
    }
}

/// `isolation` on a backend whose provisioners answered `offer`: given, or refused with
/// their reason (FAILED_PRECONDITION naming `isolation`); a level the backend does not
/// know at all is the launch checks' to refuse.
fn refuse_isolation(offer: &BackendOffer, isolation: &str) -> Result<(), GatewayError> {
    if isolation.is_empty() || offer.isolations.iter().any(|i| i == isolation) {
        return Ok(());
    }
    match offer.unavailable.get(isolation) {
        Some(why) => Err(GatewayError::FailedPrecondition(format!(
            "isolation: {isolation} is not available on the {} backend: {why}",
            offer.name
        ))),
        None => Ok(()),
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

    /// gVisor where the provisioners said runsc cannot run: FAILED_PRECONDITION with
    /// their reason; offered, unsaid, or not asked for: taken.
    #[test]
    fn an_isolation_the_backend_cannot_give_is_refused_with_its_reason() {
        let offer = BackendOffer {
            name: "local".into(),
            isolations: vec!["bubblewrap".into()],
            unavailable: [("gvisor".to_owned(), "runsc: not found".to_owned())].into(),
        };
        let s = tonic::Status::from(refuse_isolation(&offer, "gvisor").unwrap_err());
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            s.message(),
            "isolation: gvisor is not available on the local backend: runsc: not found"
        );
        assert!(refuse_isolation(&offer, "bubblewrap").is_ok());
        assert!(refuse_isolation(&offer, "").is_ok());
        let unsaid = BackendOffer {
            unavailable: Default::default(),
            ..offer
        };
        assert!(refuse_isolation(&unsaid, "gvisor").is_ok());
    }
}
