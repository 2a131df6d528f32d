//! Admission: a gateway-wide cap on calls in flight (beyond it calls are shed at once
//! with RESOURCE_EXHAUSTED, never queued into a hang), then per tenant a token-bucket
//! rate and a cap on its calls in flight, so one tenant's flood is refused while the
//! others go on.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

#[derive(Debug, Clone, Copy)]
pub struct LimitConfig {
    /// Calls per second a tenant may sustain.
    pub tenant_rate: f64,
    /// Calls a tenant may make at once above its rate (bucket size).
    pub tenant_burst: u32,
    /// Calls of one tenant in flight at once.
    pub tenant_concurrency: u32,
    /// Calls in flight at once over all tenants before shedding.
    pub max_in_flight: u32,
    /// WatchRun streams one tenant may hold open (each polls Temporal while it lasts).
    pub tenant_watches: u32,
}

impl Default for LimitConfig {
    fn default() -> Self {
        Self {
            tenant_rate: 50.0,
            tenant_burst: 100,
            tenant_concurrency: 64,
            max_in_flight: 1024,
            tenant_watches: 32,
        }
    }
}

struct Bucket {
    tokens: f64,
    last: Instant,
    in_flight: Arc<Semaphore>,
}

pub struct Limiter {
    cfg: LimitConfig,
    global: Arc<Semaphore>,
    tenants: Mutex<HashMap<String, Bucket>>,
    watches: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Held while a call runs; dropping it frees the slots.
#[derive(Debug)]
pub struct Admission {
    _global: OwnedSemaphorePermit,
    _tenant: OwnedSemaphorePermit,
}

impl Limiter {
    pub fn new(cfg: LimitConfig) -> Self {
        Self {
            global: Arc::new(Semaphore::new(cfg.max_in_flight as usize)),
            cfg,
            tenants: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for one open WatchRun stream of `tenant`, held until the stream ends.
    pub fn watch_slot(&self, tenant: &str) -> Result<OwnedSemaphorePermit, Status> {
        let slots = {
            let mut w = self.watches.lock().unwrap_or_else(|p| p.into_inner());
            w.entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.cfg.tenant_watches as usize)))
                .clone()
        };
        slots.try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "tenant {tenant}: {} WatchRun streams already open, close one first",
                self.cfg.tenant_watches
            ))
        })
    }

    /// A slot in the gateway, or RESOURCE_EXHAUSTED when it is saturated.
    pub fn shed(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.global.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted("gateway saturated: too many calls in flight, retry later")
        })
    }

    /// Admit one call of `tenant` holding the gateway slot `global`.
    pub fn admit(&self, tenant: &str, global: OwnedSemaphorePermit) -> Result<Admission, Status> {
        let in_flight = {
            let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let b = tenants.entry(tenant.to_owned()).or_insert_with(|| Bucket {
                tokens: f64::from(self.cfg.tenant_burst),
                last: now,
                in_flight: Arc::new(Semaphore::new(self.cfg.tenant_concurrency as usize)),
            });
            let refill = now.duration_since(b.last).as_secs_f64() * self.cfg.tenant_rate;
            b.tokens = (b.tokens + refill).min(f64::from(self.cfg.tenant_burst));
            b.last = now;
            if b.tokens < 1.0 {
                return Err(Status::resource_exhausted(format!(
                    "tenant {tenant}: rate limit of {} calls/s exceeded, retry later",
                    self.cfg.tenant_rate
                )));
            }
            b.tokens -= 1.0;
            b.in_flight.clone()
        };
        let permit = in_flight.try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(format!(
                "tenant {tenant}: {} calls already in flight, retry later",
                self.cfg.tenant_concurrency
            ))
        })?;
        Ok(Admission {
            _global: global,
            _tenant: permit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flooding_tenant_is_refused_while_another_goes_on() {
        let l = Limiter::new(LimitConfig {
            tenant_rate: 1.0,
            tenant_burst: 3,
            tenant_concurrency: 10,
            max_in_flight: 100,
            tenant_watches: 1,
        });
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(l.admit("a", l.shed().unwrap()).unwrap());
        }
        let err = l.admit("a", l.shed().unwrap()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("tenant a"), "{}", err.message());
        assert!(l.admit("b", l.shed().unwrap()).is_ok());
    }

    #[test]
    fn concurrency_and_saturation_are_refused_not_queued() {
        let l = Limiter::new(LimitConfig {
            tenant_rate: 1000.0,
            tenant_burst: 1000,
            tenant_concurrency: 2,
            max_in_flight: 3,
            tenant_watches: 1,
        });
        let a1 = l.admit("a", l.shed().unwrap()).unwrap();
        let _a2 = l.admit("a", l.shed().unwrap()).unwrap();
        let err = l.admit("a", l.shed().unwrap()).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        let _b1 = l.admit("b", l.shed().unwrap()).unwrap();
        // Three in flight: the gateway sheds everyone now.
        assert_eq!(l.shed().unwrap_err().code(), tonic::Code::ResourceExhausted);
        drop(a1);
        assert!(l.admit("a", l.shed().unwrap()).is_ok());
    }

    #[test]
    fn open_watch_streams_are_capped_per_tenant() {
        let l = Limiter::new(LimitConfig {
            tenant_watches: 2,
            ..LimitConfig::default()
        });
        let w1 = l.watch_slot("a").unwrap();
        let _w2 = l.watch_slot("a").unwrap();
        assert_eq!(
            l.watch_slot("a").unwrap_err().code(),
            tonic::Code::ResourceExhausted
        );
        assert!(l.watch_slot("b").is_ok());
        drop(w1);
        assert!(l.watch_slot("a").is_ok());
    }
}
