//! The integration tests, one binary, against the real PostgreSQL and
//! Apache Kafka that the test command starts (`bash scripts/test.sh`; see
//! docs/testing.md). One module per subject; run one with
//! `bash scripts/test.sh --test it faults::`.

mod support;

mod broker_freeze;
mod cli;
mod deadline_wake;
mod expiry_cycle;
mod failover;
mod faults;
mod java_consumer;
mod kafka_acl;
mod kafka_cluster;
mod kafka_quota;
mod kafka_tls;
mod libpq_env;
mod live_migration;
mod logging;
mod operator_edges;
mod outbox_parking;
mod paused_instance;
mod pg_tls;
mod pgbouncer;
mod privileges;
mod publisher;
mod publisher_seams;
mod replay;
mod schema;
mod seccomp;
mod security;
mod shards;
mod traces;
mod waker;
