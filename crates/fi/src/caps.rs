//! What the provider offers, and the check of an application's
//! `fi_getinfo` hints against it. Every refusal says which hint and why,
//! so the log line a user sees names the cause instead of a bare
//! `FI_ENODATA`.

use crate::flags;

/// `FI_VERSION(1, 5)`: from here on `mr_mode` is a bit mask.
pub const API_1_5: u32 = (1 << 16) | 5;

/// The hints that matter, read out of an `fi_info` (zero = unspecified).
#[derive(Debug, Clone, Default)]
pub struct Hints {
    pub caps: u64,
    pub mode: u64,
    pub addr_format: u32,
    pub ep_type: u32,
    pub max_msg_size: usize,
    pub mem_tag_format: u64,
    pub tx_ctx_cnt: usize,
    pub rx_ctx_cnt: usize,
    pub tx_caps: u64,
    pub tx_op_flags: u64,
    pub tx_msg_order: u64,
    pub tx_comp_order: u64,
    pub inject_size: usize,
    pub tx_size: usize,
    pub tx_iov_limit: usize,
    pub rma_iov_limit: usize,
    pub rx_caps: u64,
    pub rx_op_flags: u64,
    pub rx_msg_order: u64,
    pub rx_comp_order: u64,
    pub rx_size: usize,
    pub rx_iov_limit: usize,
    pub has_domain_attr: bool,
    pub domain_name: Option<String>,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub resource_mgmt: u32,
    pub av_type: u32,
    pub mr_mode: u64,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub domain_caps: u64,
    pub fabric_name: Option<String>,
    pub prov_name: Option<String>,
}

/// The provider's answer to acceptable hints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub caps: u64,
    pub mode: u64,
    pub tx_caps: u64,
    pub rx_caps: u64,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub msg_order: u64,
    pub inject_size: usize,
    pub tx_size: usize,
    pub rx_size: usize,
    pub iov_limit: usize,
    pub rma_iov_limit: usize,
    pub max_msg_size: usize,
    pub mem_tag_format: u64,
    pub threading: u32,
    pub control_progress: u32,
    pub data_progress: u32,
    pub resource_mgmt: u32,
    pub av_type: u32,
    pub mr_mode: u64,
    pub mr_key_size: usize,
    pub cq_data_size: usize,
    pub domain_caps: u64,
}

/// Provider name.
pub const NAME: &str = "metaroce";

// Enum values, as in the headers (checked against the bindings in the ffi tests).
const EP_RDM: u32 = 3;
const ADDR_SOCKADDR: u32 = 1;
const ADDR_SOCKADDR_IN: u32 = 2;
const THREAD_SAFE: u32 = 1;
const PROGRESS_AUTO: u32 = 1;
const PROGRESS_MANUAL: u32 = 2;
const RM_ENABLED: u32 = 2;
const AV_MAP: u32 = 1;
const AV_TABLE: u32 = 2;

/// Queue depths the provider reports.
pub const TX_SIZE: usize = 1 << 14;
/// Receive queue depth.
pub const RX_SIZE: usize = 1 << 14;
/// Largest message (rendezvous READs are at most 2^31 - 1 bytes).
pub const MAX_MSG: usize = (1 << 31) - 1;
/// Iovec entries per message.
pub const IOV_LIMIT: usize = 8;

fn name_ok(what: &str, v: &Option<String>) -> Result<(), String> {
    match v {
        Some(n) if !n.eq_ignore_ascii_case(NAME) => Err(format!(
            "hints ask for {what} \"{n}\"; this provider's is \"{NAME}\""
        )),
        _ => Ok(()),
    }
}

fn caps_names(bits: u64) -> String {
    let named: &[(u64, &str)] = &[
        (flags::ATOMIC, "FI_ATOMIC"),
        (flags::MULTI_RECV, "FI_MULTI_RECV"),
        (flags::HMEM, "FI_HMEM"),
        (flags::COLLECTIVE, "FI_COLLECTIVE"),
        (flags::MULTICAST, "FI_MULTICAST"),
        (flags::TRIGGER, "FI_TRIGGER"),
        (flags::NAMED_RX_CTX, "FI_NAMED_RX_CTX"),
        (flags::SHARED_AV, "FI_SHARED_AV"),
        (flags::RMA_PMEM, "FI_RMA_PMEM"),
        (flags::VARIABLE_MSG, "FI_VARIABLE_MSG"),
        (flags::SOURCE_ERR, "FI_SOURCE_ERR"),
        (flags::AV_USER_ID, "FI_AV_USER_ID"),
        (flags::PEER, "FI_PEER"),
    ];
    let mut out: Vec<String> = named
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| (*n).to_string())
        .collect();
    let rest = named.iter().fold(bits, |acc, (b, _)| acc & !b);
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    out.join("|")
}

