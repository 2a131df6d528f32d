//! The gate: a tower layer in front of the Gateway service that sheds load, authenticates
//! the caller, applies the tenant's limits and passes the [`Tenant`] to the handlers.
//! Refusals are answered here, before any handler (so before anything starts).

use super::{Authenticator, limits::Limiter};
use std::{
    convert::Infallible,
    sync::Arc,
    task::{Context, Poll},
};
use tonic::{
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

#[derive(Clone)]
pub struct GateLayer {
    auth: Arc<Authenticator>,
    limiter: Arc<Limiter>,
}

impl GateLayer {
    pub fn new(auth: Authenticator, limiter: Limiter) -> Self {
        Self {
            auth: Arc::new(auth),
            limiter: Arc::new(limiter),
        }
    }
}

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            auth: self.auth.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    auth: Arc<Authenticator>,
    limiter: Arc<Limiter>,
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for Gate<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        // The ready service goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (auth, limiter) = (self.auth.clone(), self.limiter.clone());
        Box::pin(async move {
            // Shed first: a saturated gateway must not spend a key lookup on the call.
            let slot = match limiter.shed() {
                Ok(s) => s,
                Err(status) => return Ok(status.into_http()),
            };
            let tenant = match auth.authenticate(req.headers()).await {
                Ok(t) => t,
                Err(status) => return Ok(status.into_http()),
            };
            let admission = match limiter.admit(&tenant.name, slot) {
                Ok(a) => a,
                Err(status) => {
                    tracing::warn!(tenant = tenant.name, path = %req.uri().path(), "call refused by tenant limits");
                    return Ok(status.into_http());
                }
            };
            // A WatchRun stream keeps a slot of the tenant's for as long as it is open.
            let watch = if req.uri().path().ends_with("/WatchRun") {
                match limiter.watch_slot(&tenant.name) {
                    Ok(w) => Some(w),
                    Err(status) => return Ok(status.into_http()),
                }
            } else {
                None
            };
            req.extensions_mut().insert(tenant);
            let response = inner.call(req).await;
            drop(admission);
            response.map(|r| {
                let r = undecodable_is_invalid_argument(r);
                match watch {
                    Some(slot) => r.map(|body| {
                        Body::new(HeldOpen {
                            inner: body,
                            _slot: slot,
                        })
                    }),
                    None => r,
                }
            })
        })
    }
}

/// A request body that is not the RPC's message (bytes that are not protobuf, a string
/// field holding invalid UTF-8) is the caller's bad input: INVALID_ARGUMENT with prost's
/// message, which names the field (`LaunchRunRequest.repo: invalid string value: data is
/// not UTF-8 encoded`), rather than tonic's INTERNAL, which reads as a server fault.
fn undecodable_is_invalid_argument(resp: http::Response<Body>) -> http::Response<Body> {
    match tonic::Status::from_header_map(resp.headers()) {
        Some(s)
            if s.code() == tonic::Code::Internal
                && s.message().starts_with("failed to decode Protobuf message") =>
        {
            tonic::Status::invalid_argument(s.message().to_owned()).into_http()
        }
        _ => resp,
    }
}

/// A response body that holds a limiter slot until the body is done (or dropped).
struct HeldOpen {
    inner: Body,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for HeldOpen {
    type Data = tonic::codegen::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
