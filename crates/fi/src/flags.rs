//! libfabric's flag and error values as the provider's code uses them
//! (`u64` flags, positive `i32` error numbers), taken from the generated
//! bindings.

#![allow(dead_code)] // the whole vocabulary, not only what the provider uses today

use crate::ffi::sys;

macro_rules! flags {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`FI_", stringify!($name), "`.")]
            pub(crate) const $name: u64 = paste_flag!($name) as u64;
        )*
    };
}
macro_rules! errors {
    ($($name:ident),* $(,)?) => {
        $(
            #[doc = concat!("`FI_", stringify!($name), "`.")]
            pub(crate) const $name: i32 = paste_flag!($name) as i32;
        )*
    };
}
macro_rules! paste_flag {
    (MSG) => {
        sys::FI_MSG
    };
    (RMA) => {
        sys::FI_RMA
    };
    (TAGGED) => {
        sys::FI_TAGGED
    };
    (ATOMIC) => {
        sys::FI_ATOMIC
    };
    (READ) => {
        sys::FI_READ
    };
    (WRITE) => {
        sys::FI_WRITE
    };
    (RECV) => {
        sys::FI_RECV
    };
    (SEND) => {
        sys::FI_SEND
    };
    (TRANSMIT) => {
        sys::FI_TRANSMIT
    };
    (REMOTE_READ) => {
        sys::FI_REMOTE_READ
    };
    (REMOTE_WRITE) => {
        sys::FI_REMOTE_WRITE
    };
    (MULTI_RECV) => {
        sys::FI_MULTI_RECV
    };
    (REMOTE_CQ_DATA) => {
        sys::FI_REMOTE_CQ_DATA
    };
    (PEEK) => {
        sys::FI_PEEK
    };
    (COMPLETION) => {
        sys::FI_COMPLETION
    };
    (INJECT) => {
        sys::FI_INJECT
    };
    (INJECT_COMPLETE) => {
        sys::FI_INJECT_COMPLETE
    };
    (TRANSMIT_COMPLETE) => {
        sys::FI_TRANSMIT_COMPLETE
    };
    (DELIVERY_COMPLETE) => {
        sys::FI_DELIVERY_COMPLETE
    };
    (MORE) => {
        sys::FI_MORE
    };
    (FENCE) => {
        sys::FI_FENCE
    };
    (LOCAL_COMM) => {
        sys::FI_LOCAL_COMM
    };
    (REMOTE_COMM) => {
        sys::FI_REMOTE_COMM
    };
    (RMA_EVENT) => {
        sys::FI_RMA_EVENT
    };
    (SOURCE) => {
        sys::FI_SOURCE
    };
    (DIRECTED_RECV) => {
        sys::FI_DIRECTED_RECV
    };
    (CLAIM) => {
        sys::FI_CLAIM
    };
    (DISCARD) => {
        sys::FI_DISCARD
    };
    (SELECTIVE_COMPLETION) => {
        sys::FI_SELECTIVE_COMPLETION
    };
    (EVENT) => {
        sys::FI_EVENT
    };
    (SOURCE_ERR) => {
        sys::FI_SOURCE_ERR
    };
    (HMEM) => {
        sys::FI_HMEM
    };
    (COLLECTIVE) => {
        sys::FI_COLLECTIVE
    };
    (MULTICAST) => {
        sys::FI_MULTICAST
    };
    (TRIGGER) => {
        sys::FI_TRIGGER
    };
    (NAMED_RX_CTX) => {
        sys::FI_NAMED_RX_CTX
    };
    (SHARED_AV) => {
        sys::FI_SHARED_AV
    };
    (RMA_PMEM) => {
        sys::FI_RMA_PMEM
    };
    (VARIABLE_MSG) => {
        sys::FI_VARIABLE_MSG
    };
    (AV_USER_ID) => {
        sys::FI_AV_USER_ID
    };
    (PEER) => {
        sys::FI_PEER
    };
    (FETCH_ATOMIC) => {
        sys::FI_FETCH_ATOMIC
    };
    (COMPARE_ATOMIC) => {
        sys::FI_COMPARE_ATOMIC
    };
    (ORDER_SAS) => {
        sys::FI_ORDER_SAS
    };
    (MR_LOCAL) => {
        sys::FI_MR_LOCAL
    };
    (MR_VIRT_ADDR) => {
        sys::FI_MR_VIRT_ADDR
    };
    (MR_ALLOCATED) => {
        sys::FI_MR_ALLOCATED
    };
    (MR_PROV_KEY) => {
        sys::FI_MR_PROV_KEY
    };
    (MR_ENDPOINT) => {
        sys::FI_MR_ENDPOINT
    };
    (MR_RAW) => {
        sys::FI_MR_RAW
    };
    (MR_MMU_NOTIFY) => {
        sys::FI_MR_MMU_NOTIFY
    };
    (MR_RMA_EVENT) => {
        sys::FI_MR_RMA_EVENT
    };
    (MR_HMEM) => {
        sys::FI_MR_HMEM
    };
    (CONTEXT) => {
        sys::FI_CONTEXT
    };
    (MSG_PREFIX) => {
        sys::FI_MSG_PREFIX
    };
    (RX_CQ_DATA) => {
        sys::FI_RX_CQ_DATA
    };
    (ENOENT) => {
        sys::FI_ENOENT
    };
    (EIO) => {
        sys::FI_EIO
    };
    (EAGAIN) => {
        sys::FI_EAGAIN
    };
    (ENOMEM) => {
        sys::FI_ENOMEM
    };
    (EACCES) => {
        sys::FI_EACCES
    };
    (EBUSY) => {
        sys::FI_EBUSY
    };
    (EINVAL) => {
        sys::FI_EINVAL
    };
    (ENOSYS) => {
        sys::FI_ENOSYS
    };
    (ENOMSG) => {
        sys::FI_ENOMSG
    };
    (ENODATA) => {
        sys::FI_ENODATA
    };
    (EMSGSIZE) => {
        sys::FI_EMSGSIZE
    };
    (ENOPROTOOPT) => {
        sys::FI_ENOPROTOOPT
    };
    (EOPNOTSUPP) => {
        sys::FI_EOPNOTSUPP
    };
    (ETIMEDOUT) => {
        sys::FI_ETIMEDOUT
    };
    (EHOSTUNREACH) => {
        sys::FI_EHOSTUNREACH
    };
    (ECONNREFUSED) => {
        sys::FI_ECONNREFUSED
    };
    (EREMOTEIO) => {
        sys::FI_EREMOTEIO
    };
    (ECANCELED) => {
        sys::FI_ECANCELED
    };
    (EAVAIL) => {
        sys::FI_EAVAIL
    };
    (EBADFLAGS) => {
        sys::FI_EBADFLAGS
    };
    (ETRUNC) => {
        sys::FI_ETRUNC
    };
    (ENOKEY) => {
        sys::FI_ENOKEY
    };
    (ETOOSMALL) => {
        sys::FI_ETOOSMALL
    };
    (EOTHER) => {
        sys::FI_EOTHER
    };
    (EADDRNOTAVAIL) => {
        sys::FI_EADDRNOTAVAIL
    };
    (ENOCQ) => {
        sys::FI_ENOCQ
    };
    (ENOAV) => {
        sys::FI_ENOAV
    };
    (EOPBADSTATE) => {
        sys::FI_EOPBADSTATE
    };
}

