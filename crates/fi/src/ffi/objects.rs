//! Fabric, domain, event queue, address vector, completion queue,
//! counter and memory region objects, with their op tables.

use super::{class_of, neg, register, sys, unregister, write_cstr};
use crate::addr::{ADDR_BYTES, EpAddr};
use crate::atomic;
use crate::caps;
use crate::domain::{
    AvState, CntrState, CqEntry, CqState, DomainShared, EqEvent, EqShared, MrEntry,
};
use crate::ffi::mem::UserRegion;
use crate::flags;
use std::ffi::{CString, c_char, c_int, c_void};
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A stub for an operation the provider does not implement.
macro_rules! enosys {
    ($name:ident ( $($t:ty),* $(,)? ) -> $ret:ty) => {
        pub(super) unsafe extern "C" fn $name($(_: $t),*) -> $ret {
            -(sys::FI_ENOSYS as $ret)
        }
    };
}
pub(super) use enosys;

enosys!(bind_enosys(*mut sys::fid, *mut sys::fid, u64) -> c_int);
enosys!(control_enosys(*mut sys::fid, c_int, *mut c_void) -> c_int);
enosys!(ops_open_enosys(*mut sys::fid, *const c_char, u64, *mut *mut c_void, *mut c_void) -> c_int);
enosys!(tostr_enosys(*const sys::fid, *mut c_char, usize) -> c_int);
enosys!(ops_set_enosys(*mut sys::fid, *const c_char, u64, *mut c_void, *mut c_void) -> c_int);

/// `struct fi_ops` with `close` and optional `bind` / `control`.
pub(super) const fn fid_ops(
    close: unsafe extern "C" fn(*mut sys::fid) -> c_int,
    bind: Option<unsafe extern "C" fn(*mut sys::fid, *mut sys::fid, u64) -> c_int>,
    control: Option<unsafe extern "C" fn(*mut sys::fid, c_int, *mut c_void) -> c_int>,
) -> sys::fi_ops {
    sys::fi_ops {
        size: size_of::<sys::fi_ops>(),
        close: Some(close),
        bind: match bind {
            Some(b) => Some(b),
            None => Some(bind_enosys),
        },
        control: match control {
            Some(c) => Some(c),
            None => Some(control_enosys),
        },
        ops_open: Some(ops_open_enosys),
        tostr: Some(tostr_enosys),
        ops_set: Some(ops_set_enosys),
    }
}

/// A fid header.
pub(super) fn fid(class: u32, context: *mut c_void, ops: &'static sys::fi_ops) -> sys::fid {
    sys::fid {
        fclass: class as usize,
        context,
        ops: (ops as *const sys::fi_ops).cast_mut(),
    }
}

/// Allocate an object, register it and hand its address out through `out`.
///
/// # Safety
/// `out` is valid for a write of a pointer.
pub(super) unsafe fn publish<T, U>(obj: T, class: u32, out: *mut *mut U) -> c_int {
    let p = Box::into_raw(Box::new(obj));
    register(p.cast::<c_void>(), class);
    // SAFETY: the caller's contract on `out`.
    unsafe { *out = p.cast::<U>() };
    0
}

/// Take back an object published by [`publish`].
///
/// # Safety
/// `p` was published as a `T` and is not used again.
pub(super) unsafe fn reclaim<T>(p: *mut T) -> Box<T> {
    unregister(p.cast::<c_void>());
    // SAFETY: the caller's contract.
    unsafe { Box::from_raw(p) }
}

// ------------------------------------------------------------------ fabric

#[repr(C)]
pub(super) struct FabricObj {
    fid: sys::fid_fabric,
}

static FABRIC_FI_OPS: sys::fi_ops = fid_ops(fabric_close, None, None);
static FABRIC_OPS: sys::fi_ops_fabric = sys::fi_ops_fabric {
    size: size_of::<sys::fi_ops_fabric>(),
    domain: Some(domain_open),
    passive_ep: Some(passive_ep_enosys),
    eq_open: Some(eq_open),
    wait_open: Some(wait_open_enosys),
    trywait: Some(trywait_enosys),
    domain2: Some(domain2_open),
};
enosys!(
    passive_ep_enosys(
        *mut sys::fid_fabric,
        *mut sys::fi_info,
        *mut *mut sys::fid_pep,
        *mut c_void,
    ) -> c_int
);
enosys!(
    wait_open_enosys(
        *mut sys::fid_fabric,
        *mut sys::fi_wait_attr,
        *mut *mut sys::fid_wait,
    ) -> c_int
);
enosys!(trywait_enosys(*mut sys::fid_fabric, *mut *mut sys::fid, c_int) -> c_int);

/// The provider's `fabric` entry.
///
/// # Safety
/// Called by the core with valid arguments.
pub(super) unsafe extern "C" fn fabric_open(
    attr: *mut sys::fi_fabric_attr,
    fabric: *mut *mut sys::fid_fabric,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the core passes a valid attribute structure (or null).
    let api_version = unsafe { attr.as_ref() }.map_or(super::fi_version(1, 17), |a| a.api_version);
    let obj = FabricObj {
        fid: sys::fid_fabric {
            fid: fid(sys::FI_CLASS_FABRIC, context, &FABRIC_FI_OPS),
            ops: (&raw const FABRIC_OPS).cast_mut(),
            api_version,
        },
    };
    // SAFETY: `fabric` is the core's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_FABRIC, fabric) }
}

unsafe extern "C" fn fabric_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through FABRIC_FI_OPS, so `f` heads a FabricObj.
    drop(unsafe { reclaim(f.cast::<FabricObj>()) });
    0
}

// ------------------------------------------------------------------ domain

#[repr(C)]
pub(super) struct DomainObj {
    fid: sys::fid_domain,
    pub(super) shared: Arc<DomainShared>,
    pub(super) api_version: u32,
}

