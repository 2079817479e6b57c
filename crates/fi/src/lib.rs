//! A libfabric provider (`metaroce`, endpoint type `FI_EP_RDM`) over the
//! MetaRoCE transport, so MPI, libfabric's own tools and NCCL's libfabric
//! plugin run over MetaRoCE unchanged. Built as `libmetaroce_fi.so`, a DL
//! provider that libfabric loads from `FI_PROVIDER_PATH`; see
//! `docs/libfabric.md`.
//!
//! Layout:
//! - [`ffi`]-side (crate-private) C objects and op tables, the only place
//!   with `unsafe`: the provider entry `fi_prov_ini`, `fi_getinfo`, and
//!   every object's functions, which turn C arguments into the safe calls
//!   below;
//! - [`caps`]: what the provider offers and the check of `fi_getinfo` hints;
//! - [`atomic`]: the atomic (operation, datatype) pairs offered, their
//!   wire form and their arithmetic, which the target's provider applies;
//! - [`config`]: the `FI_METAROCE_*` tunables;
//! - [`addr`]: the endpoint address (`FI_SOCKADDR_IN`: IP + listener port);
//! - [`wire`]: the provider's message header (remote input, parsed strictly);
//! - [`matching`]: software tag matching with the unexpected queue;
//! - `domain`, `endpoint`, `conn`: the domain's objects, one endpoint's
//!   protocol (eager, rendezvous over RDMA READ, RMA and atomics on
//!   registered memory, lazy connections), and connection set-up over
//!   `metaroce-cm`.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod addr;
pub mod atomic;
pub mod caps;
pub mod config;
mod conn;
mod domain;
mod endpoint;
mod ffi;
mod flags;
pub mod matching;
pub mod wire;

pub use ffi::fi_prov_ini;
