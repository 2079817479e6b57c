//! A driver for two endpoints in one process: the core's own tests, its
//! benches and the fuzz targets use it, so that each does not carry its own
//! copy of the same plumbing. Not part of the crate's stable API.
//!
//! A [`Pair`] holds endpoints `a` and `b` (any configs, any IPs), a virtual
//! clock, and the wire between them: [`Pair::transfer`] drains one side's
//! transmits into the other at the current time, through an optional
//! [`Filter`] that may drop, duplicate or delay (reorder) each datagram.
//! After every call of the pair, both endpoints have been told its time, so
//! a test may post with the clockless `post_send` and get the pair's time.
//!
//! ```
//! use metaroce_proto::testing::{Pair, Side};
//! use metaroce_proto::EndpointConfig;
//!
//! let a = EndpointConfig { seed: 1, ..EndpointConfig::default() };
//! let b = EndpointConfig { seed: 2, ..EndpointConfig::default() };
//! let mut pair = Pair::new(Pair::A_IP, a, Pair::B_IP, b).unwrap();
//! pair.run(10, 5_000); // nothing to send yet: the clock just moves
//! assert_eq!(pair.now(), 50_000);
//! assert_eq!(pair.addr(Side::B).port(), metaroce_proto::DEFAULT_DEVICE_PORT); // 4793
//! ```

use crate::config::{ConfigError, EndpointConfig};
use crate::endpoint::{Endpoint, QpError};
use crate::qp::QpHandle;
use crate::transmit::Transmit;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// One of the pair's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// Endpoint `a`.
    A,
    /// Endpoint `b`.
    B,
}

impl Side {
    /// The other endpoint.
    pub fn other(self) -> Self {
        match self {
            Self::A => Self::B,
            Self::B => Self::A,
        }
    }

    fn index(self) -> usize {
        match self {
            Self::A => 0,
            Self::B => 1,
        }
    }
}

/// What the wire does with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Hand it over.
    Deliver,
    /// Lose it.
    Drop,
    /// Hand it over twice.
    Duplicate,
    /// Hold it back and hand it over right after the next datagram in the
    /// same direction (or at the end of the transfer, if none follows).
    Delay,
}

/// A datagram as a [`Filter`] sees it.
#[derive(Debug)]
pub struct Hop<'a> {
    /// The side that sent it.
    pub from: Side,
    /// How many datagrams that side sent before this one (through the pair).
    pub index: u64,
    /// Its descriptor.
    pub transmit: &'a Transmit,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// Decides each datagram's [`Fate`].
