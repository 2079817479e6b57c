//! The endpoint object and its op tables (`fi_ops_ep`, `fi_ops_cm`,
//! `fi_ops_msg`, `fi_ops_tagged`, `fi_ops_rma`, `fi_ops_atomic`, and a
//! `-FI_ENOSYS` table for collectives).

use super::mem::UserIov;
use super::objects::{AvObj, CntrObj, CqObj, domain_of, enosys, fid, fid_ops, publish, reclaim};
use super::{class_of, neg, sys};
use crate::addr::{ADDR_BYTES, EpAddr};
use crate::atomic::{self, Call, Datatype};
use crate::conn::{Listener, spawn_connect};
use crate::domain::DomainShared;
use crate::endpoint::{AtomicReq, ConnectJob, CqBinding, EpState, RecvReq, RmaReq, SendReq};
use crate::flags;
use crate::matching::RecvFilter;
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[repr(C)]
pub(super) struct EpObj {
    fid: sys::fid_ep,
    shared: Arc<DomainShared>,
    id: usize,
    instance: u64,
}

static EP_FI_OPS: sys::fi_ops = fid_ops(ep_close, Some(ep_bind), Some(ep_control));
static EP_OPS: sys::fi_ops_ep = sys::fi_ops_ep {
    size: size_of::<sys::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(tx_ctx_enosys),
    rx_ctx: Some(rx_ctx_enosys),
    rx_size_left: Some(size_left),
    tx_size_left: Some(size_left),
};
enosys!(
    tx_ctx_enosys(
        *mut sys::fid_ep,
        c_int,
        *mut sys::fi_tx_attr,
        *mut *mut sys::fid_ep,
        *mut c_void,
    ) -> c_int
);
enosys!(
    rx_ctx_enosys(
        *mut sys::fid_ep,
        c_int,
        *mut sys::fi_rx_attr,
        *mut *mut sys::fid_ep,
        *mut c_void,
    ) -> c_int
);

static CM_OPS: sys::fi_ops_cm = sys::fi_ops_cm {
    size: size_of::<sys::fi_ops_cm>(),
    setname: Some(ep_setname),
    getname: Some(ep_getname),
    getpeer: Some(getpeer_enosys),
    connect: Some(connect_enosys),
    listen: Some(listen_enosys),
    accept: Some(accept_enosys),
    reject: Some(reject_enosys),
    shutdown: Some(shutdown_enosys),
    join: Some(join_enosys),
};
enosys!(getpeer_enosys(*mut sys::fid_ep, *mut c_void, *mut usize) -> c_int);
enosys!(connect_enosys(*mut sys::fid_ep, *const c_void, *const c_void, usize) -> c_int);
enosys!(listen_enosys(*mut sys::fid_pep) -> c_int);
enosys!(accept_enosys(*mut sys::fid_ep, *const c_void, usize) -> c_int);
enosys!(reject_enosys(*mut sys::fid_pep, sys::fid_t, *const c_void, usize) -> c_int);
enosys!(shutdown_enosys(*mut sys::fid_ep, u64) -> c_int);
enosys!(
    join_enosys(*mut sys::fid_ep, *const c_void, u64, *mut *mut sys::fid_mc, *mut c_void) -> c_int
);

static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
    size: size_of::<sys::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
    size: size_of::<sys::fi_ops_tagged>(),
    recv: Some(t_recv),
    recvv: Some(t_recvv),
    recvmsg: Some(t_recvmsg),
    send: Some(t_send),
    sendv: Some(t_sendv),
    sendmsg: Some(t_sendmsg),
    inject: Some(t_inject),
    senddata: Some(t_senddata),
    injectdata: Some(t_injectdata),
};

static RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
    size: size_of::<sys::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

static ATOMIC_OPS: sys::fi_ops_atomic = sys::fi_ops_atomic {
    size: size_of::<sys::fi_ops_atomic>(),
    write: Some(at_write),
    writev: Some(at_writev),
    writemsg: Some(at_writemsg),
    inject: Some(at_inject),
    readwrite: Some(at_readwrite),
    readwritev: Some(at_readwritev),
    readwritemsg: Some(at_readwritemsg),
    compwrite: Some(at_compwrite),
    compwritev: Some(at_compwritev),
    compwritemsg: Some(at_compwritemsg),
    writevalid: Some(at_writevalid),
    readwritevalid: Some(at_readwritevalid),
    compwritevalid: Some(at_compwritevalid),
};
type Dt = sys::fi_datatype;
type Aop = sys::fi_op;
type Ep = *mut sys::fid_ep;
type V = *mut c_void;
type CV = *const c_void;
type Ioc = *const sys::fi_ioc;
type IocM = *mut sys::fi_ioc;
type Addr = sys::fi_addr_t;

static COLL_OPS: sys::fi_ops_collective = sys::fi_ops_collective {
    size: size_of::<sys::fi_ops_collective>(),
    barrier: Some(co_barrier),
    broadcast: Some(co_broadcast),
    alltoall: Some(co_alltoall),
    allreduce: Some(co_allreduce),
    allgather: Some(co_allgather),
    reduce_scatter: Some(co_allreduce),
    reduce: Some(co_reduce),
    scatter: Some(co_scatter),
    gather: Some(co_scatter),
    msg: Some(co_msg),
    barrier2: Some(co_barrier2),
};
enosys!(co_barrier(Ep, Addr, V) -> isize);
enosys!(co_barrier2(Ep, Addr, u64, V) -> isize);
enosys!(co_broadcast(Ep, V, usize, V, Addr, Addr, Dt, u64, V) -> isize);
enosys!(co_alltoall(Ep, CV, usize, V, V, V, Addr, Dt, u64, V) -> isize);
enosys!(co_allreduce(Ep, CV, usize, V, V, V, Addr, Dt, Aop, u64, V) -> isize);
enosys!(co_allgather(Ep, CV, usize, V, V, V, Addr, Dt, u64, V) -> isize);
enosys!(co_reduce(Ep, CV, usize, V, V, V, Addr, Addr, Dt, Aop, u64, V) -> isize);
enosys!(co_scatter(Ep, CV, usize, V, V, V, Addr, Addr, Dt, u64, V) -> isize);
enosys!(co_msg(Ep, *const sys::fi_msg_collective, IocM, *mut V, usize, u64) -> isize);

