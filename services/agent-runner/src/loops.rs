//! The built-in loops running on this replica, by run and fork: where a branch point of
//! a running loop is asked (`branch_point`); the other agents' are asked of their
//! grants, at the LLM gateway.

use crate::llm_gateway::capture::Captures;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// The built-in loops running on this replica, by run and fork: where their captures
/// are asked (the other agents' are their grants', at the LLM gateway).
#[derive(Default)]
pub struct Loops {
    by_fork: Mutex<HashMap<(String, u32), Arc<Captures>>>,
}

impl Loops {
    /// `captures` are fork `fork` of `run_id`'s until the returned handle is dropped.
    pub fn register(
        self: &Arc<Self>,
        run_id: &str,
        fork: u32,
        captures: Captures,
    ) -> RegisteredLoop {
        let key = (run_id.to_owned(), fork);
        let captures = Arc::new(captures);
        self.by_fork
            .lock()
            .expect("loops lock")
            .insert(key.clone(), captures.clone());
        RegisteredLoop {
            loops: self.clone(),
            key,
            captures,
        }
    }

    pub fn get(&self, run_id: &str, fork: u32) -> Option<Arc<Captures>> {
        let key = (run_id.to_owned(), fork);
        self.by_fork.lock().expect("loops lock").get(&key).cloned()
    }
}

/// A loop's captures, registered while it runs.
pub struct RegisteredLoop {
    loops: Arc<Loops>,
    key: (String, u32),
    pub captures: Arc<Captures>,
}

impl Drop for RegisteredLoop {
    fn drop(&mut self) {
        let mut by_fork = self.loops.by_fork.lock().expect("loops lock");
        // A newer attempt of the same fork may have taken the key since.
        if by_fork
            .get(&self.key)
            .is_some_and(|c| Arc::ptr_eq(c, &self.captures))
        {
            by_fork.remove(&self.key);
        }
    }
}