pub type Filter = Box<dyn FnMut(&Hop<'_>) -> Fate>;

/// Two endpoints, a virtual clock and the wire between them.
pub struct Pair {
    /// Endpoint `a`.
    pub a: Endpoint,
    /// Endpoint `b`.
    pub b: Endpoint,
    ips: [IpAddr; 2],
    now_ns: u64,
    filter: Option<Filter>,
    sent: [u64; 2],
    log: Option<[Vec<Vec<u8>>; 2]>,
    held: Vec<(Transmit, Vec<u8>)>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("ips", &self.ips)
            .field("now_ns", &self.now_ns)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// The IP the tests give endpoint `a` by default.
    pub const A_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    /// The IP the tests give endpoint `b` by default.
    pub const B_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

    /// Endpoint `a` at `a_ip` and `b` at `b_ip` (each at its config's device
    /// port), nothing connected yet, the clock at 0.
    pub fn new(
        a_ip: IpAddr,
        a: EndpointConfig,
        b_ip: IpAddr,
        b: EndpointConfig,
    ) -> Result<Self, ConfigError> {
        let a = Endpoint::new(a)?;
        let b = Endpoint::new(b)?;
        let buf = vec![0; a.max_datagram_len().max(b.max_datagram_len())];
        Ok(Self {
            a,
            b,
            ips: [a_ip, b_ip],
            now_ns: 0,
            filter: None,
            sent: [0; 2],
            log: None,
            held: Vec::new(),
            buf,
        })
    }

    /// The endpoint on `side`.
    pub fn endpoint(&self, side: Side) -> &Endpoint {
        match side {
            Side::A => &self.a,
            Side::B => &self.b,
        }
    }

    /// The endpoint on `side`, writable.
    pub fn endpoint_mut(&mut self, side: Side) -> &mut Endpoint {
        match side {
            Side::A => &mut self.a,
            Side::B => &mut self.b,
        }
    }

    /// The address peers name `side` by: its IP and device port.
    pub fn addr(&self, side: Side) -> SocketAddr {
        let port = self.endpoint(side).config().device_port;
        SocketAddr::new(self.ips[side.index()], port)
    }

    /// The connection manager's exchange: each side learns the other's
    /// session id (needed before `connect` when authentication is on).
    pub fn exchange_sessions(&mut self) -> Result<(), QpError> {
        let (sa, sb) = (self.a.session_id(), self.b.session_id());
        let (addr_a, addr_b) = (self.addr(Side::A), self.addr(Side::B));
        self.a.set_peer_session(addr_b, sb)?;
        self.b.set_peer_session(addr_a, sa)
    }

    /// Bind `a`'s QP `qa` and `b`'s QP `qb` to each other.
    pub fn connect(&mut self, qa: QpHandle, qb: QpHandle) -> Result<(), QpError> {
        let (addr_a, addr_b) = (self.addr(Side::A), self.addr(Side::B));
        self.a.connect_qp(qa, addr_b, qb.qpn())?;
        self.b.connect_qp(qb, addr_a, qa.qpn())
    }

    // ------------------------------------------------------------- the clock

    /// The pair's time, ns.
    pub fn now(&self) -> u64 {
        self.now_ns
    }

    /// Set the clock (forward only) and tell both endpoints, without
    /// firing timers.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        self.a.set_time(self.now_ns);
        self.b.set_time(self.now_ns);
    }

    /// Move the clock on by `ns` and fire both endpoints' due timers.
    pub fn advance(&mut self, ns: u64) {
        self.set_now(self.now_ns + ns);
        self.a.handle_timeout(self.now_ns);
        self.b.handle_timeout(self.now_ns);
    }

    /// The earlier of the two endpoints' deadlines.
    pub fn next_deadline(&mut self) -> Option<u64> {
        match (self.a.poll_timeout(), self.b.poll_timeout()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }

    // -------------------------------------------------------------- the wire

    /// Decide every datagram's fate with `filter` from now on (`None`:
    /// deliver everything).
    pub fn set_filter(&mut self, filter: Option<Filter>) {
        self.filter = filter;
    }

    /// Keep (or stop keeping) a copy of every datagram each side sends
    /// through the pair, delivered or not: [`sent`](Self::sent).
    pub fn record(&mut self, on: bool) {
        self.log = on.then(Default::default);
    }

    /// The datagrams `side` sent while recording, oldest first.
    pub fn sent(&self, side: Side) -> &[Vec<u8>] {
        self.log.as_ref().map_or(&[], |log| &log[side.index()][..])
    }

    /// Hand one datagram from `from` to the other side at the pair's time,
    /// from the sending path's source port (no filter, no record).
    #[inline]
    pub fn deliver(&mut self, from: Side, transmit: &Transmit, bytes: &[u8]) {
        let src = SocketAddr::new(self.ips[from.index()], transmit.src_port);
        let now = self.now_ns;
        self.endpoint_mut(from.other())
            .handle_datagram(now, src, transmit.ecn, bytes);
    }

    /// Drain everything `from` may send now, without delivering it.
    pub fn poll_transmits(&mut self, from: Side) -> Vec<(Transmit, Vec<u8>)> {
        let mut out = Vec::new();
        let now = self.now_ns;
        let mut buf = std::mem::take(&mut self.buf);
        while let Some(t) = self.endpoint_mut(from).poll_transmit(now, &mut buf) {
            out.push((t, buf[..t.len].to_vec()));
        }
        self.buf = buf;
        out
    }

    /// Drain everything `from` may send now into the other side, through
    /// the filter; returns how many datagrams `from` sent.
    pub fn transfer(&mut self, from: Side) -> usize {
        let now = self.now_ns;
        let mut buf = std::mem::take(&mut self.buf);
        let mut sent = 0;
        loop {
            let sender = self.endpoint_mut(from);
            let max_len = sender.max_datagram_len();
            let Some(t) = sender.poll_transmit(now, &mut buf) else {
                break;
            };
            assert!(t.len <= max_len, "a datagram longer than max_datagram_len");
            sent += 1;
            let bytes = &buf[..t.len];
            if let Some(log) = &mut self.log {
                log[from.index()].push(bytes.to_vec());
            }
            let index = self.sent[from.index()];
            self.sent[from.index()] += 1;
            let fate = match &mut self.filter {
                Some(filter) => filter(&Hop {
                    from,
                    index,
                    transmit: &t,
                    bytes,
                }),
                None => Fate::Deliver,
            };
            match fate {
                Fate::Deliver => self.deliver(from, &t, bytes),
                Fate::Drop => continue,
                Fate::Duplicate => {
                    self.deliver(from, &t, bytes);
                    self.deliver(from, &t, bytes);
                }
                Fate::Delay => {
                    self.held.push((t, bytes.to_vec()));
                    continue;
                }
            }
            self.release_held(from);
        }
        self.release_held(from);
        self.buf = buf;
        sent
    }

    fn release_held(&mut self, from: Side) {
        for (t, bytes) in std::mem::take(&mut self.held) {
            self.deliver(from, &t, &bytes);
        }
    }

    /// One exchange: `a`'s datagrams to `b`, then `b`'s to `a`; returns
    /// how many moved.
    pub fn step(&mut self) -> usize {
        self.transfer(Side::A) + self.transfer(Side::B)
    }

    /// `rounds` times: an exchange, then the clock moves `round_ns` on and
    /// due timers fire.
    pub fn run(&mut self, rounds: usize, round_ns: u64) {
        for _ in 0..rounds {
            self.step();
            self.advance(round_ns);
        }
    }

    /// Exchange and jump from deadline to deadline until nothing is left to
    /// send and no timer is set, or `max_rounds` exchanges passed; returns
    /// whether the pair went quiet. Every exchange also moves the clock at
    /// least `min_round_ns` on, like a wire's delay.
    pub fn settle(&mut self, max_rounds: usize, min_round_ns: u64) -> bool {
        for _ in 0..max_rounds {
            let moved = self.step();
            match self.next_deadline() {
                None if moved == 0 => return true,
                None => self.advance(min_round_ns),
                // Something moved (an ACK that opened a window, say): the
                // next round is a wire's time away, not the next timer's.
                Some(_) if moved > 0 => self.advance(min_round_ns),
                Some(d) => {
                    let step = d.saturating_sub(self.now_ns).max(min_round_ns);
                    self.advance(step);
                }
            }
        }
        false
    }
}

/// Fixtures for the crate's unit tests.
#[cfg(test)]
pub(crate) mod fixture {
    use super::{Pair, Side};
    use crate::config::EndpointConfig;
    use crate::memory::{AccessFlags, MrInfo};
    use crate::qp::{QpCaps, QpHandle};
    use crate::work::{Completion, Sge, WcStatus};

    /// Every access right.
    pub(crate) const ALL: AccessFlags = AccessFlags(0xf);

    /// One side's QP and region.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct End {
        pub(crate) qp: QpHandle,
        pub(crate) mr: MrInfo,
    }

    impl End {
        /// `len` bytes at `offset` into the region.
        pub(crate) fn sge(&self, offset: u64, len: u32) -> Sge {
            Sge {
                addr: self.mr.addr + offset,
                length: len,
                lkey: self.mr.lkey,
            }
        }
    }

    /// A pair with a 64 KiB region (every right) and a QP (every remote
    /// operation, 64-deep queues) on each side, connected, the clock at
    /// 1 us.
    pub(crate) struct Lab {
        pub(crate) pair: Pair,
        pub(crate) a: End,
        pub(crate) b: End,
    }

    /// Small packets (1 KiB), four paths: a 64 KiB WRITE is 64 packets.
    pub(crate) fn config(seed: u64) -> EndpointConfig {
        EndpointConfig {
            mtu_payload_bytes: 1024,
            paths_per_connection: 4,
            path_port_span: 16,
            seed,
            ..EndpointConfig::default()
        }
    }

    pub(crate) fn lab(a: EndpointConfig, b: EndpointConfig) -> Lab {
        let mut pair = Pair::new(Pair::A_IP, a, Pair::B_IP, b).expect("valid configs");
        let mut end = |side| {
            let ep = pair.endpoint_mut(side);
            let pd = ep.alloc_pd();
            let mr = ep.register_memory(pd, 64 << 10, ALL).expect("region");
            let caps = QpCaps {
                max_send_wr: 64,
                max_recv_wr: 64,
            };
            let qp = ep.create_qp(pd, caps, ALL).expect("QP");
            End { qp, mr }
        };
        let (a, b) = (end(Side::A), end(Side::B));
        pair.connect(a.qp, b.qp).expect("connect");
        pair.set_now(1_000);
        Lab { pair, a, b }
    }

    /// Every completion `side` has, in order.
    pub(crate) fn completions(pair: &mut Pair, side: Side) -> Vec<Completion> {
        let ep = pair.endpoint_mut(side);
        std::iter::from_fn(|| ep.poll_completion()).collect()
    }

    /// Every completion `side` has, in order, as (work request id, status).
    pub(crate) fn statuses(pair: &mut Pair, side: Side) -> Vec<(u64, WcStatus)> {
        completions(pair, side)
            .iter()
            .map(|c| (c.wc.wr_id, c.wc.status))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_and_addresses() {
        let cfg = |seed, device_port| EndpointConfig {
            seed,
            device_port,
            ..EndpointConfig::default()
        };
        let p = Pair::new(Pair::A_IP, cfg(1, 4791), Pair::B_IP, cfg(2, 5000)).unwrap();
        assert_eq!(Side::A.other(), Side::B);
        assert_eq!(p.addr(Side::A), SocketAddr::new(Pair::A_IP, 4791));
        assert_eq!(p.addr(Side::B), SocketAddr::new(Pair::B_IP, 5000));
        assert!(
            Pair::new(Pair::A_IP, cfg(1, 0), Pair::B_IP, {
                EndpointConfig {
                    paths_per_connection: 0,
                    ..cfg(2, 1)
                }
            })
            .is_err()
        );
    }

    fn write_4k(l: &mut fixture::Lab) {
        let (a, b) = (l.a, l.b);
        let wr = crate::work::SendWr::new(
            1,
            crate::work::WrOp::Write {
                remote_addr: b.mr.addr,
                rkey: b.mr.rkey,
            },
            vec![a.sge(0, 4096)],
        );
        l.pair.a.post_send(a.qp, wr).unwrap();
    }

    #[test]
    fn the_filter_drops_duplicates_and_delays() {
        use crate::work::WcStatus;
        for fate in [Fate::Duplicate, Fate::Delay, Fate::Drop] {
            let mut l = fixture::lab(fixture::config(1), fixture::config(2));
            l.pair.record(true);
            l.pair.set_filter(Some(Box::new(move |hop| {
                if hop.from == Side::A && hop.index < 2 {
                    fate
                } else {
                    Fate::Deliver
                }
            })));
            write_4k(&mut l);
            assert!(l.pair.settle(1_000, 1_000), "{fate:?}");
            let wcs = fixture::completions(&mut l.pair, Side::A);
            assert_eq!(wcs.len(), 1);
            assert_eq!(wcs[0].wc.status, WcStatus::Success, "{fate:?}");
            let b = *l.pair.b.stats();
            let sent = l.pair.sent(Side::A).len() as u64;
            match fate {
                Fate::Duplicate => {
                    assert_eq!(b.rx_duplicates, 2);
                    assert_eq!(b.rx_datagrams, sent + 2);
                }
                Fate::Delay => assert_eq!(b.rx_datagrams, sent),
                Fate::Drop => {
                    assert_eq!(b.rx_datagrams, sent - 2);
                    assert!(l.pair.a.stats().data_packets_retransmitted >= 2);
                }
                Fate::Deliver => unreachable!(),
            }
        }
    }
}