static INSTANCES: AtomicU64 = AtomicU64::new(1);

pub(super) unsafe extern "C" fn endpoint2_open(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    ep: *mut *mut sys::fid_ep,
    _fl: u64,
    context: *mut c_void,
) -> c_int {
    // SAFETY: same arguments as `endpoint_open`.
    unsafe { endpoint_open(domain, info, ep, context) }
}

pub(super) unsafe extern "C" fn endpoint_open(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    ep: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    // SAFETY: called through the domain's op table; `info` per the API.
    let (d, info) = unsafe { (domain_of(domain), info.as_ref()) };
    let Some(info) = info else {
        return neg(flags::EINVAL);
    };
    let directed = (info.caps & flags::DIRECTED_RECV != 0)
        // SAFETY: an fi_info's attribute pointers are null or valid.
        || unsafe { info.rx_attr.as_ref() }.is_some_and(|a| a.caps & flags::DIRECTED_RECV != 0);
    // SAFETY: the attribute pointers of an fi_info are null or valid; the
    // source address, if set, has `src_addrlen` bytes.
    let (ep_type, tx_flags, rx_flags, src) = unsafe {
        let ep_type = info
            .ep_attr
            .as_ref()
            .map_or(sys::fi_ep_type_FI_EP_RDM, |a| a.type_);
        let tx = info.tx_attr.as_ref().map_or(0, |a| a.op_flags);
        let rx = info.rx_attr.as_ref().map_or(0, |a| a.op_flags);
        let src = (!info.src_addr.is_null() && info.src_addrlen >= ADDR_BYTES)
            .then(|| std::slice::from_raw_parts(info.src_addr.cast::<u8>(), ADDR_BYTES))
            .and_then(|b| {
                // A source address names the IP (and maybe the listener port).
                let fam = u16::from_ne_bytes([b[0], b[1]]);
                (fam == 2).then(|| {
                    (
                        Ipv4Addr::new(b[4], b[5], b[6], b[7]),
                        u16::from_be_bytes([b[2], b[3]]),
                    )
                })
            });
        (ep_type, tx, rx, src)
    };
    if ep_type != sys::fi_ep_type_FI_EP_RDM && ep_type != sys::fi_ep_type_FI_EP_UNSPEC {
        super::log::warn("fi_endpoint: only FI_EP_RDM endpoints are offered");
        return neg(flags::EINVAL);
    }
    let mut cfg = (*super::config()).clone();
    if let Some((ip, _)) = src.filter(|(ip, _)| !ip.is_unspecified()) {
        cfg.bind_ip = ip;
    }
    let cfg = Arc::new(cfg);
    let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
    let mut state = match EpState::open(Arc::clone(&cfg), instance) {
        Ok(s) => s,
        Err(why) => {
            super::log::warn(&format!("fi_endpoint: {why}"));
            return neg(flags::ENODATA);
        }
    };
    state.tx_op_flags = tx_flags;
    state.rx_op_flags = rx_flags;
    state.directed_recv = directed;
    let id = d.shared.lock().eps.insert(state);
    let port = src.map_or(0, |(_, p)| p);
    match Listener::start(cfg.bind_ip, port, Arc::downgrade(&d.shared), id, instance) {
        Ok(l) => {
            let mut st = d.shared.lock();
            if let Some(e) = st.eps.get_mut(id) {
                e.name.cm_port = l.port;
                e.listener = Some(l);
                super::log::info(&format!(
                    "endpoint {} opened (MetaRoCE device {})",
                    e.name,
                    e.dev.addr()
                ));
            }
        }
        Err(e) => {
            d.shared.lock().eps.remove(id);
            super::log::warn(&format!(
                "fi_endpoint: connection-manager listener on {}: {e}",
                cfg.bind_ip
            ));
            return neg(flags::EADDRNOTAVAIL);
        }
    }
    let obj = EpObj {
        fid: sys::fid_ep {
            fid: fid(sys::FI_CLASS_EP, context, &EP_FI_OPS),
            ops: (&raw const EP_OPS).cast_mut(),
            cm: (&raw const CM_OPS).cast_mut(),
            msg: (&raw const MSG_OPS).cast_mut(),
            rma: (&raw const RMA_OPS).cast_mut(),
            tagged: (&raw const TAGGED_OPS).cast_mut(),
            atomic: (&raw const ATOMIC_OPS).cast_mut(),
            collective: (&raw const COLL_OPS).cast_mut(),
        },
        shared: Arc::clone(&d.shared),
        id,
        instance,
    };
    // SAFETY: the caller's out pointer.
    unsafe { publish(obj, sys::FI_CLASS_EP, ep) }
}

/// The endpoint object behind an endpoint fid.
///
/// # Safety
/// `ep` heads a live `EpObj` (the call came through one of its tables).
unsafe fn ep_of<'a>(ep: *mut sys::fid_ep) -> &'a EpObj {
    // SAFETY: the caller's contract.
    unsafe { &*ep.cast::<EpObj>() }
}

