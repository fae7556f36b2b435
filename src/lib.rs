//! `booking-expiration`: the crm background worker that moves active
//! bookings whose timer passed into their terminal expired status and
//! announces each expiry as a `BookingExpiredEvent` on Kafka through a
//! transactional outbox.
//!
//! # Layout
//!
//! - [`domain`]: pure rules — statuses, phases, `Booking::expire(as_of)`,
//!   the `BookingExpired` event. No I/O.
//! - [`events`]: domain event → protobuf value, Kafka key and its partition
//!   hash, CloudEvents headers.
//! - [`db`]: the pool, embedded migrations, the bookings and outbox
//!   repositories. All SQL lives here.
//! - [`handoff`]: a row written and leased to this instance: the row the
//!   expiry hands to the publisher and the claim returns, the handoff
//!   itself, the lease's owner. Below the expiry, the publisher and the
//!   SQL, so they meet here rather than in each other's internals.
//! - [`expiry`]: one cycle (`run_cycle`, started as a `CycleStart` says;
//!   its loop, its batches, its outcome), the pure next-wake rule, each
//!   phase's sweep position (poison rows passed over), the clock-skew
//!   check, and the scheduler that repeats cycles at each tick and deadline
//!   and probes for new deadlines while it sleeps.
//! - [`outbox`]: the publisher, a per-partition pipeline (claim with a
//!   lease, route to the partition's queue, produce, mark) behind two
//!   seams, the broker's (`Transport`: connections the worker owns,
//!   speaking rskafka's protocol layer, or scripted for tests) and the
//!   database's (`Store`), and its upkeep tasks.
//! - [`tls`]: what TLS to PostgreSQL and to Kafka share: the pure-Rust
//!   crypto provider, the bundled roots, PEM files.
//! - [`telemetry`]: logging setup, metrics, health, the HTTP endpoints.
//! - [`config`]: typed, validated settings; [`libpq`]: what libpq's URL,
//!   `PG*` variables, password file and `sslmode`s mean, as a connection
//!   plan; [`clock`]: the time seam;
//!   [`context`]: what every long-running task shares (pool, clock,
//!   metrics, health); [`backoff`]: the jittered exponential backoff of
//!   every retry loop.
//! - [`app`]: wiring of the commands used by the binary.
//!
//! # Layers
//!
//! Dependencies point downwards: a module uses only modules of the layers
//! below its own, never one of its own layer or above. `tests/layering.rs`
//! reads every `crate::`, `$crate::` and `super::` path (test modules
//! included) and fails on an arrow against this list or the rooms' lists
//! below; it needs no server, so CI runs it right after clippy.
//!
//! 1. [`app`]
//! 2. [`expiry`], [`outbox`]
//! 3. [`context`]
//! 4. [`db`], [`telemetry`]
//! 5. [`handoff`]
//! 6. [`events`]
//! 7. [`domain`]
//! 8. [`config`], [`clock`], [`tls`], [`backoff`]
//! 9. [`libpq`]
//!
//! ## Rooms of `expiry`
//!
//! The rooms (files and subfolders) of a folder follow the same rule
//! among themselves. The folder's root file is its front door, in no
//! layer: it wires and re-exports the rooms, and every room may use what
//! it defines itself (its error enum).
//!
//! 1. `scheduler`
//! 2. `cycle`
//! 3. `batch`
//! 4. `worker`
//! 5. `outcome`, `skew`, `sweep`, `wake`, `waker`
//!
//! ## Rooms of `db`
//!
//! 1. `migrate`, `privileges`, `replay`, `seed`
//! 2. `bookings`, `pool`
//! 3. `connect`, `outbox`, `waker`
//! 4. `tls`
//!
//! ## Rooms of `outbox`
//!
//! 1. `tests`
//! 2. `publisher`
//! 3. `pipeline`, `memory`, `kafka`, `maintenance`, `listener`
//! 4. `queues`
//! 5. `partition`
//! 6. `store`, `report`, `scan`, `timing`, `transport`
//!
//! ## Rooms of `config`
//!
//! 1. `cli`
//! 2. `expiry`, `http`, `publisher`, `seed`
//! 3. `catalog`
//! 4. `setting`
//! 5. `parse`
//! 6. `kafka`, `database`
//! 7. `secret`
//!
//! Allowed against the order: `kafka` -> `catalog`, `database` ->
//! `catalog` (`KafkaSettings::new` and `DatabaseSettings::new` fill in
//! the declared defaults, and errors name the settings as declared; the
//! declarations are typed with those rooms' own value types:
//! `Compression`, `SecurityProtocol`, `Pooler`).
//!
//! ## Rooms of `libpq`
//!
//! 1. `conninfo`
//! 2. `env`
//! 3. `ssl`, `pgpass`
//! 4. `url`

// The design's guard rails: no unsafe code anywhere, idiomatic 2018+ Rust,
// and every public type debuggable. clippy.toml keeps the wall clock behind
// `clock::Clock`.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms, missing_debug_implementations)]

pub mod app;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod context;
pub mod db;
pub mod domain;
pub mod events;
pub mod expiry;
pub mod handoff;
pub mod libpq;
pub mod outbox;
pub mod telemetry;
pub mod tls;
