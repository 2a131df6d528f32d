//! Joining a workflow's futures with the workflow task's own waker.

use std::{future::Future, pin::Pin, task::Poll};

/// Every future's output, in order. Unlike `futures::future::join_all` (which puts more
/// than 30 futures in a `FuturesOrdered` with wakers of its own), it polls each future
/// with the workflow task's waker, the only kind the SDK accepts.
pub(super) async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(move |cx| {
        let mut pending = false;
        for (fut, out) in futs.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => *out = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(outs.iter_mut().filter_map(Option::take).collect())
        }
    })
    .await
}