unsafe extern "C" fn ep_close(f: *mut sys::fid) -> c_int {
    // SAFETY: called through EP_FI_OPS.
    let obj = unsafe { reclaim(f.cast::<EpObj>()) };
    let state = obj.shared.lock().eps.remove(obj.id);
    if let Some(mut e) = state {
        // Stop answering peers before the device goes.
        drop(e.listener.take());
        // Acknowledge what came last and answer a peer resending it (its
        // ACK lost) before the device goes: a peer's final send completes.
        let quiet = std::time::Duration::from_millis(e.cfg.linger_ms);
        e.dev
            .linger(quiet, std::time::Duration::from_secs(1).max(quiet));
        e.release_lent();
        let summary = e.summary();
        super::log::info(&summary);
        // Shown on stderr with FI_METAROCE_STATS=1 (or a log filter
        // naming it): see `trace`.
        tracing::info!(target: super::trace::TARGET, "{summary}");
    }
    0
}

unsafe extern "C" fn ep_bind(f: *mut sys::fid, b: *mut sys::fid, fl: u64) -> c_int {
    // SAFETY: called through EP_FI_OPS.
    let obj = unsafe { &*f.cast::<EpObj>() };
    let class = class_of(b.cast::<c_void>());
    let mut st = obj.shared.lock();
    match class {
        Some(sys::FI_CLASS_AV) => {
            // SAFETY: checked to be a live AvObj of ours.
            let av = unsafe { &*b.cast::<AvObj>() };
            if !Arc::ptr_eq(&av.shared, &obj.shared) {
                return neg(flags::EINVAL);
            }
            if let Some(e) = st.eps.get_mut(obj.id) {
                e.av = Some(av.id);
            }
        }
        Some(sys::FI_CLASS_CQ) => {
            // SAFETY: checked to be a live CqObj of ours.
            let cq = unsafe { &*b.cast::<CqObj>() };
            if !Arc::ptr_eq(&cq.shared, &obj.shared) {
                return neg(flags::EINVAL);
            }
            let binding = CqBinding {
                cq: cq.id,
                selective: fl & flags::SELECTIVE_COMPLETION != 0,
            };
            if fl & (flags::TRANSMIT | flags::RECV) == 0 {
                return neg(flags::EBADFLAGS);
            }
            if let Some(e) = st.eps.get_mut(obj.id) {
                if fl & flags::TRANSMIT != 0 {
                    e.tx_cq = Some(binding);
                }
                if fl & flags::RECV != 0 {
                    e.rx_cq = Some(binding);
                }
            }
        }
        Some(sys::FI_CLASS_CNTR) => {
            // SAFETY: checked to be a live CntrObj of ours.
            let c = unsafe { &*b.cast::<CntrObj>() };
            if !Arc::ptr_eq(&c.shared, &obj.shared) {
                return neg(flags::EINVAL);
            }
            if let Some(e) = st.eps.get_mut(obj.id) {
                let k = &mut e.cntrs;
                let id = Some(c.id);
                if fl & flags::SEND != 0 {
                    k.send = id;
                }
                if fl & flags::RECV != 0 {
                    k.recv = id;
                }
                if fl & flags::READ != 0 {
                    k.read = id;
                }
                if fl & flags::WRITE != 0 {
                    k.write = id;
                }
                if fl & flags::REMOTE_READ != 0 {
                    k.remote_read = id;
                }
                if fl & flags::REMOTE_WRITE != 0 {
                    k.remote_write = id;
                }
            }
        }
        Some(sys::FI_CLASS_EQ) | Some(sys::FI_CLASS_MR) => {}
        _ => return neg(flags::EINVAL),
    }
    0
}

unsafe extern "C" fn ep_control(f: *mut sys::fid, cmd: c_int, arg: *mut c_void) -> c_int {
    // SAFETY: called through EP_FI_OPS.
    let obj = unsafe { &*f.cast::<EpObj>() };
    let mut st = obj.shared.lock();
    let Some(e) = st.eps.get_mut(obj.id) else {
        return neg(flags::EINVAL);
    };
    match cmd as u32 {
        sys::FI_ENABLE => {
            if e.av.is_none() {
                super::log::warn("fi_enable: bind an address vector first");
                return neg(flags::ENOAV);
            }
            if e.tx_cq.is_none()
                && e.rx_cq.is_none()
                && e.cntrs.send.is_none()
                && e.cntrs.recv.is_none()
            {
                super::log::warn("fi_enable: bind a completion queue (or counters) first");
                return neg(flags::ENOCQ);
            }
            e.enabled = true;
            0
        }
        sys::FI_GETOPSFLAG | sys::FI_SETOPSFLAG if !arg.is_null() => {
            // SAFETY: the API: `arg` points at a u64 of flags.
            let fl = unsafe { &mut *arg.cast::<u64>() };
            let tx = *fl & flags::TRANSMIT != 0;
            let target = if tx {
                &mut e.tx_op_flags
            } else {
                &mut e.rx_op_flags
            };
            let mask = !(flags::TRANSMIT | flags::RECV);
            if cmd as u32 == sys::FI_GETOPSFLAG {
                *fl = *target;
            } else {
                *target = *fl & mask;
            }
            0
        }
        _ => neg(flags::ENOSYS),
    }
}