static DOMAIN_FI_OPS: sys::fi_ops = fid_ops(domain_close, Some(domain_bind), None);
static DOMAIN_OPS: sys::fi_ops_domain = sys::fi_ops_domain {
    size: size_of::<sys::fi_ops_domain>(),
    av_open: Some(av_open),
    cq_open: Some(cq_open),
    endpoint: Some(super::ep::endpoint_open),
    scalable_ep: Some(scalable_ep_enosys),
    cntr_open: Some(cntr_open),
    poll_open: Some(poll_open_enosys),
    stx_ctx: Some(stx_ctx_enosys),
    srx_ctx: Some(srx_ctx_enosys),
    query_atomic: Some(query_atomic),
    query_collective: Some(query_collective_enosys),
    endpoint2: Some(super::ep::endpoint2_open),
};
static MR_OPS: sys::fi_ops_mr = sys::fi_ops_mr {
    size: size_of::<sys::fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
};
enosys!(
    scalable_ep_enosys(
        *mut sys::fid_domain,
        *mut sys::fi_info,
        *mut *mut sys::fid_ep,
        *mut c_void,
    ) -> c_int
);
enosys!(
    poll_open_enosys(
        *mut sys::fid_domain,
        *mut sys::fi_poll_attr,
        *mut *mut sys::fid_poll,
    ) -> c_int
);
enosys!(
    stx_ctx_enosys(
        *mut sys::fid_domain,
        *mut sys::fi_tx_attr,
        *mut *mut sys::fid_stx,
        *mut c_void,
    ) -> c_int
);
enosys!(
    srx_ctx_enosys(
        *mut sys::fid_domain,
        *mut sys::fi_rx_attr,
        *mut *mut sys::fid_ep,
        *mut c_void,
    ) -> c_int
);
/// `fi_query_atomic`: flags 0 asks about base atomics, `FI_FETCH_ATOMIC`
/// fetch atomics, `FI_COMPARE_ATOMIC` compare atomics (not both);
/// atomics on tagged buffers (`FI_TAGGED`) are not offered.
unsafe extern "C" fn query_atomic(
    _domain: *mut sys::fid_domain,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    attr: *mut sys::fi_atomic_attr,
    fl: u64,
) -> c_int {
    let fetch = fl & flags::FETCH_ATOMIC != 0;
    let compare = fl & flags::COMPARE_ATOMIC != 0;
    let call = match (fetch, compare) {
        (false, false) => atomic::Call::Base,
        (true, false) => atomic::Call::Fetch,
        (false, true) => atomic::Call::Compare,
        (true, true) => return neg(flags::EINVAL),
    };
    if fl & flags::TAGGED != 0 {
        return neg(flags::EOPNOTSUPP);
    }
    match atomic::query(call, op, datatype, super::config().eager_limit) {
        Ok((count, size)) => {
            // SAFETY: the API: `attr` is null or points at an fi_atomic_attr.
            let Some(a) = (unsafe { attr.as_mut() }) else {
                return neg(flags::EINVAL);
            };
            a.count = count;
            a.size = size;
            0
        }
        Err(e) => neg(e.fi_errno()),
    }
}
enosys!(
    query_collective_enosys(
        *mut sys::fid_domain,
        sys::fi_collective_op,
        *mut sys::fi_collective_attr,
        u64,
    ) -> c_int
);

unsafe extern "C" fn domain2_open(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    dom: *mut *mut sys::fid_domain,
    _flags: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: same arguments as `domain_open`.
    unsafe { domain_open(fabric, info, dom, context) }
}

unsafe extern "C" fn domain_open(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    dom: *mut *mut sys::fid_domain,
    context: *mut c_void,
) -> c_int {
    // SAFETY: called through FABRIC_OPS: `fabric` is ours; `info` is null
    // or a valid fi_info with null-or-valid attributes.
    let (api, mr_mode) = unsafe {
        let api = (*fabric).api_version;
        let mr_mode = info
            .as_ref()
            .and_then(|i| i.domain_attr.as_ref())
            .map_or(flags::MR_PROV_KEY | flags::MR_VIRT_ADDR, |d| {
                d.mr_mode as u32 as u64
            });
        (api, mr_mode)
    };
    let (prov_keys, virt_addr) = caps::mr_semantics(mr_mode, api);
    let obj = DomainObj {
        fid: sys::fid_domain {
            fid: fid(sys::FI_CLASS_DOMAIN, context, &DOMAIN_FI_OPS),
            ops: (&raw const DOMAIN_OPS).cast_mut(),
            mr: (&raw const MR_OPS).cast_mut(),
        },
        shared: DomainShared::new(virt_addr, prov_keys),
        api_version: api,
    };
    // SAFETY: `dom` is the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_DOMAIN, dom) }
}

unsafe extern "C" fn domain_bind(_f: *mut sys::fid, _b: *mut sys::fid, _flags: u64) -> c_int {
    // An EQ for asynchronous MR events: registrations here complete at once.
    0
}

unsafe extern "C" fn domain_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through DOMAIN_FI_OPS: `f` heads a DomainObj.
    drop(unsafe { reclaim(f.cast::<DomainObj>()) });
    0
}

/// The domain object behind a domain fid of ours.
///
/// # Safety
/// `d` heads a live `DomainObj`.
pub(super) unsafe fn domain_of<'a>(d: *mut sys::fid_domain) -> &'a DomainObj {
    // SAFETY: the caller's contract.
    unsafe { &*d.cast::<DomainObj>() }
}

// ------------------------------------------------------------------ EQ

#[repr(C)]
pub(super) struct EqObj {
    fid: sys::fid_eq,
    pub(super) eq: Arc<EqShared>,
}

static EQ_FI_OPS: sys::fi_ops = fid_ops(eq_close, None, None);
static EQ_OPS: sys::fi_ops_eq = sys::fi_ops_eq {
    size: size_of::<sys::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

unsafe extern "C" fn eq_open(
    _fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_eq_attr,
    eq: *mut *mut sys::fid_eq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: `attr` is null or valid.
    if let Some(a) = unsafe { attr.as_ref() }
        && !matches!(
            a.wait_obj,
            sys::fi_wait_obj_FI_WAIT_NONE | sys::fi_wait_obj_FI_WAIT_UNSPEC
        )
    {
        super::log::warn("fi_eq_open: only FI_WAIT_NONE / FI_WAIT_UNSPEC event queues are offered");
        return neg(flags::ENOSYS);
    }
    let obj = EqObj {
        fid: sys::fid_eq {
            fid: fid(sys::FI_CLASS_EQ, context, &EQ_FI_OPS),
            ops: (&raw const EQ_OPS).cast_mut(),
        },
        eq: Arc::new(EqShared::default()),
    };
    // SAFETY: `eq` is the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_EQ, eq) }
}

unsafe extern "C" fn eq_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through EQ_FI_OPS.
    drop(unsafe { reclaim(f.cast::<EqObj>()) });
    0
}

