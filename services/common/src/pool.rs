//! One traced, lazily connected channel per peer endpoint, made on first use: the
//! replica that owns a sandbox, the runner replica that holds a transcript. Bounded:
//! past `cap` endpoints the pool starts afresh, since the replicas behind old entries
//! are mostly gone (a channel is cheap to make again; a cleared one closes its
//! connection once its last call ends).

use crate::grpc_telemetry::TracedChannel;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

#[derive(Clone)]
pub struct ChannelPool {
    channels: Arc<Mutex<HashMap<String, TracedChannel>>>,
    cap: usize,
}

impl ChannelPool {
    pub fn new(cap: usize) -> Self {
        Self {
            channels: Arc::default(),
            cap: cap.max(1),
        }
    }

    /// The channel for `endpoint`, made by `make` the first time.
    pub fn get_or<E>(
        &self,
        endpoint: &str,
        make: impl FnOnce() -> Result<TracedChannel, E>,
    ) -> Result<TracedChannel, E> {
        let mut pool = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = pool.get(endpoint) {
            return Ok(c.clone());
        }
        let channel = make()?;
        if pool.len() >= self.cap {
            pool.clear();
        }
        pool.insert(endpoint.to_owned(), channel.clone());
        Ok(channel)
    }

    pub fn len(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lazy(url: &str) -> Result<TracedChannel, String> {
        Ok(crate::grpc_telemetry::traced_channel(
            tonic::transport::Endpoint::from_shared(url.to_owned())
                .map_err(|e| e.to_string())?
                .connect_lazy(),
        ))
    }

    #[tokio::test]
    async fn an_endpoint_gets_one_channel_and_the_pool_stays_bounded() {
        let pool = ChannelPool::new(2);
        let mut made = 0;
        for url in ["http://a:1", "http://a:1", "http://b:1"] {
            pool.get_or(url, || {
                made += 1;
                lazy(url)
            })
            .unwrap();
        }
        assert_eq!((made, pool.len()), (2, 2));
        pool.get_or("http://c:1", || lazy("http://c:1")).unwrap();
        assert_eq!(pool.len(), 1, "past the cap the pool starts afresh");
        let err = pool
            .get_or("x", || Err::<TracedChannel, _>("bad endpoint"))
            .unwrap_err();
        assert_eq!(err, "bad endpoint");
        assert_eq!(pool.len(), 1, "a failed make is not kept");
    }
}
