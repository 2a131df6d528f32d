//! One async lock per key: work that must happen once per key at a time (a create
//! under one idempotency key, a template's build, an image's unpack) while other keys
//! go on. A key's entry goes when its last holder lets go, so the map holds only keys
//! in use.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

type Locks<K> = Arc<Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>>;

pub(crate) struct KeyedLock<K> {
    locks: Locks<K>,
}

impl<K> Default for KeyedLock<K> {
    fn default() -> Self {
        Self {
            locks: Arc::default(),
        }
    }
}

impl<K: Eq + Hash + Clone> KeyedLock<K> {
    /// Wait for `key` to be free and hold it until the guard is dropped.
    pub(crate) async fn lock(&self, key: K) -> KeyGuard<K> {
        let lock = self
            .locks
            .lock()
            .expect("keyed lock")
            .entry(key.clone())
            .or_default()
            .clone();
        KeyGuard {
            held: Some(lock.lock_owned().await),
            key,
            locks: self.locks.clone(),
        }
    }

    #[cfg(test)]
    fn keys(&self) -> usize {
        self.locks.lock().expect("keyed lock").len()
    }
}

pub(crate) struct KeyGuard<K: Eq + Hash> {
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
    key: K,
    locks: Locks<K>,
}

impl<K: Eq + Hash> Drop for KeyGuard<K> {
    fn drop(&mut self) {
        drop(self.held.take());
        let mut locks = self.locks.lock().expect("keyed lock");
        // Only the map's own handle left: nobody holds or waits for the key.
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_key_others_go_on_and_no_key_outlives_its_use() {
        let locks = Arc::new(KeyedLock::<String>::default());
        let a = locks.lock("a".into()).await;
        // Another key is free at once.
        let b = tokio::time::timeout(Duration::from_millis(100), locks.lock("b".into())).await;
        assert!(b.is_ok());
        drop(b);
        // The same key waits for its holder.
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { drop(locks.lock("a".into()).await) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(a);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("the waiter gets the key")
            .unwrap();
        assert_eq!(locks.keys(), 0);
    }
}