flags!(
    MSG,
    RMA,
    TAGGED,
    ATOMIC,
    READ,
    WRITE,
    RECV,
    SEND,
    TRANSMIT,
    REMOTE_READ,
    REMOTE_WRITE,
    MULTI_RECV,
    REMOTE_CQ_DATA,
    PEEK,
    COMPLETION,
    INJECT,
    INJECT_COMPLETE,
    TRANSMIT_COMPLETE,
    DELIVERY_COMPLETE,
    MORE,
    FENCE,
    LOCAL_COMM,
    REMOTE_COMM,
    RMA_EVENT,
    SOURCE,
    DIRECTED_RECV,
    CLAIM,
    DISCARD,
    SELECTIVE_COMPLETION,
    EVENT,
    SOURCE_ERR,
    HMEM,
    COLLECTIVE,
    MULTICAST,
    TRIGGER,
    NAMED_RX_CTX,
    SHARED_AV,
    RMA_PMEM,
    VARIABLE_MSG,
    AV_USER_ID,
    PEER,
    FETCH_ATOMIC,
    COMPARE_ATOMIC,
    ORDER_SAS,
    MR_LOCAL,
    MR_VIRT_ADDR,
    MR_ALLOCATED,
    MR_PROV_KEY,
    MR_ENDPOINT,
    MR_RAW,
    MR_MMU_NOTIFY,
    MR_RMA_EVENT,
    MR_HMEM,
    CONTEXT,
    MSG_PREFIX,
    RX_CQ_DATA,
);
errors!(
    ENOENT,
    EIO,
    EAGAIN,
    ENOMEM,
    EACCES,
    EBUSY,
    EINVAL,
    ENOSYS,
    ENOMSG,
    ENODATA,
    EMSGSIZE,
    ENOPROTOOPT,
    EOPNOTSUPP,
    ETIMEDOUT,
    EHOSTUNREACH,
    ECONNREFUSED,
    EREMOTEIO,
    ECANCELED,
    EAVAIL,
    EBADFLAGS,
    ETRUNC,
    ENOKEY,
    ETOOSMALL,
    EOTHER,
    EADDRNOTAVAIL,
    ENOCQ,
    ENOAV,
    EOPBADSTATE,
);

/// `FI_ADDR_UNSPEC`.
pub(crate) const ADDR_UNSPEC: u64 = u64::MAX;
/// `FI_ADDR_NOTAVAIL`.
pub(crate) const ADDR_NOTAVAIL: u64 = u64::MAX;
/// `FI_MR_BASIC` (the API < 1.5 enum value).
pub(crate) const MR_BASIC: u64 = 1;
/// `FI_MR_SCALABLE` (the API < 1.5 enum value).
pub(crate) const MR_SCALABLE: u64 = 2;
/// `FI_TAG_GENERIC`: every tag bit is usable.
pub(crate) const TAG_GENERIC: u64 = 0xAAAA_AAAA_AAAA_AAAA;

/// What the provider supports: primary and secondary capabilities.
pub(crate) const PROVIDER_CAPS: u64 = MSG
    | TAGGED
    | RMA
    | ATOMIC
    | READ
    | WRITE
    | SEND
    | RECV
    | REMOTE_READ
    | REMOTE_WRITE
    | DIRECTED_RECV
    | SOURCE
    | REMOTE_CQ_DATA
    | RMA_EVENT
    | LOCAL_COMM
    | REMOTE_COMM;
/// Capabilities that belong on the transmit side.
pub(crate) const TX_CAPS: u64 = MSG | TAGGED | RMA | ATOMIC | READ | WRITE | SEND;
/// Capabilities that belong on the receive side.
pub(crate) const RX_CAPS: u64 = MSG
    | TAGGED
    | RMA
    | ATOMIC
    | RECV
    | REMOTE_READ
    | REMOTE_WRITE
    | DIRECTED_RECV
    | SOURCE
    | RMA_EVENT;