fn eq_take(eq: &EqShared, timeout: Option<Duration>, peek: bool) -> Result<EqEvent, c_int> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut q =
        eq.q.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        if !q.errors.is_empty() {
            return Err(neg(flags::EAVAIL));
        }
        if let Some(ev) = if peek {
            q.events.front().cloned()
        } else {
            q.events.pop_front()
        } {
            return Ok(ev);
        }
        let Some(d) = deadline else {
            return Err(neg(flags::EAGAIN));
        };
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(neg(flags::EAGAIN));
        }
        q = eq
            .cv
            .wait_timeout(q, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
}

/// Copy an event out.
///
/// # Safety
/// `event` valid for a write; `buf` valid for `len` bytes.
unsafe fn eq_deliver(ev: EqEvent, event: *mut u32, buf: *mut c_void, len: usize) -> isize {
    let n = ev.bytes.len().min(len);
    // SAFETY: the caller's contract.
    unsafe {
        if !event.is_null() {
            *event = ev.event;
        }
        if !buf.is_null() {
            std::ptr::copy_nonoverlapping(ev.bytes.as_ptr(), buf.cast::<u8>(), n);
        }
    }
    n as isize
}

unsafe extern "C" fn eq_read(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    fl: u64,
) -> isize {
    // SAFETY: called through EQ_OPS: `eq` heads an EqObj.
    let obj = unsafe { &*eq.cast::<EqObj>() };
    match eq_take(&obj.eq, None, fl & flags::PEEK != 0) {
        // SAFETY: the caller's buffers, per the API.
        Ok(ev) => unsafe { eq_deliver(ev, event, buf, len) },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn eq_sread(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    fl: u64,
) -> isize {
    // SAFETY: called through EQ_OPS.
    let obj = unsafe { &*eq.cast::<EqObj>() };
    let t = if timeout < 0 {
        Duration::from_secs(u64::from(u32::MAX))
    } else {
        Duration::from_millis(timeout as u64)
    };
    match eq_take(&obj.eq, Some(t), fl & flags::PEEK != 0) {
        // SAFETY: the caller's buffers, per the API.
        Ok(ev) => unsafe { eq_deliver(ev, event, buf, len) },
        Err(e) => e as isize,
    }
}

unsafe extern "C" fn eq_readerr(
    eq: *mut sys::fid_eq,
    buf: *mut sys::fi_eq_err_entry,
    _fl: u64,
) -> isize {
    // SAFETY: called through EQ_OPS.
    let obj = unsafe { &*eq.cast::<EqObj>() };
    let mut q = obj
        .eq
        .q
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let Some((fid_, ctx, err, text)) = q.errors.pop_front() else {
        return neg(flags::EAGAIN) as isize;
    };
    let c = CString::new(text).unwrap_or_default();
    // SAFETY: `buf` is the caller's error entry.
    unsafe {
        (&raw mut (*buf).fid).write(fid_ as sys::fid_t);
        (&raw mut (*buf).context).write(ctx as *mut c_void);
        (&raw mut (*buf).data).write(0);
        (&raw mut (*buf).err).write(err);
        (&raw mut (*buf).prov_errno).write(0);
        (&raw mut (*buf).err_data).write(c.as_ptr().cast_mut().cast::<c_void>());
        (&raw mut (*buf).err_data_size).write(c.as_bytes_with_nul().len());
    }
    q.last_err = Some(c);
    1
}

unsafe extern "C" fn eq_write(
    eq: *mut sys::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    _fl: u64,
) -> isize {
    // SAFETY: called through EQ_OPS.
    let obj = unsafe { &*eq.cast::<EqObj>() };
    let mut bytes = vec![0u8; len];
    if !buf.is_null() {
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(buf.cast::<u8>(), bytes.as_mut_ptr(), len) };
    }
    obj.eq.push(EqEvent { event, bytes });
    len as isize
}

unsafe extern "C" fn eq_strerror(
    _eq: *mut sys::fid_eq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let s = format!("metaroce provider error {prov_errno}");
    // SAFETY: the caller's buffer of `len` bytes (or null).
    unsafe { write_cstr(buf, len, &s) };
    if buf.is_null() {
        c"metaroce provider error".as_ptr()
    } else {
        buf
    }
}

// ------------------------------------------------------------------ AV

#[repr(C)]
pub(super) struct AvObj {
    fid: sys::fid_av,
    pub(super) shared: Arc<DomainShared>,
    pub(super) id: usize,
}

static AV_FI_OPS: sys::fi_ops = fid_ops(av_close, Some(av_bind), None);
static AV_OPS: sys::fi_ops_av = sys::fi_ops_av {
    size: size_of::<sys::fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(av_set_enosys),
};
enosys!(
    av_set_enosys(
        *mut sys::fid_av,
        *mut sys::fi_av_set_attr,
        *mut *mut sys::fid_av_set,
        *mut c_void,
    ) -> c_int
);

unsafe extern "C" fn av_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
    av: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    // SAFETY: called through DOMAIN_OPS; `attr` valid or null.
    let (d, a) = unsafe { (domain_of(domain), attr.as_ref()) };
    let mut state = AvState::default();
    if let Some(a) = a {
        if a.type_ != sys::fi_av_type_FI_AV_UNSPEC
            && a.type_ != sys::fi_av_type_FI_AV_MAP
            && a.type_ != sys::fi_av_type_FI_AV_TABLE
        {
            return neg(flags::EINVAL);
        }
        if !a.name.is_null() {
            super::log::warn("fi_av_open: named (shared) address vectors are not offered");
            return neg(flags::ENOSYS);
        }
        state.event_flag = a.flags & flags::EVENT != 0;
        state.entries.reserve(a.count.min(1 << 20));
    }
    let id = d.shared.lock().avs.insert(state);
    let obj = AvObj {
        fid: sys::fid_av {
            fid: fid(sys::FI_CLASS_AV, context, &AV_FI_OPS),
            ops: (&raw const AV_OPS).cast_mut(),
        },
        shared: Arc::clone(&d.shared),
        id,
    };
    // SAFETY: the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_AV, av) }
}

