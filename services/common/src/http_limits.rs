//! Bounds on the mesh's listeners besides gRPC (the metrics pages, the agent runner's
//! LLM gateway, the provisioner's relays): a connection cap, a header read timeout and an
//! idle timeout. Without them 19,985 idle connections to the janitor's metrics port took
//! it to its 20,000-descriptor limit and its gRPC port stopped answering: each connection
//! held a descriptor for as long as its client kept it open.
//!
//! - The cap is a semaphore taken before each accept ([`Slots`]): at the cap the listener
//!   accepts nothing, and new connections wait in the kernel's backlog, holding no
//!   descriptor of the process, until a slot is free.
//! - The header timeout is hyper's `header_read_timeout` ([`http1`]): a request's head
//!   must be in within it of the server being ready for one, the first from the accept,
//!   each next one from the end of the response before; so it is also how long a
//!   kept-alive connection may wait between requests.
//! - The idle timeout ([`Idle`]): a connection on which no byte moves either way for that
//!   long is closed, whatever it is doing (a request body that stops coming, a response
//!   the client stops reading, a relayed connection nobody uses).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once.
    pub max_connections: usize,
    /// How long a request's head may take ([`http1`]).
    pub header_timeout: Duration,
    /// How long a connection may move no byte ([`Idle`]).
    pub idle_timeout: Duration,
}

/// The connection slots of a listener: one is taken before each accept and held until
/// the connection ends.
#[derive(Debug, Clone)]
pub struct Slots(Arc<Semaphore>);

impl Slots {
    pub fn new(max_connections: usize) -> Self {
        Self(Arc::new(Semaphore::new(max_connections)))
    }

    /// A free slot, once there is one.
    pub async fn take(&self) -> OwnedSemaphorePermit {
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("the slots' semaphore is never closed")
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.0.available_permits()
    }
}

/// A connection closed (reads and writes fail `TimedOut`) once no byte has moved either
/// way for its timeout. The timer is armed once and moved on only when it fires, so busy
/// connections pay no timer update per read.
#[derive(Debug)]
pub struct Idle<S> {
    inner: S,
    timeout: Duration,
    /// When a byte last moved.
    last: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Idle<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            inner,
            timeout,
            last: now,
            deadline: Box::pin(tokio::time::sleep_until(now + timeout)),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Pending, or the error that closes the connection once the timeout has passed since
    /// the last byte.
    fn pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last + self.timeout;
            if due <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no byte moved for {:?}", self.timeout),
                ));
            }
            // Bytes moved since it was armed: armed again from the last of them.
            self.deadline.as_mut().reset(due);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.pending(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if r.as_ref().is_ok_and(|n| *n > 0) {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.pending(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.pending(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_shutdown(cx) {
            Poll::Pending => this.pending(cx).map(Err),
            ready => ready,
        }
    }
}

/// A quarter of this process's open-files limit (the soft one, from `/proc/self/limits`),
/// at most `max`: a listener's cap that leaves the other three quarters to gRPC and the
/// process's own work whatever limit it was started with (1,024 in many containers).
/// `max` where the limit cannot be read or is unlimited.
pub fn quarter_of_open_files(max: usize) -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
        .map_or(max, |soft| (soft / 4).clamp(1, max))
}

/// hyper's HTTP/1 server with `limits`' header timeout.
pub fn http1(limits: &Limits) -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    builder
}

/// Serve `app` over HTTP/1 on `listener` within `limits` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    limits: Limits,
    app: axum::Router,
    shutdown: impl Future<Output = ()> + Send,
) {
    let slots = Slots::new(limits.max_connections);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (slot, accepted) = tokio::select! {
            () = &mut shutdown => return,
            slot = slots.take() => (slot, tokio::select! {
                () = &mut shutdown => return,
                accepted = listener.accept() => accepted,
            }),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (or the like): a pause rather than a busy loop.
                tracing::debug!(error = %e, "http accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(Idle::new(stream, limits.idle_timeout));
            let _ = http1(&limits).serve_connection(io, service).await;
            drop(slot);
        });
    }
}

#[cfg(test)]
#[path = "http_limits_tests.rs"]
mod tests;