unsafe extern "C" fn ep_cancel(f: sys::fid_t, context: *mut c_void) -> isize {
    // SAFETY: called through EP_OPS of our endpoint.
    let obj = unsafe { &*f.cast::<EpObj>() };
    let mut st = obj.shared.lock();
    let Some((e, mut s)) = st.ep_and_sinks(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if e.cancel(&mut s, context as usize) {
        0
    } else {
        neg(flags::ENOENT) as isize
    }
}

unsafe extern "C" fn ep_getopt(
    _f: sys::fid_t,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut usize,
) -> c_int {
    if level == sys::FI_OPT_ENDPOINT as c_int
        && name == sys::FI_OPT_MIN_MULTI_RECV as c_int
        && !val.is_null()
        && !len.is_null()
    {
        // SAFETY: the API: `val` holds a size_t, `len` its size.
        unsafe {
            *val.cast::<usize>() = 0;
            *len = size_of::<usize>();
        }
        return 0;
    }
    neg(flags::ENOPROTOOPT)
}

unsafe extern "C" fn ep_setopt(
    _f: sys::fid_t,
    _level: c_int,
    _name: c_int,
    _val: *const c_void,
    _len: usize,
) -> c_int {
    neg(flags::ENOPROTOOPT)
}

unsafe extern "C" fn size_left(_ep: *mut sys::fid_ep) -> isize {
    crate::caps::TX_SIZE as isize
}

unsafe extern "C" fn ep_setname(f: sys::fid_t, addr: *mut c_void, len: usize) -> c_int {
    if addr.is_null() || len < ADDR_BYTES {
        return neg(flags::EINVAL);
    }
    // SAFETY: the API: `addr` holds `len` bytes.
    let b = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), ADDR_BYTES) };
    let Ok(want) = EpAddr::from_bytes(b) else {
        return neg(flags::EINVAL);
    };
    // SAFETY: called through CM_OPS of our endpoint.
    let obj = unsafe { &*f.cast::<EpObj>() };
    let mut st = obj.shared.lock();
    let Some(e) = st.eps.get_mut(obj.id) else {
        return neg(flags::EINVAL);
    };
    if e.enabled || want.ip != e.name.ip {
        return neg(flags::EOPBADSTATE);
    }
    if want.cm_port == e.name.cm_port {
        return 0;
    }
    drop(e.listener.take());
    match Listener::start(
        want.ip,
        want.cm_port,
        Arc::downgrade(&obj.shared),
        obj.id,
        obj.instance,
    ) {
        Ok(l) => {
            e.name.cm_port = l.port;
            e.listener = Some(l);
            0
        }
        Err(err) => {
            super::log::warn(&format!("fi_setname {want}: {err}"));
            neg(flags::EADDRNOTAVAIL)
        }
    }
}

unsafe extern "C" fn ep_getname(f: sys::fid_t, addr: *mut c_void, len: *mut usize) -> c_int {
    // SAFETY: called through CM_OPS of our endpoint.
    let obj = unsafe { &*f.cast::<EpObj>() };
    let name = {
        let st = obj.shared.lock();
        let Some(e) = st.eps.get(obj.id) else {
            return neg(flags::EINVAL);
        };
        e.name
    };
    if len.is_null() {
        return neg(flags::EINVAL);
    }
    let bytes = name.to_bytes();
    // SAFETY: `len` valid; `addr` valid for `*len` bytes.
    unsafe {
        let room = *len;
        *len = ADDR_BYTES;
        if room < ADDR_BYTES || addr.is_null() {
            return neg(flags::ETOOSMALL);
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr.cast::<u8>(), ADDR_BYTES);
    }
    0
}

// ------------------------------------------------------------ data path

fn run_job(obj: &EpObj, job: Option<ConnectJob>) {
    if let Some(job) = job {
        spawn_connect(Arc::downgrade(&obj.shared), obj.id, obj.instance, job);
    }
}

