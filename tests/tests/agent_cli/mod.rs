//! What the agent-CLI tests share: the mesh's runner pointed at a scripted model with
//! real-looking keys, launches and prices (model_mesh); a run of two CLI forks and all it
//! checks (forks), where the keys must not be (secrets), and the model requests in the
//! run's trace (traces).
#![allow(dead_code)]

pub mod forks;
pub mod model_mesh;
pub mod secrets;
pub mod traces;
