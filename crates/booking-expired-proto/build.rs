//! Compiles the contract with protox (pure Rust: no `protoc` on the machine).
//!
//! The crate carries its own copy of the contract under `proto/`, so a
//! packaged crate (`cargo package`) builds on its own. The repository's
//! top-level `proto/` stays the contract's home (buf lint and breaking, the
//! Java consumer); the test `packaged_proto_equals_the_contract` fails when
//! the two copies differ.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("proto");
    let file = proto_root.join("pin/crm/booking/v1/booking_expired.proto");
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let descriptors = protox::compile([&file], [&proto_root])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
