//! In-memory stand-ins for the pipeline's two edges, for tests whose
//! subject is not the edge: [`ScriptedTransport`] answers each partition's
//! requests as a test scripts it (acknowledge, fail with a given class,
//! hang, write and then lose the answer, refuse given keys) and records
//! what it wrote; [`MemoryStore`] is an outbox with leases. With tokio's
//! paused time they make the pipeline's failure modes deterministic.

mod store;
mod transport;

pub use store::MemoryStore;
pub use transport::{Answer, ScriptedTransport, Written};
