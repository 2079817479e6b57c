//! `fi_getinfo` for the provider: read the hints, check them
//! (`crate::caps`), and answer with one `fi_info` allocated the way the
//! core frees it (`fi_dupinfo`, `malloc`, `strdup`).

use super::{config, opt_str, sys};
use crate::addr::{ADDR_BYTES, EpAddr};
use crate::caps::{self, Hints, Offer};
use crate::ffi::log;
use crate::flags;
use std::ffi::{c_char, c_int, c_void};
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};

/// Read the hints the application passed.
///
/// # Safety
/// `h` is a valid `fi_info` whose attribute pointers are null or valid.
unsafe fn read_hints(h: &sys::fi_info) -> Hints {
    let mut out = Hints {
        caps: h.caps,
        mode: h.mode,
        addr_format: h.addr_format,
        ..Hints::default()
    };
    // SAFETY: the caller's contract: each attribute pointer is null or valid.
    unsafe {
        if let Some(ep) = h.ep_attr.as_ref() {
            out.ep_type = ep.type_;
            out.max_msg_size = ep.max_msg_size;
            out.mem_tag_format = ep.mem_tag_format;
            out.tx_ctx_cnt = ep.tx_ctx_cnt;
            out.rx_ctx_cnt = ep.rx_ctx_cnt;
        }
        if let Some(tx) = h.tx_attr.as_ref() {
            out.tx_caps = tx.caps;
            out.tx_op_flags = tx.op_flags;
            out.tx_msg_order = tx.msg_order;
            out.tx_comp_order = tx.comp_order;
            out.inject_size = tx.inject_size;
            out.tx_size = tx.size;
            out.tx_iov_limit = tx.iov_limit;
            out.rma_iov_limit = tx.rma_iov_limit;
        }
        if let Some(rx) = h.rx_attr.as_ref() {
            out.rx_caps = rx.caps;
            out.rx_op_flags = rx.op_flags;
            out.rx_msg_order = rx.msg_order;
            out.rx_comp_order = rx.comp_order;
            out.rx_size = rx.size;
            out.rx_iov_limit = rx.iov_limit;
        }
        if let Some(d) = h.domain_attr.as_ref() {
            out.has_domain_attr = true;
            out.domain_name = opt_str(d.name);
            out.threading = d.threading;
            out.control_progress = d.control_progress;
            out.data_progress = d.data_progress;
            out.resource_mgmt = d.resource_mgmt;
            out.av_type = d.av_type;
            out.mr_mode = d.mr_mode as u32 as u64;
            out.mr_key_size = d.mr_key_size;
            out.cq_data_size = d.cq_data_size;
            out.domain_caps = d.caps;
        }
        if let Some(f) = h.fabric_attr.as_ref() {
            out.fabric_name = opt_str(f.name);
            out.prov_name = opt_str(f.prov_name);
        }
    }
    out
}

fn resolve(node: Option<&str>, service: Option<&str>) -> Result<Option<EpAddr>, String> {
    let port: u16 = match service {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| format!("service \"{s}\" is not a port number"))?,
    };
    let ip = match node {
        None => {
            return Ok((port != 0).then_some(EpAddr {
                ip: config().bind_ip,
                cm_port: port,
            }));
        }
        Some(n) => (n, port)
            .to_socket_addrs()
            .map_err(|e| format!("node \"{n}\": {e}"))?
            .find_map(|a| match a {
                SocketAddr::V4(v4) => Some(*v4.ip()),
                SocketAddr::V6(_) => None,
            })
            .ok_or_else(|| format!("node \"{n}\" has no IPv4 address"))?,
    };
    Ok(Some(EpAddr { ip, cm_port: port }))
}

/// A `malloc`ed copy of an address (the core frees it with `free`).
fn malloc_addr(a: EpAddr) -> *mut c_void {
    // SAFETY: plain allocation; checked for null below.
    let p = unsafe { libc::malloc(ADDR_BYTES) };
    if !p.is_null() {
        let bytes = a.to_bytes();
        // SAFETY: `p` has room for ADDR_BYTES bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), ADDR_BYTES) };
    }
    p
}

fn strdup(s: &std::ffi::CStr) -> *mut c_char {
    // SAFETY: `s` is a valid C string; the copy is freed by `fi_freeinfo`.
    unsafe { libc::strdup(s.as_ptr()) }
}

