//! MetaRoCE collectives (work in progress).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod datatype;
pub mod half;
pub mod kernels;

pub use datatype::{DataType, ReduceOp};
