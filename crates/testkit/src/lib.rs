//! Plumbing shared by the integration tests (`tests/it`) and the benchmark
//! (`benches`): the repository's scripts, free ports, throwaway PostgreSQL,
//! PgBouncer and Kafka servers that stop on drop, databases and topics.
//!
//! It does not depend on `booking-expiration`: product types (settings,
//! fixtures of bookings) stay with the tests and benches that use them.

pub mod kafka;
pub mod pgbouncer;
pub mod postgres;
pub mod scripts;

pub use scripts::{
    free_port, free_port_block, free_port_pair, free_port_pairs, repo, run_script, script, tempdir,
};