/// Check `h` (or no hints) for API `version` with an eager limit of
/// `eager_limit`; the offer, or why not.
pub fn check(h: Option<&Hints>, version: u32, eager_limit: usize) -> Result<Offer, String> {
    let mut o = Offer {
        caps: flags::PROVIDER_CAPS,
        mode: 0,
        tx_caps: flags::TX_CAPS,
        rx_caps: flags::RX_CAPS,
        tx_op_flags: 0,
        rx_op_flags: 0,
        msg_order: flags::ORDER_SAS,
        inject_size: eager_limit,
        tx_size: TX_SIZE,
        rx_size: RX_SIZE,
        iov_limit: IOV_LIMIT,
        rma_iov_limit: 1,
        max_msg_size: MAX_MSG,
        mem_tag_format: flags::TAG_GENERIC,
        threading: THREAD_SAFE,
        control_progress: PROGRESS_AUTO,
        data_progress: PROGRESS_MANUAL,
        resource_mgmt: RM_ENABLED,
        av_type: 0,
        mr_mode: if version >= API_1_5 {
            flags::MR_PROV_KEY | flags::MR_VIRT_ADDR
        } else {
            flags::MR_BASIC
        },
        mr_key_size: 8,
        cq_data_size: 8,
        domain_caps: flags::LOCAL_COMM | flags::REMOTE_COMM,
    };
    let Some(h) = h else {
        return Ok(o);
    };
    name_ok("provider", &h.prov_name)?;
    name_ok("fabric", &h.fabric_name)?;
    name_ok("domain", &h.domain_name)?;
    if h.ep_type != 0 && h.ep_type != EP_RDM {
        return Err(format!(
            "hints ask for endpoint type {} (only FI_EP_RDM = {EP_RDM} is offered)",
            h.ep_type
        ));
    }
    let all_caps = h.caps | h.tx_caps | h.rx_caps;
    let missing = all_caps & !flags::PROVIDER_CAPS;
    if missing != 0 {
        return Err(format!(
            "hints ask for capabilities {} that metaroce does not offer",
            caps_names(missing)
        ));
    }
    if h.addr_format != 0 && h.addr_format != ADDR_SOCKADDR_IN && h.addr_format != ADDR_SOCKADDR {
        return Err(format!(
            "hints ask for address format {} (metaroce addresses are FI_SOCKADDR_IN)",
            h.addr_format
        ));
    }
    if h.max_msg_size > MAX_MSG {
        return Err(format!(
            "hints ask for max_msg_size {} > {MAX_MSG}",
            h.max_msg_size
        ));
    }
    if h.tx_ctx_cnt > 1 || h.rx_ctx_cnt > 1 {
        return Err(
            "hints ask for more than one tx/rx context per endpoint (no scalable endpoints)".into(),
        );
    }
    if h.inject_size > eager_limit {
        return Err(format!(
            "hints ask for inject_size {} > {eager_limit} (raise FI_METAROCE_EAGER_LIMIT)",
            h.inject_size
        ));
    }
    if h.tx_size > TX_SIZE || h.rx_size > RX_SIZE {
        return Err(format!(
            "hints ask for queue sizes tx {} / rx {} (at most {TX_SIZE} / {RX_SIZE})",
            h.tx_size, h.rx_size
        ));
    }
    if h.tx_iov_limit > IOV_LIMIT || h.rx_iov_limit > IOV_LIMIT || h.rma_iov_limit > 1 {
        return Err(format!(
            "hints ask for iov limits tx {} / rx {} / rma {} (at most {IOV_LIMIT} / {IOV_LIMIT} / 1)",
            h.tx_iov_limit, h.rx_iov_limit, h.rma_iov_limit
        ));
    }
    let order = h.tx_msg_order | h.rx_msg_order;
    if order & !flags::ORDER_SAS != 0 {
        return Err(format!(
            "hints ask for message ordering {order:#x}; metaroce guarantees FI_ORDER_SAS only"
        ));
    }
    if h.tx_comp_order != 0 || h.rx_comp_order != 0 {
        return Err("hints ask for completion ordering (only FI_ORDER_NONE)".into());
    }
    if h.cq_data_size > 8 {
        return Err(format!("hints ask for cq_data_size {} > 8", h.cq_data_size));
    }
    if h.mr_key_size > 8 {
        return Err(format!("hints ask for mr_key_size {} > 8", h.mr_key_size));
    }
    if h.domain_caps & !(flags::LOCAL_COMM | flags::REMOTE_COMM) != 0 {
        return Err(format!(
            "hints ask for domain capabilities {:#x}",
            h.domain_caps
        ));
    }
    if h.data_progress == PROGRESS_AUTO {
        return Err("hints ask for FI_PROGRESS_AUTO data progress: metaroce's transport progresses on its own, but \
                    matching and rendezvous run inside the application's libfabric calls (FI_PROGRESS_MANUAL)"
            .into());
    }
    if h.resource_mgmt == 1 {
        // FI_RM_DISABLED is a promise by the application; the provider may
        // still protect itself, which it does.
    }
    if h.caps != 0 {
        // Primary capabilities as asked; secondary ones the provider always has.
        let secondary = flags::SOURCE
            | flags::DIRECTED_RECV
            | flags::RMA_EVENT
            | flags::LOCAL_COMM
            | flags::REMOTE_COMM
            | flags::REMOTE_CQ_DATA;
        o.caps = h.caps | (flags::PROVIDER_CAPS & secondary & h.caps);
        // Asking for FI_RMA / FI_ATOMIC / FI_MSG / FI_TAGGED without a
        // direction means both.
        let mut c = o.caps;
        if c & (flags::MSG | flags::TAGGED) != 0 && c & (flags::SEND | flags::RECV) == 0 {
            c |= flags::SEND | flags::RECV;
        }
        if c & (flags::RMA | flags::ATOMIC) != 0
            && c & (flags::READ | flags::WRITE | flags::REMOTE_READ | flags::REMOTE_WRITE) == 0
        {
            c |= flags::READ | flags::WRITE | flags::REMOTE_READ | flags::REMOTE_WRITE;
        }
        o.caps = c;
        o.tx_caps = c & flags::TX_CAPS;
        o.rx_caps = c & flags::RX_CAPS;
    }
    if h.tx_caps != 0 {
        o.tx_caps = h.tx_caps;
    }
    if h.rx_caps != 0 {
        o.rx_caps = h.rx_caps;
    }
    o.tx_op_flags = h.tx_op_flags;
    o.rx_op_flags = h.rx_op_flags;
    if h.mem_tag_format != 0 {
        o.mem_tag_format = h.mem_tag_format;
    }
    if h.threading != 0 {
        o.threading = h.threading;
    }
    if h.control_progress != 0 {
        o.control_progress = h.control_progress;
    }
    if h.av_type == AV_MAP || h.av_type == AV_TABLE {
        o.av_type = h.av_type;
    }
    if h.cq_data_size != 0 {
        o.cq_data_size = h.cq_data_size;
    }
    if h.has_domain_attr {
        o.mr_mode = mr_mode_for(h.mr_mode, version);
    }
    Ok(o)
}

