//! Where the rules come from: files on disk, loaded at start and reloaded when they change
//! (`files.rs`), or an xDS management server (`xds/`).

pub mod files;
pub mod xds;