fn do_send(obj: &EpObj, r: SendReq) -> isize {
    let mut st = obj.shared.lock();
    let Some((e, mut s)) = st.ep_and_sinks(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if !e.enabled {
        return neg(flags::EOPBADSTATE) as isize;
    }
    let r = e.send(&mut s, r);
    drop(st);
    match r {
        Ok(job) => {
            run_job(obj, job);
            0
        }
        Err(e) => neg(e) as isize,
    }
}

fn do_recv(obj: &EpObj, r: RecvReq) -> isize {
    let mut st = obj.shared.lock();
    let peek = r.flags & flags::PEEK != 0;
    if peek {
        // Let what has arrived be seen.
        st.progress_all();
    }
    let Some((e, mut s)) = st.ep_and_sinks(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if !e.enabled {
        return neg(flags::EOPBADSTATE) as isize;
    }
    let mut r = r;
    if !e.directed_recv {
        // Without FI_DIRECTED_RECV the source argument is ignored.
        r.filter.src = crate::matching::ANY_SOURCE;
    }
    if r.flags & flags::MULTI_RECV != 0 {
        super::log::warn("FI_MULTI_RECV is not offered");
        return neg(flags::EBADFLAGS) as isize;
    }
    let rc = if peek {
        e.peek(&mut s, r)
    } else if r.flags & flags::CLAIM != 0 {
        e.claim(&mut s, r)
    } else {
        e.recv(&mut s, r)
    };
    match rc {
        Ok(()) => 0,
        Err(e) => neg(e) as isize,
    }
}

fn do_rma(obj: &EpObj, r: RmaReq, write: bool) -> isize {
    let mut st = obj.shared.lock();
    let Some((e, mut s)) = st.ep_and_sinks(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if !e.enabled {
        return neg(flags::EOPBADSTATE) as isize;
    }
    let r = if write {
        e.rma_write(&mut s, r)
    } else {
        e.rma_read(&mut s, r)
    };
    drop(st);
    match r {
        Ok(job) => {
            run_job(obj, job);
            0
        }
        Err(e) => neg(e) as isize,
    }
}

fn tx_flags(obj: &EpObj) -> u64 {
    obj.shared
        .lock()
        .eps
        .get(obj.id)
        .map_or(0, |e| e.tx_op_flags)
}

fn rx_flags(obj: &EpObj) -> u64 {
    obj.shared
        .lock()
        .eps
        .get(obj.id)
        .map_or(0, |e| e.rx_op_flags)
}

/// One buffer as an iovec list.
///
/// # Safety
/// `buf` is valid for `len` bytes for the life of the operation.
unsafe fn one(buf: *const c_void, len: usize) -> UserIov {
    // SAFETY: the caller's contract.
    unsafe { UserIov::new([(buf as usize, len)]) }
}

/// An iovec array as a list.
///
/// # Safety
/// `iov` holds `count` iovecs, each valid for the life of the operation.
unsafe fn many(iov: *const sys::iovec, count: usize) -> Result<UserIov, c_int> {
    if count > crate::caps::IOV_LIMIT || (count > 0 && iov.is_null()) {
        return Err(neg(flags::EINVAL));
    }
    if count == 0 {
        return Ok(UserIov::default());
    }
    // SAFETY: the caller's contract; `iov` is non-null (checked above).
    unsafe {
        let v = std::slice::from_raw_parts(iov, count);
        Ok(UserIov::new(
            v.iter().map(|x| (x.iov_base as usize, x.iov_len)),
        ))
    }
}

macro_rules! ep {
    ($ep:expr) => {{
        // SAFETY: every data-path entry is called through a table of our
        // endpoint, so `ep` heads a live EpObj.
        unsafe { ep_of($ep) }
    }};
}

macro_rules! iov_or_ret {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(rc) => return rc as isize,
        }
    };
}

unsafe extern "C" fn msg_recv(ep: Ep, buf: V, len: usize, _d: V, src: Addr, ctx: V) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: the receive buffer is ours until the completion.
    let iov = unsafe { one(buf, len) };
    do_recv(
        o,
        RecvReq {
            iov,
            filter: RecvFilter {
                src,
                tag: 0,
                ignore: 0,
            },
            context: ctx as usize,
            flags: rx_flags(o),
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_recvv(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    src: Addr,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: the iovecs are ours until the completion.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_recv(
        o,
        RecvReq {
            iov,
            filter: RecvFilter {
                src,
                tag: 0,
                ignore: 0,
            },
            context: ctx as usize,
            flags: rx_flags(o),
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_recvmsg(ep: Ep, msg: *const sys::fi_msg, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: as in `msg_recvv`.
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    do_recv(
        o,
        RecvReq {
            iov,
            filter: RecvFilter {
                src: m.addr,
                tag: 0,
                ignore: 0,
            },
            context: m.context as usize,
            flags: fl,
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_send(ep: Ep, buf: CV, len: usize, _d: V, dest: Addr, ctx: V) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: the send buffer is readable until the completion.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag: 0,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_sendv(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    dest: Addr,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag: 0,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_sendmsg(ep: Ep, msg: *const sys::fi_msg, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_send(
        o,
        SendReq {
            iov,
            dest: m.addr,
            tag: 0,
            data,
            context: m.context as usize,
            flags: fl,
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_inject(ep: Ep, buf: CV, len: usize, dest: Addr) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; the data is copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag: 0,
            data: None,
            context: 0,
            flags: flags::INJECT,
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_senddata(
    ep: Ep,
    buf: CV,
    len: usize,
    _d: V,
    data: u64,
    dest: Addr,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag: 0,
            data: Some(data),
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: false,
        },
    )
}

unsafe extern "C" fn msg_injectdata(ep: Ep, buf: CV, len: usize, data: u64, dest: Addr) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; the data is copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag: 0,
            data: Some(data),
            context: 0,
            flags: flags::INJECT,
            tagged: false,
        },
    )
}

unsafe extern "C" fn t_recv(
    ep: Ep,
    buf: V,
    len: usize,
    _d: V,
    src: Addr,
    tag: u64,
    ignore: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = unsafe { one(buf, len) };
    do_recv(
        o,
        RecvReq {
            iov,
            filter: RecvFilter { src, tag, ignore },
            context: ctx as usize,
            flags: rx_flags(o),
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_recvv(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    src: Addr,
    tag: u64,
    ignore: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_recv(
        o,
        RecvReq {
            iov,
            filter: RecvFilter { src, tag, ignore },
            context: ctx as usize,
            flags: rx_flags(o),
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_recvmsg(ep: Ep, msg: *const sys::fi_msg_tagged, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API (a peek may pass no buffers).
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    let filter = RecvFilter {
        src: m.addr,
        tag: m.tag,
        ignore: m.ignore,
    };
    do_recv(
        o,
        RecvReq {
            iov,
            filter,
            context: m.context as usize,
            flags: fl,
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_send(
    ep: Ep,
    buf: CV,
    len: usize,
    _d: V,
    dest: Addr,
    tag: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_sendv(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    dest: Addr,
    tag: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_sendmsg(ep: Ep, msg: *const sys::fi_msg_tagged, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_send(
        o,
        SendReq {
            iov,
            dest: m.addr,
            tag: m.tag,
            data,
            context: m.context as usize,
            flags: fl,
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_inject(ep: Ep, buf: CV, len: usize, dest: Addr, tag: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag,
            data: None,
            context: 0,
            flags: flags::INJECT,
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_senddata(
    ep: Ep,
    buf: CV,
    len: usize,
    _d: V,
    data: u64,
    dest: Addr,
    tag: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag,
            data: Some(data),
            context: ctx as usize,
            flags: tx_flags(o),
            tagged: true,
        },
    )
}

unsafe extern "C" fn t_injectdata(
    ep: Ep,
    buf: CV,
    len: usize,
    data: u64,
    dest: Addr,
    tag: u64,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_send(
        o,
        SendReq {
            iov,
            dest,
            tag,
            data: Some(data),
            context: 0,
            flags: flags::INJECT,
            tagged: true,
        },
    )
}

unsafe extern "C" fn rma_read(
    ep: Ep,
    buf: V,
    len: usize,
    _d: V,
    src: Addr,
    addr: u64,
    key: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: the buffer is ours until the completion.
    let iov = unsafe { one(buf, len) };
    do_rma(
        o,
        RmaReq {
            iov,
            peer: src,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
        false,
    )
}

unsafe extern "C" fn rma_readv(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    src: Addr,
    addr: u64,
    key: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_rma(
        o,
        RmaReq {
            iov,
            peer: src,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
        false,
    )
}

/// An RMA message's one remote segment.
///
/// # Safety
/// `m` is a valid `fi_msg_rma`.
unsafe fn rma_target(m: &sys::fi_msg_rma) -> Result<(u64, u64), c_int> {
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(neg(flags::EINVAL));
    }
    // SAFETY: the caller's contract: one valid remote iovec.
    let r = unsafe { &*m.rma_iov };
    Ok((r.addr, r.key))
}

unsafe extern "C" fn rma_readmsg(ep: Ep, msg: *const sys::fi_msg_rma, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let (addr, key) = iov_or_ret!(unsafe { rma_target(m) });
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    do_rma(
        o,
        RmaReq {
            iov,
            peer: m.addr,
            addr,
            key,
            data: None,
            context: m.context as usize,
            flags: fl,
        },
        false,
    )
}

unsafe extern "C" fn rma_write(
    ep: Ep,
    buf: CV,
    len: usize,
    _d: V,
    dest: Addr,
    addr: u64,
    key: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API (the data is copied at post time).
    let iov = unsafe { one(buf, len) };
    do_rma(
        o,
        RmaReq {
            iov,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
        true,
    )
}

unsafe extern "C" fn rma_writev(
    ep: Ep,
    iov: *const sys::iovec,
    _d: *mut V,
    count: usize,
    dest: Addr,
    addr: u64,
    key: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(iov, count) });
    do_rma(
        o,
        RmaReq {
            iov,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
        true,
    )
}

unsafe extern "C" fn rma_writemsg(ep: Ep, msg: *const sys::fi_msg_rma, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let (addr, key) = iov_or_ret!(unsafe { rma_target(m) });
    // SAFETY: the API.
    let iov = iov_or_ret!(unsafe { many(m.msg_iov, m.iov_count) });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_rma(
        o,
        RmaReq {
            iov,
            peer: m.addr,
            addr,
            key,
            data,
            context: m.context as usize,
            flags: fl,
        },
        true,
    )
}

unsafe extern "C" fn rma_inject(
    ep: Ep,
    buf: CV,
    len: usize,
    dest: Addr,
    addr: u64,
    key: u64,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_rma(
        o,
        RmaReq {
            iov,
            peer: dest,
            addr,
            key,
            data: None,
            context: 0,
            flags: flags::INJECT,
        },
        true,
    )
}

unsafe extern "C" fn rma_writedata(
    ep: Ep,
    buf: CV,
    len: usize,
    _d: V,
    data: u64,
    dest: Addr,
    addr: u64,
    key: u64,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API.
    let iov = unsafe { one(buf, len) };
    do_rma(
        o,
        RmaReq {
            iov,
            peer: dest,
            addr,
            key,
            data: Some(data),
            context: ctx as usize,
            flags: tx_flags(o),
        },
        true,
    )
}

unsafe extern "C" fn rma_injectdata(
    ep: Ep,
    buf: CV,
    len: usize,
    data: u64,
    dest: Addr,
    addr: u64,
    key: u64,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API; copied before this returns.
    let iov = unsafe { one(buf, len) };
    do_rma(
        o,
        RmaReq {
            iov,
            peer: dest,
            addr,
            key,
            data: Some(data),
            context: 0,
            flags: flags::INJECT,
        },
        true,
    )
}

// ------------------------------------------------------------ atomics

/// The operation and datatype of an atomic call, or `-FI_EOPNOTSUPP`.
fn atomic_kind(op: Aop, dt: Dt) -> Result<(atomic::Op, Datatype), c_int> {
    let parsed = atomic::Op::from_fi(op).and_then(|op| Ok((op, Datatype::from_fi(dt)?)));
    parsed.map_err(|e| {
        super::log::warn(&format!("atomic: {e}"));
        neg(e.fi_errno())
    })
}

/// `count` elements of `dt` at `buf` as a list; empty when the call
/// ignores the buffer (`ignored`: FI_ATOMIC_READ's operand).
///
/// # Safety
/// Unless ignored, `buf` is valid for `count` elements for the life of
/// the operation.
unsafe fn elements(
    buf: *const c_void,
    count: usize,
    dt: Datatype,
    ignored: bool,
) -> Result<UserIov, c_int> {
    if ignored {
        return Ok(UserIov::default());
    }
    let len = count
        .checked_mul(dt.size_bytes())
        .ok_or(neg(flags::EINVAL))?;
    if buf.is_null() && len > 0 {
        return Err(neg(flags::EINVAL));
    }
    // SAFETY: the caller's contract; non-null when it has bytes.
    Ok(unsafe { one(buf, len) })
}

/// An `fi_ioc` array as a list and its element count (the list empty when
/// the call ignores the buffers).
///
/// # Safety
/// `ioc` holds `n` entries, each (unless ignored) valid for its count of
/// elements for the life of the operation.
unsafe fn iocs(
    ioc: *const sys::fi_ioc,
    n: usize,
    dt: Datatype,
    ignored: bool,
) -> Result<(UserIov, usize), c_int> {
    if n > crate::caps::IOV_LIMIT || (n > 0 && ioc.is_null()) {
        return Err(neg(flags::EINVAL));
    }
    if n == 0 {
        return Ok((UserIov::default(), 0));
    }
    // SAFETY: the caller's contract; `ioc` is non-null (checked above).
    let v = unsafe { std::slice::from_raw_parts(ioc, n) };
    let mut segs = Vec::with_capacity(n);
    let mut count = 0usize;
    for x in v {
        count = count.checked_add(x.count).ok_or(neg(flags::EINVAL))?;
        let len = x
            .count
            .checked_mul(dt.size_bytes())
            .ok_or(neg(flags::EINVAL))?;
        if !ignored && x.addr.is_null() && len > 0 {
            return Err(neg(flags::EINVAL));
        }
        segs.push((x.addr as usize, len));
    }
    if ignored {
        return Ok((UserIov::default(), count));
    }
    // SAFETY: the caller's contract on every entry.
    Ok((unsafe { UserIov::new(segs) }, count))
}

/// An atomic message's target (one remote segment: address, elements,
/// key), its operation and datatype, refusing what it cannot carry.
///
/// # Safety
/// `m` is a valid `fi_msg_atomic`.
unsafe fn atomic_target(
    m: &sys::fi_msg_atomic,
    fl: u64,
) -> Result<(u64, usize, u64, atomic::Op, Datatype), c_int> {
    if fl & flags::TAGGED != 0 {
        super::log::warn("atomic: FI_TAGGED (atomics on tagged receive buffers) is not offered");
        return Err(neg(flags::EOPNOTSUPP));
    }
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(neg(flags::EINVAL));
    }
    let (op, dt) = atomic_kind(m.op, m.datatype)?;
    // SAFETY: the caller's contract: one valid remote segment.
    let r = unsafe { &*m.rma_iov };
    Ok((r.addr, r.count, r.key, op, dt))
}

fn do_atomic(obj: &EpObj, r: AtomicReq) -> isize {
    let mut st = obj.shared.lock();
    let Some((e, mut s)) = st.ep_and_sinks(obj.id) else {
        return neg(flags::EINVAL) as isize;
    };
    if !e.enabled {
        return neg(flags::EOPBADSTATE) as isize;
    }
    let r = e.atomic(&mut s, r);
    drop(st);
    match r {
        Ok(job) => {
            run_job(obj, job);
            0
        }
        Err(e) => neg(e) as isize,
    }
}

unsafe extern "C" fn at_write(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    // SAFETY: the API: the operand is readable until the call returns
    // (it is copied at post time).
    let operand = iov_or_ret!(unsafe { elements(buf, count, dt, false) });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Base,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result: UserIov::default(),
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_writev(
    ep: Ep,
    iov: Ioc,
    _d: *mut V,
    n: usize,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    // SAFETY: the API: `n` valid entries.
    let (operand, count) = iov_or_ret!(unsafe { iocs(iov, n, dt, false) });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Base,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result: UserIov::default(),
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_writemsg(ep: Ep, msg: *const sys::fi_msg_atomic, fl: u64) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let (addr, count, key, op, dt) = iov_or_ret!(unsafe { atomic_target(m, fl) });
    // SAFETY: the API: `iov_count` valid entries.
    let (operand, _) = iov_or_ret!(unsafe { iocs(m.msg_iov, m.iov_count, dt, false) });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_atomic(
        o,
        AtomicReq {
            call: Call::Base,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result: UserIov::default(),
            peer: m.addr,
            addr,
            key,
            data,
            context: m.context as usize,
            flags: fl,
        },
    )
}

unsafe extern "C" fn at_inject(
    ep: Ep,
    buf: CV,
    count: usize,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    // SAFETY: the API; the operand is copied before this returns.
    let operand = iov_or_ret!(unsafe { elements(buf, count, dt, false) });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Base,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result: UserIov::default(),
            peer: dest,
            addr,
            key,
            data: None,
            context: 0,
            flags: flags::INJECT,
        },
    )
}

unsafe extern "C" fn at_readwrite(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    result: V,
    _rd: V,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    let read = op == atomic::Op::Read;
    // SAFETY: the API: the operand is readable (unless FI_ATOMIC_READ
    // ignores it) and the result writable until the completion.
    let (operand, result) = iov_or_ret!(unsafe {
        elements(buf, count, dt, read).and_then(|a| Ok((a, elements(result, count, dt, false)?)))
    });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Fetch,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_readwritev(
    ep: Ep,
    iov: Ioc,
    _d: *mut V,
    n: usize,
    resultv: IocM,
    _rd: *mut V,
    result_n: usize,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    let read = op == atomic::Op::Read;
    // SAFETY: the API: valid entries; results writable until the completion.
    let ((operand, count), (result, _)) = iov_or_ret!(unsafe {
        iocs(iov, n, dt, read).and_then(|a| Ok((a, iocs(resultv, result_n, dt, false)?)))
    });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Fetch,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_readwritemsg(
    ep: Ep,
    msg: *const sys::fi_msg_atomic,
    resultv: IocM,
    _rd: *mut V,
    result_n: usize,
    fl: u64,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let (addr, count, key, op, dt) = iov_or_ret!(unsafe { atomic_target(m, fl) });
    let read = op == atomic::Op::Read;
    // SAFETY: the API: valid entries; results writable until the completion.
    let ((operand, _), (result, _)) = iov_or_ret!(unsafe {
        iocs(m.msg_iov, m.iov_count, dt, read)
            .and_then(|a| Ok((a, iocs(resultv, result_n, dt, false)?)))
    });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_atomic(
        o,
        AtomicReq {
            call: Call::Fetch,
            op,
            datatype: dt,
            count,
            operand,
            compare: UserIov::default(),
            result,
            peer: m.addr,
            addr,
            key,
            data,
            context: m.context as usize,
            flags: fl,
        },
    )
}

unsafe extern "C" fn at_compwrite(
    ep: Ep,
    buf: CV,
    count: usize,
    _d: V,
    compare: CV,
    _cd: V,
    result: V,
    _rd: V,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    // SAFETY: the API: operand and compare readable, result writable
    // until the completion.
    let (operand, compare, result) = iov_or_ret!(unsafe {
        elements(buf, count, dt, false).and_then(|a| {
            Ok((
                a,
                elements(compare, count, dt, false)?,
                elements(result, count, dt, false)?,
            ))
        })
    });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Compare,
            op,
            datatype: dt,
            count,
            operand,
            compare,
            result,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_compwritev(
    ep: Ep,
    iov: Ioc,
    _d: *mut V,
    n: usize,
    comparev: Ioc,
    _cd: *mut V,
    compare_n: usize,
    resultv: IocM,
    _rd: *mut V,
    result_n: usize,
    dest: Addr,
    addr: u64,
    key: u64,
    dt: Dt,
    op: Aop,
    ctx: V,
) -> isize {
    let o = ep!(ep);
    let (op, dt) = iov_or_ret!(atomic_kind(op, dt));
    // SAFETY: the API: valid entries for the life of the operation.
    let ((operand, count), (compare, _), (result, _)) = iov_or_ret!(unsafe {
        iocs(iov, n, dt, false).and_then(|a| {
            Ok((
                a,
                iocs(comparev, compare_n, dt, false)?,
                iocs(resultv, result_n, dt, false)?,
            ))
        })
    });
    do_atomic(
        o,
        AtomicReq {
            call: Call::Compare,
            op,
            datatype: dt,
            count,
            operand,
            compare,
            result,
            peer: dest,
            addr,
            key,
            data: None,
            context: ctx as usize,
            flags: tx_flags(o),
        },
    )
}

unsafe extern "C" fn at_compwritemsg(
    ep: Ep,
    msg: *const sys::fi_msg_atomic,
    comparev: Ioc,
    _cd: *mut V,
    compare_n: usize,
    resultv: IocM,
    _rd: *mut V,
    result_n: usize,
    fl: u64,
) -> isize {
    let o = ep!(ep);
    // SAFETY: the API: a valid message descriptor.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return neg(flags::EINVAL) as isize;
    };
    // SAFETY: the API.
    let (addr, count, key, op, dt) = iov_or_ret!(unsafe { atomic_target(m, fl) });
    // SAFETY: the API: valid entries for the life of the operation.
    let ((operand, _), (compare, _), (result, _)) = iov_or_ret!(unsafe {
        iocs(m.msg_iov, m.iov_count, dt, false).and_then(|a| {
            Ok((
                a,
                iocs(comparev, compare_n, dt, false)?,
                iocs(resultv, result_n, dt, false)?,
            ))
        })
    });
    let data = (fl & flags::REMOTE_CQ_DATA != 0).then_some(m.data);
    do_atomic(
        o,
        AtomicReq {
            call: Call::Compare,
            op,
            datatype: dt,
            count,
            operand,
            compare,
            result,
            peer: m.addr,
            addr,
            key,
            data,
            context: m.context as usize,
            flags: fl,
        },
    )
}

/// `fi_atomicvalid` and friends: 0 and the most elements per call, or
/// `-FI_EOPNOTSUPP`.
fn atomic_valid(obj: &EpObj, call: Call, dt: Dt, op: Aop, count: *mut usize) -> c_int {
    let eager_limit = obj
        .shared
        .lock()
        .eps
        .get(obj.id)
        .map_or_else(|| super::config().eager_limit, |e| e.cfg.eager_limit);
    match atomic::query(call, op, dt, eager_limit) {
        Ok((max, _size)) => {
            if !count.is_null() {
                // SAFETY: the API: `count` is null or points at a size_t.
                unsafe { *count = max };
            }
            0
        }
        Err(e) => neg(e.fi_errno()),
    }
}

unsafe extern "C" fn at_writevalid(ep: Ep, dt: Dt, op: Aop, count: *mut usize) -> c_int {
    atomic_valid(ep!(ep), Call::Base, dt, op, count)
}

unsafe extern "C" fn at_readwritevalid(ep: Ep, dt: Dt, op: Aop, count: *mut usize) -> c_int {
    atomic_valid(ep!(ep), Call::Fetch, dt, op, count)
}

unsafe extern "C" fn at_compwritevalid(ep: Ep, dt: Dt, op: Aop, count: *mut usize) -> c_int {
    atomic_valid(ep!(ep), Call::Compare, dt, op, count)
}