/// The `mr_mode` to run with, given the application's.
///
/// The provider needs no local descriptors and no particular addressing:
/// it gives provider keys and virtual addresses when the application
/// allows them, and otherwise takes the application's keys and offsets.
pub fn mr_mode_for(asked: u64, version: u32) -> u64 {
    if version < API_1_5 {
        return if asked == flags::MR_SCALABLE {
            flags::MR_SCALABLE
        } else {
            flags::MR_BASIC
        };
    }
    if asked == flags::MR_BASIC {
        return flags::MR_BASIC;
    }
    if asked == flags::MR_SCALABLE {
        return flags::MR_SCALABLE;
    }
    asked & (flags::MR_PROV_KEY | flags::MR_VIRT_ADDR)
}

/// Whether an `mr_mode` has the provider pick keys, and whether remote
/// addresses are virtual addresses.
pub fn mr_semantics(mr_mode: u64, version: u32) -> (bool, bool) {
    if version < API_1_5 || mr_mode == flags::MR_BASIC || mr_mode == flags::MR_SCALABLE {
        let basic = mr_mode != flags::MR_SCALABLE;
        return (basic, basic);
    }
    (
        mr_mode & flags::MR_PROV_KEY != 0,
        mr_mode & flags::MR_VIRT_ADDR != 0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: u32 = (1 << 16) | 17;

    #[test]
    fn no_hints_offers_everything() {
        let o = check(None, V, 16384).unwrap();
        assert!(o.caps & flags::TAGGED != 0 && o.caps & flags::RMA != 0);
        assert_eq!(o.msg_order, flags::ORDER_SAS);
        assert_eq!(o.mr_mode, flags::MR_PROV_KEY | flags::MR_VIRT_ADDR);
    }

    #[test]
    fn open_mpi_mtl_hints_pass() {
        let h = Hints {
            caps: flags::TAGGED | flags::REMOTE_CQ_DATA | flags::DIRECTED_RECV,
            mode: flags::CONTEXT,
            ep_type: EP_RDM,
            tx_msg_order: flags::ORDER_SAS,
            rx_msg_order: flags::ORDER_SAS,
            tx_op_flags: flags::COMPLETION,
            has_domain_attr: true,
            resource_mgmt: RM_ENABLED,
            av_type: AV_MAP,
            threading: 2,
            mr_mode: flags::MR_LOCAL
                | flags::MR_ALLOCATED
                | flags::MR_PROV_KEY
                | flags::MR_VIRT_ADDR,
            ..Hints::default()
        };
        let o = check(Some(&h), V, 16384).unwrap();
        assert!(o.caps & flags::DIRECTED_RECV != 0);
        assert_eq!(o.mode, 0);
        assert_eq!(o.tx_op_flags, flags::COMPLETION);
        assert_eq!(o.mr_mode, flags::MR_PROV_KEY | flags::MR_VIRT_ADDR);
        assert_eq!(o.av_type, AV_MAP);
    }

    #[test]
    fn refusals_say_why() {
        let h = Hints {
            caps: flags::TAGGED | flags::MULTI_RECV,
            ..Hints::default()
        };
        let e = check(Some(&h), V, 16384).unwrap_err();
        assert!(e.contains("FI_MULTI_RECV"), "{e}");
        let h = Hints {
            prov_name: Some("tcp".into()),
            ..Hints::default()
        };
        assert!(check(Some(&h), V, 16384).unwrap_err().contains("tcp"));
        let h = Hints {
            ep_type: 1,
            ..Hints::default()
        };
        assert!(check(Some(&h), V, 16384).unwrap_err().contains("FI_EP_RDM"));
        let h = Hints {
            data_progress: PROGRESS_AUTO,
            ..Hints::default()
        };
        assert!(
            check(Some(&h), V, 16384)
                .unwrap_err()
                .contains("FI_PROGRESS_AUTO")
        );
    }

    #[test]
    fn atomic_hints_pass_with_both_directions() {
        let h = Hints {
            caps: flags::ATOMIC | flags::RMA,
            ep_type: EP_RDM,
            ..Hints::default()
        };
        let o = check(Some(&h), V, 16384).unwrap();
        assert!(o.caps & flags::ATOMIC != 0);
        assert_eq!(
            o.tx_caps & (flags::ATOMIC | flags::READ | flags::WRITE),
            flags::ATOMIC | flags::READ | flags::WRITE
        );
        assert_eq!(
            o.rx_caps & (flags::ATOMIC | flags::REMOTE_READ | flags::REMOTE_WRITE),
            flags::ATOMIC | flags::REMOTE_READ | flags::REMOTE_WRITE
        );
        assert!(check(None, V, 16384).unwrap().caps & flags::ATOMIC != 0);
    }

    #[test]
    fn mr_modes() {
        assert_eq!(mr_mode_for(0, V), 0);
        assert_eq!(mr_semantics(0, V), (false, false));
        assert_eq!(mr_mode_for(flags::MR_BASIC, (1 << 16) | 4), flags::MR_BASIC);
        assert_eq!(mr_semantics(flags::MR_BASIC, (1 << 16) | 4), (true, true));
        assert_eq!(mr_semantics(flags::MR_SCALABLE, V), (false, false));
    }
}
