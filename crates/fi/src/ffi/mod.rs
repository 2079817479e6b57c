//! The C side: the provider entry point `fi_prov_ini`, `fi_getinfo`, and
//! every libfabric object (fabric, domain, endpoint, AV, CQ, counter, EQ,
//! MR) as a C structure whose first member is the libfabric one, with its
//! op tables. Every `unsafe` of the crate is in this module and its
//! children; each block says why it is sound.
//!
//! The objects hold no state of their own beyond the libfabric header: a
//! handle to their domain and an index into it, so everything the
//! provider does runs in safe code under the domain lock.

mod idle;
pub(crate) mod log;
pub(crate) mod mem;
pub(crate) mod trace;

mod ep;
mod info;
mod objects;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unreachable_pub,
    unused_qualifications,
    clippy::all,
    clippy::use_self,
    clippy::manual_let_else,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
pub(crate) mod sys {
    //! Bindings generated at build time from the system's libfabric headers.
    include!(concat!(env!("OUT_DIR"), "/libfabric.rs"));
}

use crate::config::{PARAMS, Tunables};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// The provider structure handed to the core, leaked for the process's life.
struct ProviderPtr(*mut sys::fi_provider);
// SAFETY: the structure is written once before it is published through
// the `OnceLock` and only read afterwards (by the core and by `fi_log`).
unsafe impl Send for ProviderPtr {}
// SAFETY: as above: shared reads only.
unsafe impl Sync for ProviderPtr {}

static PROVIDER: OnceLock<ProviderPtr> = OnceLock::new();
static CONFIG: OnceLock<Arc<Tunables>> = OnceLock::new();

pub(crate) fn provider_ptr() -> Option<*const sys::fi_provider> {
    PROVIDER.get().map(|p| p.0.cast_const())
}

/// The provider's settings (read at load; defaults before that).
pub(crate) fn config() -> Arc<Tunables> {
    Arc::clone(CONFIG.get_or_init(|| Arc::new(Tunables::default())))
}

/// `FI_VERSION(major, minor)`.
pub(crate) const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The provider's own version.
const PROVIDER_VERSION: u32 = fi_version(0, 1);

fn define_params(prov: *const sys::fi_provider) {
    for p in PARAMS {
        let name = CString::new(p.name).expect("static names have no NUL");
        let help = CString::new(format!("{} (default: {:?})", p.help, p.default))
            .expect("static help has no NUL");
        // SAFETY: `prov` is our provider structure; the strings are valid
        // for the call (the core copies them), and "%s" consumes exactly
        // the one string passed.
        unsafe {
            sys::fi_param_define(
                prov,
                name.as_ptr(),
                sys::fi_param_type_FI_PARAM_STRING,
                c"%s".as_ptr(),
                help.as_ptr(),
            );
        }
    }
}

fn read_param(prov: *const sys::fi_provider, name: &str) -> Option<String> {
    let cname = CString::new(name).ok()?;
    let mut value: *mut c_char = std::ptr::null_mut();
    // SAFETY: for a string parameter the core stores a `char *` into the
    // pointer we pass; `value` is such a pointer on our stack.
    let rc = unsafe {
        sys::fi_param_get(
            prov.cast_mut(),
            cname.as_ptr(),
            (&raw mut value).cast::<c_void>(),
        )
    };
    if rc != 0 || value.is_null() {
        return None;
    }
    // SAFETY: on success the core gave a NUL-terminated string (the
    // environment's value), valid at least until the next environment change.
    Some(
        unsafe { CStr::from_ptr(value) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The entry point libfabric's core looks up in a DL provider.
///
/// # Safety
/// Called by libfabric's core once, when it loads the library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fi_prov_ini() -> *mut sys::fi_provider {
    let p = PROVIDER.get_or_init(|| {
        let prov = Box::new(sys::fi_provider {
            version: PROVIDER_VERSION,
            fi_version: fi_version(1, 17),
            context: sys::fi_context::default(),
            name: c"metaroce".as_ptr(),
            getinfo: Some(info::getinfo),
            fabric: Some(objects::fabric_open),
            cleanup: Some(cleanup),
        });
        ProviderPtr(Box::into_raw(prov))
    });
    let prov = p.0.cast_const();
    define_params(prov);
    let (cfg, lines) = Tunables::from_lookup(|n| read_param(prov, n));
    for (bad, line) in &lines {
        if *bad {
            log::warn(line);
        } else {
            log::info(line);
        }
    }
    trace::init(cfg.stats);
    let _ = CONFIG.set(Arc::new(cfg));
    p.0
}

unsafe extern "C" fn cleanup() {}

/// A negative libfabric error code as the C functions return it.
pub(crate) fn neg(err: i32) -> c_int {
    -err.abs()
}

/// Live objects by address, with their class: `fi_ep_bind` and friends
/// check a fid is one of ours, of the right class, before using it.
fn registry() -> &'static Mutex<HashMap<usize, u32>> {
    static R: OnceLock<Mutex<HashMap<usize, u32>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(crate) fn register(ptr: *const c_void, class: u32) {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(ptr as usize, class);
}

pub(crate) fn unregister(ptr: *const c_void) {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&(ptr as usize));
}

/// The class of a live object of ours at `ptr`.
pub(crate) fn class_of(ptr: *const c_void) -> Option<u32> {
    registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&(ptr as usize))
        .copied()
}

/// A C string argument, if present and UTF-8.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
pub(crate) unsafe fn opt_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller's contract.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// Copy `s` into a C buffer of `len` bytes (NUL-terminated, truncated).
///
/// # Safety
/// `buf` is null or valid for `len` bytes of writes.
pub(crate) unsafe fn write_cstr(buf: *mut c_char, len: usize, s: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = s.len().min(len - 1);
    // SAFETY: `n + 1 <= len` bytes are written into `buf`.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::sys;
    use crate::flags;

    /// The enum values `caps` hard-codes are the headers' values.
    #[test]
    fn enum_values_match_headers() {
        assert_eq!(sys::fi_ep_type_FI_EP_RDM, 3);
        assert_eq!(sys::FI_SOCKADDR_IN, 2);
        assert_eq!(sys::fi_threading_FI_THREAD_SAFE, 1);
        assert_eq!(sys::fi_progress_FI_PROGRESS_AUTO, 1);
        assert_eq!(sys::fi_progress_FI_PROGRESS_MANUAL, 2);
        assert_eq!(sys::fi_resource_mgmt_FI_RM_ENABLED, 2);
        assert_eq!(sys::fi_av_type_FI_AV_MAP, 1);
        assert_eq!(sys::fi_av_type_FI_AV_TABLE, 2);
        assert_eq!(flags::TAGGED, 8);
    }
}
