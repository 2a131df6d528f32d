use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn view(closed: bool, fork_count: usize) -> View {
    View {
        owner: "t".into(),
        run: Run {
            forks: vec![Default::default(); fork_count],
            ..Run::default()
        },
        closed,
        publishable: false,
    }
}

fn counting(
    calls: &Arc<AtomicUsize>,
    closed: bool,
    delay: Duration,
) -> impl Future<Output = Result<View, GatewayError>> + Send + 'static {
    let calls = calls.clone();
    async move {
        let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(delay).await;
        Ok(view(closed, n))
    }
}

#[tokio::test]
async fn concurrent_readers_of_a_run_share_one_fetch_and_a_closed_run_is_never_fetched_again() {
    let reads = RunReads::new(ReadLimits::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let all = futures::future::join_all(
        (0..50).map(|_| reads.get("r", counting(&calls, true, Duration::from_millis(50)))),
    )
    .await;
    assert!(all.iter().all(Result::is_ok));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    reads
        .get("r", counting(&calls, true, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a closed run is kept");
}

#[tokio::test]
async fn a_running_run_is_fetched_again_after_its_ttl_or_a_write() {
    let limits = ReadLimits {
        live_ttl: Duration::from_millis(300),
        ..ReadLimits::default()
    };
    let reads = RunReads::new(limits);
    let calls = Arc::new(AtomicUsize::new(0));
    let get = || reads.get("r", counting(&calls, false, Duration::ZERO));
    assert_eq!(get().await.unwrap().run.forks.len(), 1);
    assert_eq!(
        get().await.unwrap().run.forks.len(),
        1,
        "fresh: served as is"
    );
    reads.forget("r");
    assert_eq!(get().await.unwrap().run.forks.len(), 2, "a write drops it");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        get().await.unwrap().run.forks.len(),
        2,
        "a little stale: served while it is fetched again"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get().await.unwrap().run.forks.len(), 3, "refreshed");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        get().await.unwrap().run.forks.len(),
        4,
        "too stale to serve: waited for"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_failed_fetch_is_not_kept() {
    let reads = RunReads::new(ReadLimits::default());
    let err = reads
        .get("r", async { Err(GatewayError::Temporal("down".into())) })
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Temporal(_)));
    let calls = Arc::new(AtomicUsize::new(0));
    reads
        .get("r", counting(&calls, false, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn reads_beyond_the_fetch_limit_are_refused_fast_with_unavailable() {
    let reads = RunReads::new(ReadLimits {
        max_fetches: 2,
        shed_after: Duration::from_millis(50),
        ..ReadLimits::default()
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let slow: Vec<_> = (0..2)
        .map(|i| {
            let (reads, fetch) = (
                reads.clone(),
                counting(&calls, false, Duration::from_millis(500)),
            );
            tokio::spawn(async move { reads.get(&format!("slow-{i}"), fetch).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let err = reads
        .get("other", counting(&calls, false, Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(err, GatewayError::Unavailable(_)), "{err}");
    assert!(err.to_string().contains("retry"), "{err}");
    assert!(
        slow.iter().all(|h| !h.is_finished()),
        "refused while the fetches ahead of it still ran"
    );
    for h in slow {
        h.await.unwrap().unwrap();
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the refused read fetched nothing"
    );
}

#[tokio::test]
async fn a_publishable_closed_run_is_amended_at_once_and_fetched_again_after_its_ttl() {
    let reads = RunReads::new(ReadLimits {
        published_ttl: Duration::from_millis(200),
        ..ReadLimits::default()
    });
    let calls = Arc::new(AtomicUsize::new(0));
    let get = || {
        let calls = calls.clone();
        reads.get("r", async move {
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(View {
                publishable: true,
                ..view(true, n)
            })
        })
    };
    assert_eq!(get().await.unwrap().run.forks.len(), 1);
    reads.amend("r", |run| run.winner = 7);
    assert_eq!(
        get().await.unwrap().run.winner,
        7,
        "amended where it is kept"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "and not fetched again");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let served = get().await.unwrap();
    assert_eq!(
        served.run.forks.len(),
        1,
        "the kept view while it is fetched again"
    );
    for _ in 0..100 {
        if get().await.unwrap().run.forks.len() == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "never fetched again: {} fetches",
        calls.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn the_oldest_closed_runs_are_dropped_past_the_capacity() {
    let reads = RunReads::new(ReadLimits {
        closed_capacity: 2,
        ..ReadLimits::default()
    });
    let calls = Arc::new(AtomicUsize::new(0));
    for id in ["a", "b", "c", "a"] {
        reads
            .get(id, counting(&calls, true, Duration::ZERO))
            .await
            .unwrap();
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4, "a was dropped for c");
    reads
        .get("c", counting(&calls, true, Duration::ZERO))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4, "c is still kept");
}
