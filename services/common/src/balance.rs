//! Calls spread over a peer's replicas by how busy each one is.
//!
//! Every replica has its own lazily connected channel, which queues calls while it
//! connects: a burst made right after start-up (a wave's creates) spreads over every
//! replica instead of going to whichever connection happened to come up first, as
//! tonic's balance channel does (its replicas count as equally loaded and only a
//! connected one can be picked). A call goes to the replica with the fewest calls in
//! flight — a stream counts until its body ends — ties taken in turn; a replica whose
//! connection just failed is passed over for a second while others are there.

use http_body::{Body as HttpBody, Frame};
use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Instant,
};
use tonic::{body::Body, transport::Channel};
use tower::{Service, ServiceExt as _};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a replica whose connection failed is passed over, in milliseconds.
const PASS_OVER_MS: u64 = 1_000;

/// One channel over one or several replicas (see the module docs); clones share them.
#[derive(Clone)]
pub struct Balanced {
    shared: Arc<Shared>,
}

struct Shared {
    /// What the replicas are called in errors (the setting or the address).
    name: String,
    members: RwLock<Arc<Vec<Member>>>,
    turn: AtomicUsize,
    epoch: Instant,
}

/// A [`Balanced`] that is gone once its last user is.
pub(crate) struct Weak(std::sync::Weak<Shared>);

impl Weak {
    pub(crate) fn upgrade(&self) -> Option<Balanced> {
        self.0.upgrade().map(|shared| Balanced { shared })
    }
}

fn ms_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[derive(Clone)]
struct Member {
    url: String,
    channel: Channel,
    in_flight: Arc<AtomicUsize>,
    /// Milliseconds since `epoch` until which this replica is passed over.
    failed_until: Arc<AtomicU64>,
}

impl Member {
    fn new(url: String, channel: Channel) -> Self {
        Self {
            url,
            channel,
            in_flight: Arc::default(),
            failed_until: Arc::default(),
        }
    }
}

impl std::fmt::Debug for Balanced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balanced")
            .field("name", &self.shared.name)
            .field("replicas", &self.urls())
            .finish()
    }
}

impl From<Channel> for Balanced {
    fn from(channel: Channel) -> Self {
        let b = Self::empty("the peer");
        *b.shared
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(vec![Member::new(String::new(), channel)]);
        b
    }
}

impl Balanced {
    /// No replica yet; calls fail `UNAVAILABLE` naming `name` until [`Self::set`].
    pub fn empty(name: &str) -> Self {
        Self {
            shared: Arc::new(Shared {
                name: name.to_owned(),
                members: RwLock::new(Arc::new(Vec::new())),
                turn: AtomicUsize::new(0),
                epoch: Instant::now(),
            }),
        }
    }

    /// The replicas now, by URL: a URL already known keeps its connection and count.
    pub fn set(&self, replicas: Vec<(String, Channel)>) {
        let mut members = self
            .shared
            .members
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let next = replicas
            .into_iter()
            .map(|(url, channel)| {
                members
                    .iter()
                    .find(|m| m.url == url)
                    .cloned()
                    .unwrap_or_else(|| Member::new(url, channel))
            })
            .collect();
        *members = Arc::new(next);
    }

    /// A handle that does not keep the channel alive (the discovery task's).
    pub(crate) fn downgrade(&self) -> Weak {
        Weak(Arc::downgrade(&self.shared))
    }

    /// The URLs of the replicas now.
    pub fn urls(&self) -> Vec<String> {
        self.members().iter().map(|m| m.url.clone()).collect()
    }