unsafe extern "C" fn av_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through AV_FI_OPS.
    let obj = unsafe { reclaim(f.cast::<AvObj>()) };
    let mut st = obj.shared.lock();
    st.avs.remove(obj.id);
    for id in st.eps.slots() {
        if let Some(e) = st.eps.get_mut(id)
            && e.av == Some(obj.id)
        {
            e.av = None;
        }
    }
    0
}

unsafe extern "C" fn av_bind(f: *mut sys::fid, b: *mut sys::fid, _fl: u64) -> c_int {
    if class_of(b.cast::<c_void>()) != Some(sys::FI_CLASS_EQ) {
        return neg(flags::EINVAL);
    }
    // SAFETY: `f` heads an AvObj (called through AV_FI_OPS); `b` was
    // checked to be a live EqObj of ours.
    let (av, eq) = unsafe { (&*f.cast::<AvObj>(), &*b.cast::<EqObj>()) };
    if let Some(a) = av.shared.lock().avs.get_mut(av.id) {
        a.eq = Some(Arc::clone(&eq.eq));
    }
    0
}

/// Insert parsed addresses; report like `fi_av_insert`.
///
/// # Safety
/// `av` heads an AvObj; `fi_addr` is null or valid for `addrs.len()` writes.
unsafe fn av_insert_parsed(
    av: *mut sys::fid_av,
    addrs: &[Result<EpAddr, String>],
    fi_addr: *mut sys::fi_addr_t,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    let obj = unsafe { &*av.cast::<AvObj>() };
    let mut st = obj.shared.lock();
    let Some(state) = st.avs.get_mut(obj.id) else {
        return neg(flags::EINVAL);
    };
    let mut ok = 0;
    for (i, a) in addrs.iter().enumerate() {
        let v = match a {
            Ok(a) => {
                ok += 1;
                state.insert(*a)
            }
            Err(why) => {
                super::log::warn(&format!("fi_av_insert: address {i} refused: {why}"));
                flags::ADDR_NOTAVAIL
            }
        };
        if !fi_addr.is_null() {
            // SAFETY: the caller's contract: room for every address.
            unsafe { *fi_addr.add(i) = v };
        }
    }
    if state.event_flag
        && let Some(eq) = state.eq.clone()
    {
        {
            let entry = sys::fi_eq_entry {
                fid: (&raw const obj.fid.fid).cast_mut(),
                context,
                data: ok as u64,
            };
            // SAFETY: `fi_eq_entry` is plain data; viewed as its bytes.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (&raw const entry).cast::<u8>(),
                    size_of::<sys::fi_eq_entry>(),
                )
            }
            .to_vec();
            eq.push(EqEvent {
                event: sys::FI_AV_COMPLETE,
                bytes,
            });
            return 0;
        }
    }
    ok
}

unsafe extern "C" fn av_insert(
    av: *mut sys::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut sys::fi_addr_t,
    _fl: u64,
    context: *mut c_void,
) -> c_int {
    if addr.is_null() && count > 0 {
        return neg(flags::EINVAL);
    }
    let addrs: Vec<Result<EpAddr, String>> = (0..count)
        .map(|i| {
            // SAFETY: the API: `addr` holds `count` addresses of the
            // provider's format (16 bytes each).
            let b = unsafe {
                std::slice::from_raw_parts(addr.cast::<u8>().add(i * ADDR_BYTES), ADDR_BYTES)
            };
            EpAddr::from_bytes(b).map_err(|e| e.to_string())
        })
        .collect();
    // SAFETY: called through AV_OPS; `fi_addr` per the API.
    unsafe { av_insert_parsed(av, &addrs, fi_addr, context) }
}

fn resolve_v4(node: &str, port: u16) -> Result<EpAddr, String> {
    let ip = (node, port)
        .to_socket_addrs()
        .map_err(|e| format!("{node}: {e}"))?
        .find_map(|a| match a {
            SocketAddr::V4(v) => Some(*v.ip()),
            SocketAddr::V6(_) => None,
        })
        .ok_or_else(|| format!("{node} has no IPv4 address"))?;
    if port == 0 {
        return Err(format!("{node}: port 0"));
    }
    Ok(EpAddr { ip, cm_port: port })
}

unsafe extern "C" fn av_insertsvc(
    av: *mut sys::fid_av,
    node: *const c_char,
    service: *const c_char,
    fi_addr: *mut sys::fi_addr_t,
    _fl: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: null or valid C strings.
    let (n, s) = unsafe { (super::opt_str(node), super::opt_str(service)) };
    let a = match (n, s.and_then(|s| s.parse::<u16>().ok())) {
        (Some(n), Some(p)) => resolve_v4(&n, p),
        _ => Err("fi_av_insertsvc needs a node and a numeric service".into()),
    };
    // SAFETY: called through AV_OPS; `fi_addr` per the API.
    unsafe { av_insert_parsed(av, &[a], fi_addr, context) }
}

unsafe extern "C" fn av_insertsym(
    av: *mut sys::fid_av,
    node: *const c_char,
    nodecnt: usize,
    service: *const c_char,
    svccnt: usize,
    fi_addr: *mut sys::fi_addr_t,
    _fl: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: null or valid C strings.
    let (n, s) = unsafe { (super::opt_str(node), super::opt_str(service)) };
    let (Some(n), Some(p)) = (n, s.and_then(|s| s.parse::<u16>().ok())) else {
        return neg(flags::EINVAL);
    };
    let Ok(base) = resolve_v4(&n, p) else {
        return neg(flags::EINVAL);
    };
    let mut addrs = Vec::new();
    for i in 0..nodecnt {
        for j in 0..svccnt {
            let ip = Ipv4Addr::from(u32::from(base.ip).wrapping_add(i as u32));
            addrs.push(
                u16::try_from(usize::from(p) + j)
                    .map(|cm_port| EpAddr { ip, cm_port })
                    .map_err(|_| "port out of range".to_string()),
            );
        }
    }
    // SAFETY: called through AV_OPS; `fi_addr` per the API.
    unsafe { av_insert_parsed(av, &addrs, fi_addr, context) }
}

