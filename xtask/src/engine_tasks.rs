//! The subcommands that `xtask` hands to the `xtask-engine` binary (they need
//! the model loader or the engine). Read by both binaries (`xtask-engine`
//! includes this file in its tests), so the two lists cannot drift apart.

/// Names as typed after `cargo xtask`.
pub const ENGINE_TASKS: &[&str] = &[
    "gen-tiny-model",
    "fetch-data",
    "bench-serve",
    "bench-paper",
    "gen-lora",
];

/// The package that holds them.
pub const ENGINE_PACKAGE: &str = "xtask-engine";
