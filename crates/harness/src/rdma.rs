//! MetaRoCE devices as harness nodes, and helpers to wire QPs between them.
//!
//! [`RdmaNode`] drives a [`Context`] (the verbs API over the sans-IO core)
//! exactly as the UDP datapath does: datagrams in with their source address
//! and ECN codepoint, datagrams out through `poll_transmit`, one timer.

use crate::{Datagram, Network, Node};
use metaroce_verbs::{
    AccessFlags, CompletionQueue, Context, EndpointConfig, MemoryRegion, ProtectionDomain, QpAttr,
    QpCaps, QpInitAttr, QpState, QpType, QueuePair, WorkCompletion,
};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// A MetaRoCE device on the harness network.
#[derive(Debug)]
pub struct RdmaNode {
    /// The device.
    pub ctx: Context,
    ip: IpAddr,
    buf: Vec<u8>,
}

impl RdmaNode {
    /// A device at `ip` with `config`. With `config.auth` set, its
    /// `local_ip` is set to `ip` (the address peers reach the node at), so
    /// one config serves every node of a test.
    ///
    /// # Panics
    /// If the config is invalid (test setup error).
    pub fn new(ip: IpAddr, mut config: EndpointConfig) -> Self {
        if let Some(auth) = &mut config.auth {
            auth.local_ip = ip;
        }
        let ctx = Context::open(config).expect("valid endpoint config");
        let buf = vec![0; ctx.max_datagram_len()];
        Self { ctx, ip, buf }
    }

    /// A crash and a new incarnation at the same address: every QP, region
    /// and connection is gone, and the device comes back with `config`
    /// (give it a new seed: a new session id, new keys).
    pub fn restart(&mut self, config: EndpointConfig) {
        *self = Self::new(self.ip, config);
    }

    /// The address peers use for this device: its IP and device port.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.ctx.device_port())
    }
}

/// The loopback-range address of node `i` (in-memory only, never a socket).
pub fn node_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, (i >> 8) as u8, (i & 0xff) as u8 + 1))
}

impl Node for RdmaNode {
    fn ip(&self) -> IpAddr {
        self.ip
    }

    fn handle_datagram(&mut self, now_ns: u64, datagram: Datagram) {
        self.ctx
            .handle_datagram(now_ns, datagram.src, datagram.ecn, &datagram.payload);
    }

    fn poll_transmit(&mut self, now_ns: u64) -> Option<Datagram> {
        let t = self.ctx.poll_transmit(now_ns, &mut self.buf)?;
        Some(Datagram {
            src: SocketAddr::new(self.ip, t.src_port),
            dst: t.dst,
            ecn: t.ecn,
            payload: self.buf[..t.len].to_vec(),
        })
    }

    fn poll_timeout(&mut self) -> Option<u64> {
        self.ctx.poll_timeout()
    }

    fn handle_timeout(&mut self, now_ns: u64) {
        self.ctx.handle_timeout(now_ns);
    }
}

/// One end of a connected RC QP.
#[derive(Debug, Clone, Copy)]
pub struct QpEnd {
    /// Node index.
    pub node: usize,
    /// Its protection domain.
    pub pd: ProtectionDomain,
    /// The QP.
    pub qp: QueuePair,
    /// Its CQ (send and receive).
    pub cq: CompletionQueue,
}

/// Register `len` bytes with `access` on `end`'s node, in its protection
/// domain (so `end`'s QP may use the region).
pub fn reg_mr(
    net: &mut Network<RdmaNode>,
    end: &QpEnd,
    len: u64,
    access: AccessFlags,
) -> MemoryRegion {
    net.nodes[end.node]
        .ctx
        .reg_mr(end.pd, len, access)
        .expect("register a test region")
}

/// Create an RC QP on node `a` and one on node `b`, each accepting `access`
/// remote operations, and walk both to RTS (the out-of-band exchange of QP
/// numbers and addresses perftest does over TCP happens here in memory).
pub fn connect_qps(
    net: &mut Network<RdmaNode>,
    a: usize,
    b: usize,
    access: AccessFlags,
) -> (QpEnd, QpEnd) {
    connect_qps_in(net, (a, None), (b, None), access)
}

/// [`connect_qps`] with a chosen protection domain at either end (`None`: a
/// new one), so several QPs can reach the same memory region.
pub fn connect_qps_in(
    net: &mut Network<RdmaNode>,
    (a, pd_a): (usize, Option<ProtectionDomain>),
    (b, pd_b): (usize, Option<ProtectionDomain>),
    access: AccessFlags,
) -> (QpEnd, QpEnd) {
    let caps = QpCaps {
        max_send_wr: 4096,
        max_recv_wr: 4096,
    };
    let mut make = |n: usize, pd: Option<ProtectionDomain>| {
        let ctx = &mut net.nodes[n].ctx;
        let pd = pd.unwrap_or_else(|| ctx.alloc_pd());
        let cq = ctx.create_cq(1 << 16).expect("cq");
        let init = QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: caps,
            qp_type: QpType::Rc,
            sq_sig_all: false,
        };
        let qp = ctx.create_qp(pd, &init).expect("qp");
        QpEnd {
            node: n,
            pd,
            qp,
            cq,
        }
    };
    let ea = make(a, pd_a);
    let eb = make(b, pd_b);
    for (me, peer) in [(ea, eb), (eb, ea)] {
        let peer_addr = net.nodes[peer.node].addr();
        // The connection manager's exchange: QP numbers, and the session ids
        // that packet keys are derived from.
        let peer_session = net.nodes[peer.node].ctx.session_id();
        net.nodes[me.node]
            .ctx
            .set_peer_session(peer_addr, peer_session)
            .expect("peer session");
        let mtu = net.nodes[me.node].ctx.endpoint().config().mtu_payload_bytes;
        let ctx = &mut net.nodes[me.node].ctx;
        let to = |s| QpAttr {
            qp_state: Some(s),
            ..QpAttr::default()
        };
        ctx.modify_qp(
            me.qp,
            &QpAttr {
                qp_access_flags: Some(access),
                port_num: Some(1),
                ..to(QpState::Init)
            },
        )
        .expect("init");
        ctx.modify_qp(
            me.qp,
            &QpAttr {
                dest_addr: Some(peer_addr),
                dest_qp_num: Some(peer.qp.qp_num()),
                path_mtu: Some(mtu),
                ..to(QpState::Rtr)
            },
        )
        .expect("rtr");
        ctx.modify_qp(
            me.qp,
            &QpAttr {
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                ..to(QpState::Rts)
            },
        )
        .expect("rts");
    }
    (ea, eb)
}

/// Drain every completion of `cq`.
pub fn poll_all(ctx: &mut Context, cq: CompletionQueue) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 64];
    loop {
        let n = ctx.poll_cq(cq, &mut wc).expect("CQ overrun");
        out.extend_from_slice(&wc[..n]);
        if n < wc.len() {
            return out;
        }
    }
}

/// Build `n` devices with `config` (each seeded differently from `seed`).
pub fn devices(n: usize, config: &EndpointConfig, seed: u64) -> Vec<RdmaNode> {
    (0..n)
        .map(|i| {
            let mut c = config.clone();
            c.seed = seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(i as u64);
            RdmaNode::new(node_ip(i), c)
        })
        .collect()
}
