//! Logging through libfabric's `fi_log`, so `FI_LOG_LEVEL` and
//! `FI_LOG_PROV=metaroce` govern the provider's messages like any other
//! provider's. Before the core has loaded the provider (unit tests) the
//! messages go nowhere.

use super::sys;
use std::ffi::CString;
use std::sync::atomic::{AtomicU8, Ordering};

fn emit(level: sys::fi_log_level, subsys: sys::fi_log_subsys, msg: &str) {
    let Some(prov) = super::provider_ptr() else {
        return;
    };
    // SAFETY: `prov` is the provider structure this library handed the
    // core from `fi_prov_ini`, alive for the life of the process;
    // `fi_log_enabled` only reads it.
    if unsafe { sys::fi_log_enabled(prov, level, subsys) } == 0 {
        return;
    }
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    // SAFETY: every pointer is a valid NUL-terminated string that outlives
    // the call, and the format "%s" consumes exactly the one string
    // argument passed.
    unsafe {
        sys::fi_log(
            prov,
            level,
            subsys,
            c"metaroce".as_ptr(),
            0,
            c"%s\n".as_ptr(),
            text.as_ptr(),
        );
    }
}

/// Log at `FI_LOG_WARN` (shown by default).
pub(crate) fn warn(msg: &str) {
    emit(
        sys::fi_log_level_FI_LOG_WARN,
        sys::fi_log_subsys_FI_LOG_CORE,
        msg,
    );
}

/// Log at `FI_LOG_INFO`.
pub(crate) fn info(msg: &str) {
    emit(
        sys::fi_log_level_FI_LOG_INFO,
        sys::fi_log_subsys_FI_LOG_CORE,
        msg,
    );
}

/// Log at `FI_LOG_DEBUG`.
pub(crate) fn debug(msg: &str) {
    emit(
        sys::fi_log_level_FI_LOG_DEBUG,
        sys::fi_log_subsys_FI_LOG_CORE,
        msg,
    );
}

/// Whether `FI_LOG_LEVEL` (with `FI_LOG_PROV`) lets debug messages
/// through: asked of the core once, then remembered, so that a message on
/// the data path costs one load, not a formatted string, when it is off.
/// Before the core has loaded the provider: no (and not remembered).
pub(crate) fn debug_enabled() -> bool {
    const UNKNOWN: u8 = 0;
    const OFF: u8 = 1;
    const ON: u8 = 2;
    static DEBUG: AtomicU8 = AtomicU8::new(UNKNOWN);
    match DEBUG.load(Ordering::Relaxed) {
        OFF => false,
        ON => true,
        _ => {
            let Some(prov) = super::provider_ptr() else {
                return false;
            };
            // SAFETY: as in `emit`: the provider structure lives for the
            // process, and `fi_log_enabled` only reads it.
            let on = unsafe {
                sys::fi_log_enabled(
                    prov,
                    sys::fi_log_level_FI_LOG_DEBUG,
                    sys::fi_log_subsys_FI_LOG_CORE,
                )
            } != 0;
            DEBUG.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
    }
}