    fn members(&self) -> Arc<Vec<Member>> {
        self.shared
            .members
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn now_ms(&self) -> u64 {
        ms_since(self.shared.epoch)
    }

    /// The least busy replica, ties in turn; one that just failed only if all did.
    fn pick(&self) -> Option<Member> {
        let members = self.members();
        let n = members.len();
        if n <= 1 {
            return members.first().cloned();
        }
        let start = self.shared.turn.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        (0..n)
            .map(|i| &members[(start + i) % n])
            .min_by_key(|m| {
                let failed = m.failed_until.load(Ordering::Relaxed) > now;
                (failed, m.in_flight.load(Ordering::Relaxed))
            })
            .cloned()
    }
}

impl Service<http::Request<Body>> for Balanced {
    type Response = http::Response<Counted>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each replica's channel is made ready inside the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let Some(member) = self.pick() else {
            let name = self.shared.name.clone();
            return Box::pin(async move {
                Err(tonic::Status::unavailable(format!("no replica of {name} is known yet")).into())
            });
        };
        let guard = InFlight::enter(member.in_flight.clone());
        let epoch = self.shared.epoch;
        Box::pin(async move {
            let mut channel = member.channel;
            let result = match channel.ready().await {
                Ok(ready) => ready.call(req).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(resp) => Ok(resp.map(|inner| Counted {
                    inner,
                    _guard: guard,
                })),
                Err(e) => {
                    member
                        .failed_until
                        .store(ms_since(epoch) + PASS_OVER_MS, Ordering::Relaxed);
                    Err(e.into())
                }
            }
        })
    }
}

/// One call in flight on a replica, until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its call counted until it ends or is dropped.
pub struct Counted {
    inner: Body,
    _guard: InFlight,
}

impl HttpBody for Counted {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    async fn server() -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (_reporter, health) = tonic_health::server::health_reporter();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(health)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        (url, task)
    }

    fn lazy(url: &str) -> Channel {
        tonic::transport::Endpoint::from_shared(url.to_owned())
            .unwrap()
            .connect_lazy()
    }

    #[tokio::test]
    async fn a_burst_on_fresh_connections_reaches_every_replica() {
        let mut urls = Vec::new();
        for _ in 0..3 {
            urls.push(server().await.0);
        }
        let b = Balanced::empty("test peer");
        b.set(urls.iter().map(|u| (u.clone(), lazy(u))).collect());
        // Count the picks of twelve calls started at once, none connected yet.
        let mut picked = std::collections::BTreeMap::<String, usize>::new();
        let mut calls = Vec::new();
        for _ in 0..12 {
            let m = b.pick().unwrap();
            *picked.entry(m.url.clone()).or_default() += 1;
            let guard = InFlight::enter(m.in_flight.clone());
            calls.push(guard);
        }
        assert_eq!(picked.len(), 3, "{picked:?}");
        assert!(picked.values().all(|n| *n == 4), "{picked:?}");
        drop(calls);
        // And real calls through it succeed.
        for _ in 0..6 {
            let mut client = HealthClient::new(b.clone());
            client
                .check(HealthCheckRequest::default())
                .await
                .expect("health check through the balanced channel");
        }
        assert!(
            b.members()
                .iter()
                .all(|m| m.in_flight.load(Ordering::Relaxed) == 0)
        );
    }

    #[tokio::test]
    async fn a_replica_that_refuses_connections_is_passed_over() {
        let (up, _task) = server().await;
        let down = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        }; // closed: connections are refused
        let b = Balanced::empty("test peer");
        b.set(vec![(down.clone(), lazy(&down)), (up.clone(), lazy(&up))]);
        let mut failures = 0;
        for _ in 0..10 {
            let mut client = HealthClient::new(b.clone());
            if client.check(HealthCheckRequest::default()).await.is_err() {
                failures += 1;
            }
        }
        assert_eq!(
            failures, 1,
            "the refused replica is tried once, then passed over"
        );
    }

    #[tokio::test]
    async fn no_replica_is_unavailable_naming_the_peer() {
        let b = Balanced::empty("--ledger-addr (FORKYARD_LEDGER_ADDR)");
        let err = HealthClient::new(b)
            .check(HealthCheckRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("FORKYARD_LEDGER_ADDR"), "{err:?}");
    }

    #[tokio::test]
    async fn a_replica_kept_across_updates_keeps_its_count() {
        let b = Balanced::empty("p");
        b.set(vec![("http://a:1".into(), lazy("http://a:1"))]);
        let m = b.pick().unwrap();
        let _call = InFlight::enter(m.in_flight.clone());
        b.set(vec![
            ("http://a:1".into(), lazy("http://a:1")),
            ("http://b:1".into(), lazy("http://b:1")),
        ]);
        assert_eq!(b.urls(), ["http://a:1", "http://b:1"]);
        assert_eq!(b.members()[0].in_flight.load(Ordering::Relaxed), 1);
        assert_eq!(
            b.pick().unwrap().url,
            "http://b:1",
            "the idle replica is picked"
        );
    }
}