unsafe extern "C" fn av_remove(
    av: *mut sys::fid_av,
    fi_addr: *mut sys::fi_addr_t,
    count: usize,
    _fl: u64,
) -> c_int {
    // SAFETY: called through AV_OPS.
    let obj = unsafe { &*av.cast::<AvObj>() };
    let mut st = obj.shared.lock();
    let Some(state) = st.avs.get_mut(obj.id) else {
        return neg(flags::EINVAL);
    };
    let mut rc = 0;
    for i in 0..count {
        // SAFETY: the API: `fi_addr` holds `count` entries.
        let a = unsafe { *fi_addr.add(i) };
        if !state.remove(a) {
            rc = neg(flags::EINVAL);
        }
    }
    rc
}

unsafe extern "C" fn av_lookup(
    av: *mut sys::fid_av,
    fi_addr: sys::fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    // SAFETY: called through AV_OPS.
    let obj = unsafe { &*av.cast::<AvObj>() };
    let st = obj.shared.lock();
    let Some(a) = st.avs.get(obj.id).and_then(|s| s.lookup(fi_addr)) else {
        return neg(flags::ENOENT);
    };
    let bytes = a.to_bytes();
    // SAFETY: `addrlen` valid; `addr` valid for `*addrlen` bytes.
    unsafe {
        let room = *addrlen;
        if !addr.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast::<u8>(), room.min(ADDR_BYTES));
        }
        *addrlen = ADDR_BYTES;
    }
    0
}

unsafe extern "C" fn av_straddr(
    _av: *mut sys::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    // SAFETY: the API: `addr` is one address of the provider's format.
    let b = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), ADDR_BYTES) };
    let s = match EpAddr::from_bytes(b) {
        Ok(a) => format!("fi_sockaddr_in://{a}"),
        Err(e) => format!("(invalid: {e})"),
    };
    // SAFETY: `len` valid; `buf` valid for `*len` bytes.
    unsafe {
        write_cstr(buf, *len, &s);
        *len = s.len() + 1;
    }
    buf
}

// ------------------------------------------------------------------ CQ

#[repr(C)]
pub(super) struct CqObj {
    fid: sys::fid_cq,
    pub(super) shared: Arc<DomainShared>,
    pub(super) id: usize,
    api_version: u32,
}

static CQ_FI_OPS: sys::fi_ops = fid_ops(cq_close, None, Some(cq_control));
static CQ_OPS: sys::fi_ops_cq = sys::fi_ops_cq {
    size: size_of::<sys::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
};

unsafe extern "C" fn cq_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
    cq: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    // SAFETY: called through DOMAIN_OPS; `attr` per the API.
    let (d, a) = unsafe { (domain_of(domain), attr.as_ref()) };
    let mut format = sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT;
    if let Some(a) = a {
        if !matches!(
            a.wait_obj,
            sys::fi_wait_obj_FI_WAIT_NONE
                | sys::fi_wait_obj_FI_WAIT_UNSPEC
                | sys::fi_wait_obj_FI_WAIT_YIELD
        ) {
            super::log::warn(&format!(
                "fi_cq_open: wait object {} is not offered (FI_WAIT_NONE, FI_WAIT_UNSPEC: fi_cq_sread blocks)",
                a.wait_obj
            ));
            return neg(flags::ENOSYS);
        }
        format = match a.format {
            sys::fi_cq_format_FI_CQ_FORMAT_UNSPEC => sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT,
            f @ (sys::fi_cq_format_FI_CQ_FORMAT_CONTEXT
            | sys::fi_cq_format_FI_CQ_FORMAT_MSG
            | sys::fi_cq_format_FI_CQ_FORMAT_DATA
            | sys::fi_cq_format_FI_CQ_FORMAT_TAGGED) => f,
            other => {
                super::log::warn(&format!("fi_cq_open: CQ format {other} is unknown"));
                return neg(flags::EINVAL);
            }
        };
    }
    let id = d.shared.lock().cqs.insert(CqState::new(format));
    let obj = CqObj {
        fid: sys::fid_cq {
            fid: fid(sys::FI_CLASS_CQ, context, &CQ_FI_OPS),
            ops: (&raw const CQ_OPS).cast_mut(),
        },
        shared: Arc::clone(&d.shared),
        id,
        api_version: d.api_version,
    };
    // SAFETY: the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_CQ, cq) }
}

unsafe extern "C" fn cq_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through CQ_FI_OPS.
    let obj = unsafe { reclaim(f.cast::<CqObj>()) };
    let mut st = obj.shared.lock();
    st.cqs.remove(obj.id);
    for id in st.eps.slots() {
        if let Some(e) = st.eps.get_mut(id) {
            if e.tx_cq.is_some_and(|b| b.cq == obj.id) {
                e.tx_cq = None;
            }
            if e.rx_cq.is_some_and(|b| b.cq == obj.id) {
                e.rx_cq = None;
            }
        }
    }
    0
}

unsafe extern "C" fn cq_control(_f: *mut sys::fid, _cmd: c_int, _arg: *mut c_void) -> c_int {
    neg(flags::ENOSYS)
}

fn entry_size(format: u32) -> usize {
    match format {
        sys::fi_cq_format_FI_CQ_FORMAT_MSG => size_of::<sys::fi_cq_msg_entry>(),
        sys::fi_cq_format_FI_CQ_FORMAT_DATA => size_of::<sys::fi_cq_data_entry>(),
        sys::fi_cq_format_FI_CQ_FORMAT_TAGGED => size_of::<sys::fi_cq_tagged_entry>(),
        _ => size_of::<sys::fi_cq_entry>(),
    }
}

