//! `booking-expiration`: the crm background worker that moves active
//! bookings whose timer passed into their terminal expired status and
//! announces each expiry as a `BookingExpiredEvent` on Kafka through a
//! transactional outbox.
//!
//! # Layout
//!
//! - [`domain`]: pure rules — statuses, phases, `Booking::expire(as_of)`,
//!   the `BookingExpired` event. No I/O.
//! - [`events`]: domain event → protobuf value, Kafka key, CloudEvents headers.
//! - [`db`]: the pool, embedded migrations, the bookings and outbox
//!   repositories. All SQL lives here.
//! - [`expiry`]: one cycle (`run_cycle`), the pure next-wake rule, the
//!   memory of refused (poison) rows, and the scheduler that repeats cycles
//!   at each tick and deadline and probes for new deadlines while it sleeps.
//! - [`outbox`]: the publisher (claim, produce, mark) behind the `Sink` seam
//!   (rskafka, or in memory for tests), its upkeep tasks, and the
//!   in-process TLS bridge that carries rskafka's connections for `SSL` and
//!   `SASL_SSL` (docs/security.md).
//! - [`tls`]: what TLS to PostgreSQL and to Kafka share: the pure-Rust
//!   crypto provider, the bundled roots, PEM files.
//! - [`telemetry`]: logging setup, metrics, health, the HTTP endpoints.
//! - [`config`]: typed, validated settings; [`clock`]: the time seam;
//!   [`context`]: what every long-running task shares (pool, clock,
//!   metrics, health).
//! - [`app`]: wiring of the commands used by the binary.
//!
//! # Layers
//!
//! Dependencies point downwards: a module uses only modules of the layers
//! below its own, never one of its own layer or above. `tests/it/layering.rs`
//! reads every `crate::` path outside the test modules and fails on an
//! arrow against this list.
//!
//! 1. [`app`]
//! 2. [`expiry`], [`outbox`]
//! 3. [`context`]
//! 4. [`db`], [`telemetry`]
//! 5. [`events`]
//! 6. [`domain`]
//! 7. [`config`], [`clock`], [`tls`]

// The design's guard rails: no unsafe code anywhere, idiomatic 2018+ Rust,
// and every public type debuggable. clippy.toml keeps the wall clock behind
// `clock::Clock`.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms, missing_debug_implementations)]

pub mod app;
pub mod clock;
pub mod config;
pub mod context;
pub mod db;
pub mod domain;
pub mod events;
pub mod expiry;
pub mod outbox;
pub mod telemetry;
pub mod tls;
