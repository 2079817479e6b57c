//! What `query_device` and `query_port` report: the limits and the link of
//! a device, with ibverbs' names where the concept is the same, and units
//! in the name where ibverbs uses a code (an MTU is bytes here, a rate
//! bits/s).

/// How atomics relate to other accesses of the same memory
/// (`ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic with respect to this device's other atomics only.
    Hca,
    /// Atomic with respect to every access: the application reaches a
    /// region's bytes only through the context (`mr_bytes`), never while
    /// the core runs an atomic on them.
    Glob,
}

/// `ibv_device_attr`: the device's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Queue pairs at once.
    pub max_qp: u32,
    /// Work requests any work queue may hold (the smaller of the send and
    /// receive limits, as ibverbs has one figure for both).
    pub max_qp_wr: u32,
    /// Outstanding send work requests per QP.
    pub max_send_wr: u32,
    /// Posted receives per QP.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per work request: the core sets no limit of
    /// its own (each entry is checked and kept as one range).
    pub max_sge: u32,
    /// Completion queues at once.
    pub max_cq: u32,
    /// Completions one CQ holds.
    pub max_cqe: u32,
    /// Memory regions at once.
    pub max_mr: u32,
    /// Bytes of the largest region (also bounded by what is registered
    /// already: `max_registered_bytes` over all regions).
    pub max_mr_size: u64,
    /// Atomic semantics.
    pub atomic_cap: AtomicCap,
    /// Peer devices at once (a MetaRoCE connection carries every QP toward
    /// one peer).
    pub max_connections: u32,
    /// Physical ports: one.
    pub phys_port_cnt: u8,
}

/// `ibv_port_state`, as far as it applies: a MetaRoCE port is its UDP
/// sockets, up once the device is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Not usable.
    Down,
    /// Usable: QPs may be connected and carry traffic.
    Active,
}

/// `ibv_port_attr`: the port's link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Whether the port is usable.
    pub state: PortState,
    /// Largest payload per packet the device supports, bytes.
    pub max_mtu_bytes: u32,
    /// Payload per packet in use, bytes (a QP's `path_mtu` may not exceed it).
    pub active_mtu_bytes: u32,
    /// Largest message one work request may carry, bytes.
    pub max_msg_bytes: u32,
    /// The local link's rate, bits/s (what the congestion controller and
    /// the receiver's rate hint assume).
    pub link_rate_bps: u64,
    /// The UDP port peers send to (with the IP, the device's address).
    pub device_port: u16,
    /// Paths (UDP source ports, hence ECMP routes) per connection.
    pub paths_per_connection: usize,
}