/// Write entry `e` as entry `i` of the application's array.
///
/// # Safety
/// `buf` holds at least `i + 1` entries of `format`.
unsafe fn write_entry(format: u32, buf: *mut c_void, i: usize, e: &CqEntry) {
    let at = buf.cast::<u8>().wrapping_add(i * entry_size(format));
    let ctx = e.op_context as *mut c_void;
    // SAFETY: the caller's contract: room for entry `i` of this format.
    unsafe {
        match format {
            sys::fi_cq_format_FI_CQ_FORMAT_MSG => at
                .cast::<sys::fi_cq_msg_entry>()
                .write_unaligned(sys::fi_cq_msg_entry {
                    op_context: ctx,
                    flags: e.flags,
                    len: e.len,
                }),
            sys::fi_cq_format_FI_CQ_FORMAT_DATA => at
                .cast::<sys::fi_cq_data_entry>()
                .write_unaligned(sys::fi_cq_data_entry {
                    op_context: ctx,
                    flags: e.flags,
                    len: e.len,
                    buf: e.buf as *mut c_void,
                    data: e.data,
                }),
            sys::fi_cq_format_FI_CQ_FORMAT_TAGGED => at
                .cast::<sys::fi_cq_tagged_entry>()
                .write_unaligned(sys::fi_cq_tagged_entry {
                    op_context: ctx,
                    flags: e.flags,
                    len: e.len,
                    buf: e.buf as *mut c_void,
                    data: e.data,
                    tag: e.tag,
                }),
            _ => at
                .cast::<sys::fi_cq_entry>()
                .write_unaligned(sys::fi_cq_entry { op_context: ctx }),
        }
    }
}

/// Read up to `count` completions (`src`: also their sources).
///
/// # Safety
/// `buf` holds `count` entries of the CQ's format; `src` null or `count` addresses.
unsafe fn cq_read_into(
    obj: &CqObj,
    buf: *mut c_void,
    count: usize,
    src: *mut sys::fi_addr_t,
) -> isize {
    let mut st = obj.shared.lock();
    let Some(q) = st.cqs.get_mut(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    let empty = q.entries.is_empty() && q.errors.is_empty();
    if empty && std::mem::take(&mut q.last_read_hit) {
        // Drained what the last read found: see `CqState::last_read_hit`.
        return neg(flags::EAGAIN) as isize;
    }
    if empty {
        st.progress_all();
    }
    let Some(q) = st.cqs.get_mut(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if !q.errors.is_empty() {
        drop(st);
        super::idle::note_work();
        return neg(flags::EAVAIL) as isize;
    }
    let n = count.min(q.entries.len());
    if n == 0 {
        drop(st);
        // Spin on a quiet host; give the CPU away now and then only while
        // something else wants it (see `idle`).
        super::idle::note_empty();
        return neg(flags::EAGAIN) as isize;
    }
    q.last_read_hit = true;
    let format = q.format;
    // Straight from the queue into the caller's array.
    for (i, e) in q.entries.drain(..n).enumerate() {
        // SAFETY: the caller's contract on `buf` and `src`; `i < n <= count`.
        unsafe {
            write_entry(format, buf, i, &e);
            if !src.is_null() {
                *src.add(i) = e.src;
            }
        }
    }
    drop(st);
    super::idle::note_work();
    n as isize
}

unsafe extern "C" fn cq_read(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize) -> isize {
    // SAFETY: called through CQ_OPS; `buf` per the API.
    unsafe { cq_read_into(&*cq.cast::<CqObj>(), buf, count, std::ptr::null_mut()) }
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut sys::fi_addr_t,
) -> isize {
    // SAFETY: called through CQ_OPS; `buf` and `src` per the API.
    unsafe { cq_read_into(&*cq.cast::<CqObj>(), buf, count, src) }
}

/// Block until the domain may have something new, at most `slice`.
pub(super) fn wait_for_progress(shared: &DomainShared, slice: Duration) {
    let handle = {
        let st = shared.lock();
        st.eps
            .slots()
            .find_map(|i| st.eps.get(i))
            .map(|e| (Arc::clone(&e.dev), e.verbs_cq()))
    };
    match handle {
        Some((dev, vcq)) => {
            if dev.req_notify_cq(vcq, false).is_ok() {
                let _ = dev.get_cq_event(slice);
            } else {
                std::thread::sleep(slice.min(Duration::from_millis(1)));
            }
        }
        None => std::thread::sleep(slice.min(Duration::from_millis(10))),
    }
}

fn timeout_of(ms: c_int) -> Option<Instant> {
    (ms >= 0).then(|| Instant::now() + Duration::from_millis(ms as u64))
}

/// `fi_cq_sread`: read, and block (on the device's completion channel)
/// while there is nothing.
///
/// # Safety
/// As [`cq_read_into`].
unsafe fn cq_sread_into(
    obj: &CqObj,
    buf: *mut c_void,
    count: usize,
    src: *mut sys::fi_addr_t,
    timeout: c_int,
) -> isize {
    let deadline = timeout_of(timeout);
    loop {
        // SAFETY: the caller's contract.
        let r = unsafe { cq_read_into(obj, buf, count, src) };
        if r != neg(flags::EAGAIN) as isize {
            return r;
        }
        let left = deadline.map_or(Duration::from_secs(1), |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return neg(flags::EAGAIN) as isize;
        }
        wait_for_progress(&obj.shared, left.min(Duration::from_secs(1)));
    }
}

unsafe extern "C" fn cq_sread(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: called through CQ_OPS; `buf` per the API.
    unsafe {
        cq_sread_into(
            &*cq.cast::<CqObj>(),
            buf,
            count,
            std::ptr::null_mut(),
            timeout,
        )
    }
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src: *mut sys::fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    // SAFETY: called through CQ_OPS; `buf` and `src` per the API.
    unsafe { cq_sread_into(&*cq.cast::<CqObj>(), buf, count, src, timeout) }
}

unsafe extern "C" fn cq_signal(_cq: *mut sys::fid_cq) -> c_int {
    0
}

unsafe extern "C" fn cq_readerr(
    cq: *mut sys::fid_cq,
    buf: *mut sys::fi_cq_err_entry,
    _fl: u64,
) -> isize {
    // SAFETY: called through CQ_OPS.
    let obj = unsafe { &*cq.cast::<CqObj>() };
    if buf.is_null() {
        return neg(flags::EINVAL) as isize;
    }
    let mut st = obj.shared.lock();
    let Some(q) = st.cqs.get_mut(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    let Some(e) = q.errors.pop_front() else {
        return neg(flags::EAGAIN) as isize;
    };
    let prov_errno = q.keep_text(&e.text);
    let text = CString::new(e.text.replace('\0', " ")).unwrap_or_default();
    let new_layout = obj.api_version >= caps::API_1_5;
    // SAFETY: `buf` is the application's error entry; from API 1.5 on it
    // has `err_data_size` (before, the field is not touched). A user
    // buffer in `err_data` is valid for `err_data_size` bytes (API 1.5).
    unsafe {
        let user_size = if new_layout {
            (&raw const (*buf).err_data_size).read()
        } else {
            0
        };
        let user_data = (&raw const (*buf).err_data).read();
        (&raw mut (*buf).op_context).write(e.entry.op_context as *mut c_void);
        (&raw mut (*buf).flags).write(e.entry.flags);
        (&raw mut (*buf).len).write(e.entry.len);
        (&raw mut (*buf).buf).write(e.entry.buf as *mut c_void);
        (&raw mut (*buf).data).write(e.entry.data);
        (&raw mut (*buf).tag).write(e.entry.tag);
        (&raw mut (*buf).olen).write(e.olen);
        (&raw mut (*buf).err).write(e.err);
        (&raw mut (*buf).prov_errno).write(prov_errno);
        let bytes = text.as_bytes_with_nul();
        if user_size > 0 && !user_data.is_null() {
            let n = bytes.len().min(user_size);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), user_data.cast::<u8>(), n);
            if n > 0 {
                *user_data.cast::<u8>().add(n - 1) = 0;
            }
            (&raw mut (*buf).err_data_size).write(n);
        } else {
            (&raw mut (*buf).err_data).write(text.as_ptr().cast_mut().cast::<c_void>());
            if new_layout {
                (&raw mut (*buf).err_data_size).write(bytes.len());
            }
        }
    }
    q.last_err = Some(text);
    1
}

unsafe extern "C" fn cq_strerror(
    cq: *mut sys::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    // SAFETY: called through CQ_OPS.
    let obj = unsafe { &*cq.cast::<CqObj>() };
    let mut st = obj.shared.lock();
    let Some(q) = st.cqs.get_mut(obj.id) else {
        return c"metaroce: unknown completion queue".as_ptr();
    };
    let text = q.text(prov_errno).map_or_else(
        || format!("metaroce provider error {prov_errno}"),
        |c| c.to_string_lossy().into_owned(),
    );
    if !buf.is_null() {
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe { write_cstr(buf, len, &text) };
        return buf;
    }
    q.last_err = Some(CString::new(text).unwrap_or_default());
    q.last_err.as_ref().map_or(c"".as_ptr(), |c| c.as_ptr())
}

// ------------------------------------------------------------------ counter

#[repr(C)]
pub(super) struct CntrObj {
    fid: sys::fid_cntr,
    pub(super) shared: Arc<DomainShared>,
    pub(super) id: usize,
}

static CNTR_FI_OPS: sys::fi_ops = fid_ops(cntr_close, None, Some(cq_control));
static CNTR_OPS: sys::fi_ops_cntr = sys::fi_ops_cntr {
    size: size_of::<sys::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
};

unsafe extern "C" fn cntr_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cntr_attr,
    cntr: *mut *mut sys::fid_cntr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: called through DOMAIN_OPS; `attr` per the API.
    let (d, a) = unsafe { (domain_of(domain), attr.as_ref()) };
    if let Some(a) = a
        && !matches!(
            a.wait_obj,
            sys::fi_wait_obj_FI_WAIT_NONE
                | sys::fi_wait_obj_FI_WAIT_UNSPEC
                | sys::fi_wait_obj_FI_WAIT_YIELD
        )
    {
        super::log::warn("fi_cntr_open: only FI_WAIT_NONE / FI_WAIT_UNSPEC counters are offered");
        return neg(flags::ENOSYS);
    }
    let id = d.shared.lock().cntrs.insert(CntrState::default());
    let obj = CntrObj {
        fid: sys::fid_cntr {
            fid: fid(sys::FI_CLASS_CNTR, context, &CNTR_FI_OPS),
            ops: (&raw const CNTR_OPS).cast_mut(),
        },
        shared: Arc::clone(&d.shared),
        id,
    };
    // SAFETY: the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_CNTR, cntr) }
}