/// Fill a fresh `fi_info` from the offer.
///
/// # Safety
/// `fi` comes from `fi_dupinfo(NULL)`: every attribute pointer is valid.
unsafe fn fill(fi: &mut sys::fi_info, o: &Offer, src: Option<EpAddr>, dest: Option<EpAddr>) {
    fi.caps = o.caps;
    fi.mode = o.mode;
    fi.addr_format = sys::FI_SOCKADDR_IN;
    if let Some(a) = src {
        fi.src_addr = malloc_addr(a);
        fi.src_addrlen = if fi.src_addr.is_null() { 0 } else { ADDR_BYTES };
    }
    if let Some(a) = dest {
        fi.dest_addr = malloc_addr(a);
        fi.dest_addrlen = if fi.dest_addr.is_null() {
            0
        } else {
            ADDR_BYTES
        };
    }
    // SAFETY: the caller's contract: `fi_dupinfo(NULL)` allocated every attribute.
    let (tx, rx, ep, d, f) = unsafe {
        (
            &mut *fi.tx_attr,
            &mut *fi.rx_attr,
            &mut *fi.ep_attr,
            &mut *fi.domain_attr,
            &mut *fi.fabric_attr,
        )
    };
    tx.caps = o.tx_caps;
    tx.mode = o.mode;
    tx.op_flags = o.tx_op_flags;
    tx.msg_order = o.msg_order;
    tx.comp_order = 0;
    tx.inject_size = o.inject_size;
    tx.size = o.tx_size;
    tx.iov_limit = o.iov_limit;
    tx.rma_iov_limit = o.rma_iov_limit;
    rx.caps = o.rx_caps;
    rx.mode = o.mode;
    rx.op_flags = o.rx_op_flags;
    rx.msg_order = o.msg_order;
    rx.comp_order = 0;
    rx.total_buffered_recv = 0;
    rx.size = o.rx_size;
    rx.iov_limit = o.iov_limit;
    ep.type_ = sys::fi_ep_type_FI_EP_RDM;
    ep.protocol = sys::FI_PROTO_UNSPEC;
    ep.protocol_version = 1;
    ep.max_msg_size = o.max_msg_size;
    ep.msg_prefix_size = 0;
    ep.mem_tag_format = o.mem_tag_format;
    ep.tx_ctx_cnt = 1;
    ep.rx_ctx_cnt = 1;
    d.name = strdup(c"metaroce");
    d.threading = o.threading;
    d.control_progress = o.control_progress;
    d.data_progress = o.data_progress;
    d.resource_mgmt = o.resource_mgmt;
    d.av_type = o.av_type;
    d.mr_mode = o.mr_mode as c_int;
    d.mr_key_size = o.mr_key_size;
    d.cq_data_size = o.cq_data_size;
    d.cq_cnt = 1 << 10;
    d.ep_cnt = 1 << 10;
    d.tx_ctx_cnt = 1 << 10;
    d.rx_ctx_cnt = 1 << 10;
    d.max_ep_tx_ctx = 1;
    d.max_ep_rx_ctx = 1;
    d.max_ep_stx_ctx = 0;
    d.max_ep_srx_ctx = 0;
    d.cntr_cnt = 1 << 10;
    d.mr_iov_limit = 1;
    d.caps = o.domain_caps;
    d.mode = 0;
    d.max_err_data = 256;
    d.mr_cnt = 1 << 16;
    f.name = strdup(c"metaroce");
    // prov_name stays NULL: the core fills it in.
    f.prov_version = super::PROVIDER_VERSION;
    f.api_version = super::fi_version(1, 17);
}

/// The provider's `getinfo`.
///
/// # Safety
/// Called by libfabric's core with valid (or null) arguments.
pub(super) unsafe extern "C" fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    fi_flags: u64,
    hints: *const sys::fi_info,
    info: *mut *mut sys::fi_info,
) -> c_int {
    if info.is_null() {
        return super::neg(flags::EINVAL);
    }
    // SAFETY: the core passes null or valid hints.
    let h = unsafe { hints.as_ref() }.map(|h| {
        // SAFETY: as above, with valid attribute pointers.
        unsafe { read_hints(h) }
    });
    // The core asks with "metaroce;ofi_rxm"-style names when it looks for
    // utility layering over this provider: not ours to answer, not a warning.
    if h.as_ref()
        .and_then(|h| h.prov_name.as_deref())
        .is_some_and(|n| n.contains(';'))
    {
        log::debug("fi_getinfo: a layered provider name is not metaroce's own");
        return super::neg(flags::ENODATA);
    }
    let cfg = config();
    let offer = match caps::check(h.as_ref(), version, cfg.eager_limit) {
        Ok(o) => o,
        Err(why) => {
            let line = format!("fi_getinfo: metaroce cannot satisfy the hints: {why}");
            // Utility providers probe every provider for every endpoint
            // type; a mismatch of type alone is not worth a warning.
            if why.contains("endpoint type") {
                log::info(&line);
            } else {
                log::warn(&line);
            }
            return super::neg(flags::ENODATA);
        }
    };
    // SAFETY: null or valid C strings, per the API.
    let (node_s, service_s) = unsafe { (opt_str(node), opt_str(service)) };
    let addr = match resolve(node_s.as_deref(), service_s.as_deref()) {
        Ok(a) => a,
        Err(why) => {
            log::warn(&format!(
                "fi_getinfo: metaroce cannot use the address: {why}"
            ));
            return super::neg(flags::ENODATA);
        }
    };
    let (src, dest) = if fi_flags & flags::SOURCE != 0 || node_s.is_none() {
        (addr.filter(|a| a.ip != Ipv4Addr::UNSPECIFIED), None)
    } else {
        (None, addr.filter(|a| a.cm_port != 0))
    };
    // SAFETY: `fi_dupinfo(NULL)` allocates an fi_info with every attribute.
    let fi = unsafe { sys::fi_dupinfo(std::ptr::null()) };
    if fi.is_null() {
        return super::neg(flags::ENOMEM);
    }
    // SAFETY: `fi` is freshly allocated by the core and ours to fill.
    unsafe {
        fill(&mut *fi, &offer, src, dest);
        *info = fi;
    }
    0
}
