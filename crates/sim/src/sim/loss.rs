//! Where packets die, counted once: every drop and loss in the fabric goes
//! through [`Sim::account_loss`], which splits it into data and control
//! (ACKs, NACKs, CNPs), charges it to its cause, to a monitored link, and to
//! the failure it ran into.
//!
//! A failure record answers the question a failover test asks: after a
//! link, switch or plane fails, how long until no data and no ACK enters
//! the failed part any more (the transport has moved its traffic away)?

use super::Sim;
use super::port::DATA;
use crate::time::Ps;
use crate::topology::NodeRef;
use crate::transport::TransportFactory;

/// Why a packet died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCause {
    /// The egress buffer was full (no trimming).
    Buffer = 0,
    /// Beyond PFC headroom on a lossless ingress.
    Headroom = 1,
    /// Random loss on a link.
    Wire = 2,
    /// A link that was down (or went down with the packet on it or queued).
    Down = 3,
    /// A switch had no live route toward the destination.
    NoRoute = 4,
    /// The scenario's end-to-end loss, drawn once per packet at delivery.
    EndToEnd = 5,
}

/// Losses by cause, data and control apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    /// `[cause][0]` data, `[cause][1]` control.
    pub by_cause: [[u64; 2]; 6],
}

impl LossCounts {
    /// Data packets lost to `cause`.
    pub fn data(&self, cause: LossCause) -> u64 {
        self.by_cause[cause as usize][0]
    }
    /// Control packets (ACKs, NACKs, CNPs, trimmed headers) lost to `cause`.
    pub fn control(&self, cause: LossCause) -> u64 {
        self.by_cause[cause as usize][1]
    }
    /// Data packets lost, every cause.
    pub fn data_total(&self) -> u64 {
        self.by_cause.iter().map(|c| c[0]).sum()
    }
    /// Control packets lost, every cause.
    pub fn control_total(&self) -> u64 {
        self.by_cause.iter().map(|c| c[1]).sum()
    }
}

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailedPart {
    /// The link between two named nodes.
    Link(String, String),
    /// A switch, by name.
    Switch(String),
    /// Every switch of a plane.
    Plane(u32),
}

impl std::fmt::Display for FailedPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Link(a, b) => write!(f, "link {a}-{b}"),
            Self::Switch(s) => write!(f, "switch {s}"),
            Self::Plane(p) => write!(f, "plane {p}"),
        }
    }
}

/// One failure and what still ran into it.
#[derive(Debug, Clone)]
pub struct FailureRecord {
    /// What failed.
    pub part: FailedPart,
    /// When it failed.
    pub at: Ps,
    /// When it came back, if it did.
    pub up_at: Option<Ps>,
    /// Ports (both directions of every link) it took down.
    pub ports: Vec<u32>,
    /// Switches it took down (or that border its link).
    pub switches: Vec<u32>,
    /// Data packets lost into it while it was down.
    pub data_lost: u64,
    /// Control packets lost into it while it was down.
    pub control_lost: u64,
    /// When the last data packet was lost into it.
    pub last_data: Option<Ps>,
    /// When the last control packet was lost into it.
    pub last_control: Option<Ps>,
    /// Whether it is down now.
    pub(super) active: bool,
}

impl<F: TransportFactory> Sim<F> {
    /// Count packet `k`'s loss to `cause` at port `p` (if it died at or on
    /// one) or switch `s` (no route), and free it.
    pub(super) fn account_loss(
        &mut self,
        now: Ps,
        k: u32,
        cause: LossCause,
        p: Option<u32>,
        s: Option<u32>,
    ) {
        let is_data = self.packets.head(k).priority() == DATA;
        let class = usize::from(!is_data);
        self.measured.losses.by_cause[cause as usize][class] += 1;
        if let Some(p) = p {
            let m = self.ports[p as usize].monitor;
            if m != u32::MAX {
                self.measured.monitors[m as usize]
                    .drops
                    .add_at(now / self.bin_ps, 1);
            }
        }
        if matches!(cause, LossCause::Down | LossCause::NoRoute) {
            let f = match (p, s) {
                (Some(p), _) => self.port_failure.get(p as usize).copied(),
                (None, Some(s)) => self.failure_bordering(s),
                _ => None,
            }
            .filter(|&f| f != u32::MAX)
            .or_else(|| self.latest_active_failure());
            if let Some(f) = f {
                let r = &mut self.measured.failures[f as usize];
                if is_data {
                    r.data_lost += 1;
                    r.last_data = Some(now);
                } else {
                    r.control_lost += 1;
                    r.last_control = Some(now);
                }
            }
        }
        self.packets.release(k);
    }

    /// The active failure that took down one of switch `s`'s ports.
    fn failure_bordering(&self, s: u32) -> Option<u32> {
        let sw = &self.switches[s as usize];
        sw.ports
            .iter()
            .map(|&p| self.port_failure[p as usize])
            .find(|&f| f != u32::MAX)
    }

    /// The most recent failure still down.
    fn latest_active_failure(&self) -> Option<u32> {
        self.measured
            .failures
            .iter()
            .rposition(|r| r.active)
            .map(|i| i as u32)
    }

    /// Register a failure of `part` over `ports` at `at` (recovering at
    /// `up_at`), for the report; returns its index.
    pub(super) fn record_failure(
        &mut self,
        part: FailedPart,
        ports: Vec<u32>,
        at: Ps,
        up_at: Option<Ps>,
    ) -> u32 {
        let switches = ports
            .iter()
            .flat_map(|&p| {
                let port = &self.ports[p as usize];
                [port.owner, port.peer]
            })
            .filter_map(|n| match n {
                NodeRef::Switch(s) => Some(s),
                NodeRef::Host(_) => None,
            })
            .collect();
        self.measured.failures.push(FailureRecord {
            part,
            at,
            up_at,
            ports,
            switches,
            data_lost: 0,
            control_lost: 0,
            last_data: None,
            last_control: None,
            active: false,
        });
        self.measured.failures.len() as u32 - 1
    }

    /// Port `p` went down (`up = false`) or up at `now`: mark the failure
    /// it belongs to active or over.
    pub(super) fn failure_state(&mut self, now: Ps, p: u32, up: bool) {
        if up {
            let f = self.port_failure[p as usize];
            self.port_failure[p as usize] = u32::MAX;
            if f != u32::MAX {
                let r = &mut self.measured.failures[f as usize];
                r.active = r.ports.iter().any(|&q| self.port_failure[q as usize] == f);
            }
            return;
        }
        let Some(f) = self
            .measured
            .failures
            .iter()
            .position(|r| r.at == now && r.ports.contains(&p))
        else {
            return;
        };
        self.port_failure[p as usize] = f as u32;
        self.measured.failures[f].active = true;
    }
}