unsafe extern "C" fn cntr_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through CNTR_FI_OPS.
    let obj = unsafe { reclaim(f.cast::<CntrObj>()) };
    let mut st = obj.shared.lock();
    st.cntrs.remove(obj.id);
    for id in st.eps.slots() {
        if let Some(e) = st.eps.get_mut(id) {
            let c = &mut e.cntrs;
            for slot in [
                &mut c.send,
                &mut c.recv,
                &mut c.read,
                &mut c.write,
                &mut c.remote_read,
                &mut c.remote_write,
            ] {
                if *slot == Some(obj.id) {
                    *slot = None;
                }
            }
        }
    }
    0
}

fn with_cntr<R>(
    c: *mut sys::fid_cntr,
    progress: bool,
    f: impl FnOnce(&mut CntrState) -> R,
) -> Option<R> {
    // SAFETY: every caller is called through CNTR_OPS: `c` heads a CntrObj.
    let obj = unsafe { &*c.cast::<CntrObj>() };
    let mut st = obj.shared.lock();
    if progress {
        st.progress_all();
    }
    st.cntrs.get_mut(obj.id).map(f)
}

unsafe extern "C" fn cntr_read(c: *mut sys::fid_cntr) -> u64 {
    with_cntr(c, true, |s| s.value).unwrap_or(0)
}
unsafe extern "C" fn cntr_readerr(c: *mut sys::fid_cntr) -> u64 {
    with_cntr(c, true, |s| s.err).unwrap_or(0)
}
unsafe extern "C" fn cntr_add(c: *mut sys::fid_cntr, v: u64) -> c_int {
    with_cntr(c, false, |s| s.value = s.value.wrapping_add(v)).map_or(neg(flags::EINVAL), |()| 0)
}
unsafe extern "C" fn cntr_set(c: *mut sys::fid_cntr, v: u64) -> c_int {
    with_cntr(c, false, |s| s.value = v).map_or(neg(flags::EINVAL), |()| 0)
}
unsafe extern "C" fn cntr_adderr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    with_cntr(c, false, |s| s.err = s.err.wrapping_add(v)).map_or(neg(flags::EINVAL), |()| 0)
}
unsafe extern "C" fn cntr_seterr(c: *mut sys::fid_cntr, v: u64) -> c_int {
    with_cntr(c, false, |s| s.err = v).map_or(neg(flags::EINVAL), |()| 0)
}

