//! Big-endian field access for the packet views.
//!
//! Every field of the format is big-endian (network order), as in IP, UDP
//! and RoCEv2's transport headers. Field positions are `Range<usize>`
//! constants whose length matches the integer width, so the copies below only
//! panic if the buffer is too short; the views' `check_len` rules that out.

use core::ops::Range;

/// A field position inside a header.
pub(crate) type Field = Range<usize>;

pub(crate) fn get_u16(buf: &[u8], field: Field) -> u16 {
    let mut bytes = [0u8; 2];
    bytes.copy_from_slice(&buf[field]);
    u16::from_be_bytes(bytes)
}

pub(crate) fn get_u32(buf: &[u8], field: Field) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[field]);
    u32::from_be_bytes(bytes)
}

pub(crate) fn get_u64(buf: &[u8], field: Field) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[field]);
    u64::from_be_bytes(bytes)
}

pub(crate) fn set_u16(buf: &mut [u8], field: Field, value: u16) {
    buf[field].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn set_u32(buf: &mut [u8], field: Field, value: u32) {
    buf[field].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn set_u64(buf: &mut [u8], field: Field, value: u64) {
    buf[field].copy_from_slice(&value.to_be_bytes());
}