unsafe extern "C" fn cntr_wait(c: *mut sys::fid_cntr, threshold: u64, timeout: c_int) -> c_int {
    let deadline = timeout_of(timeout);
    let start_err = with_cntr(c, false, |s| s.err).unwrap_or(0);
    loop {
        let Some((v, e)) = with_cntr(c, true, |s| (s.value, s.err)) else {
            return neg(flags::EINVAL);
        };
        if v >= threshold {
            return 0;
        }
        if e != start_err {
            return neg(flags::EAVAIL);
        }
        let left = deadline.map_or(Duration::from_secs(1), |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return neg(flags::ETIMEDOUT);
        }
        // SAFETY: called through CNTR_OPS: `c` heads a CntrObj.
        let obj = unsafe { &*c.cast::<CntrObj>() };
        wait_for_progress(&obj.shared, left.min(Duration::from_secs(1)));
    }
}

// ------------------------------------------------------------------ MR

#[repr(C)]
pub(super) struct MrObj {
    fid: sys::fid_mr,
    shared: Arc<DomainShared>,
    key: u64,
}

static MR_FI_OPS: sys::fi_ops = fid_ops(mr_close, Some(mr_bind), Some(mr_control));

unsafe extern "C" fn mr_bind(_f: *mut sys::fid, _b: *mut sys::fid, _fl: u64) -> c_int {
    // FI_MR_ENDPOINT: a region serves every endpoint of its domain.
    0
}

unsafe extern "C" fn mr_control(_f: *mut sys::fid, cmd: c_int, _arg: *mut c_void) -> c_int {
    if cmd == sys::FI_ENABLE as c_int {
        0
    } else {
        neg(flags::ENOSYS)
    }
}

unsafe extern "C" fn mr_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through MR_FI_OPS.
    let obj = unsafe { reclaim(f.cast::<MrObj>()) };
    obj.shared.lock().mrs.by_key.remove(&obj.key);
    0
}

/// Register `len` bytes at `base` (the arguments of `fi_mr_reg`).
#[allow(clippy::too_many_arguments)]
///
/// # Safety
/// `domain` is a DomainObj's fid; `base..base+len` is the application's
/// memory, valid until the MR closes; `mr` valid for a write.
unsafe fn mr_register(
    domain: *mut sys::fid,
    base: usize,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    if class_of(domain.cast::<c_void>()) != Some(sys::FI_CLASS_DOMAIN) {
        return neg(flags::EINVAL);
    }
    // SAFETY: checked above to be a live DomainObj.
    let d = unsafe { &*domain.cast::<DomainObj>() };
    let mut st = d.shared.lock();
    let key = if st.prov_keys {
        // Unique and hard to guess: a counter under random high bits.
        let k = (metaroce_udp::os_seed() << 32) ^ st.next_key;
        st.next_key += 1;
        k
    } else {
        requested_key
    };
    if st.mrs.by_key.contains_key(&key) {
        return neg(flags::ENOKEY);
    }
    let access = if access == 0 {
        flags::REMOTE_READ | flags::REMOTE_WRITE
    } else {
        access
    };
    // SAFETY: the caller's contract on the region's memory.
    let region = unsafe { UserRegion::new(base, len) };
    st.mrs.by_key.insert(
        key,
        MrEntry {
            region,
            access,
            offset,
        },
    );
    drop(st);
    let obj = MrObj {
        fid: sys::fid_mr {
            fid: fid(sys::FI_CLASS_MR, context, &MR_FI_OPS),
            mem_desc: std::ptr::null_mut(),
            key,
        },
        shared: Arc::clone(&d.shared),
        key,
    };
    let p = Box::into_raw(Box::new(obj));
    // SAFETY: `p` is freshly allocated; its descriptor points at itself
    // (the provider ignores descriptors, but applications pass them on).
    unsafe { (*p).fid.mem_desc = p.cast::<c_void>() };
    register(p.cast::<c_void>(), sys::FI_CLASS_MR);
    // SAFETY: the caller's out pointer.
    unsafe { *mr = p.cast::<sys::fid_mr>() };
    0
}

unsafe extern "C" fn mr_reg(
    fid_: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    _fl: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: the API: `buf..buf+len` stays valid until the MR closes.
    unsafe {
        mr_register(
            fid_,
            buf as usize,
            len,
            access,
            offset,
            requested_key,
            mr,
            context,
        )
    }
}

unsafe extern "C" fn mr_regv(
    fid_: *mut sys::fid,
    iov: *const sys::iovec,
    count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    _fl: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    if count != 1 || iov.is_null() {
        return neg(flags::EINVAL);
    }
    // SAFETY: the API: one iovec, valid until the MR closes.
    unsafe {
        let v = &*iov;
        mr_register(
            fid_,
            v.iov_base as usize,
            v.iov_len,
            access,
            offset,
            requested_key,
            mr,
            context,
        )
    }
}

unsafe extern "C" fn mr_regattr(
    fid_: *mut sys::fid,
    attr: *const sys::fi_mr_attr,
    _fl: u64,
    mr: *mut *mut sys::fid_mr,
) -> c_int {
    // SAFETY: the API: a valid attribute structure with `iov_count` iovecs.
    unsafe {
        let Some(a) = attr.as_ref() else {
            return neg(flags::EINVAL);
        };
        if a.iface != sys::fi_hmem_iface_FI_HMEM_SYSTEM {
            super::log::warn("fi_mr_regattr: only host memory (FI_HMEM_SYSTEM) is supported");
            return neg(flags::ENOSYS);
        }
        if a.iov_count != 1 || a.mr_iov.is_null() {
            return neg(flags::EINVAL);
        }
        let v = &*a.mr_iov;
        mr_register(
            fid_,
            v.iov_base as usize,
            v.iov_len,
            a.access,
            a.offset,
            a.requested_key,
            mr,
            a.context,
        )
    }
}
