//! The endpoint's counters: every input it drops is counted under its cause,
//! every packet it sends under its kind; and the snapshot of every counter
//! of a device, its connections and their paths ([`Counters`]), with the
//! names tools print them under.

use crate::cc::CcMetrics;
use crate::connection::ConnectionStats;
use crate::path::{PathStats, RxPathStats};
use std::net::SocketAddr;

/// Counters of an endpoint. Every dropped input is counted under its cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams handed to `handle_datagram` (or packets to `handle_packet`).
    pub rx_datagrams: u64,
    /// Their bytes (UDP payload).
    pub rx_bytes: u64,
    /// Of them, those that arrived CE marked.
    pub rx_ce_marked: u64,
    /// Datagrams the endpoint produced (data and ACKs).
    pub tx_datagrams: u64,
    /// Their bytes (UDP payload).
    pub tx_bytes: u64,
    /// Datagrams that failed to parse (bad version, length, checksum, field).
    pub rx_malformed: u64,
    /// Datagrams from a device with no connection.
    pub rx_unknown_peer: u64,
    /// Packets naming a QP that is not ours or not bound to that peer.
    pub rx_unknown_qp: u64,
    /// Packets of a retired path generation.
    pub rx_stale_path: u64,
    /// Packets beyond a path's 256-packet window.
    pub rx_out_of_window: u64,
    /// Path-level duplicates.
    pub rx_duplicates: u64,
    /// Operation-level duplicates (already executed).
    pub rx_duplicate_ops: u64,
    /// Operation packets dropped as inconsistent or out of window.
    pub rx_dropped_ops: u64,
    /// Data packets sent (first transmissions).
    pub data_packets_sent: u64,
    /// Data packets resent.
    pub data_packets_retransmitted: u64,
    /// Data packets declared lost.
    pub data_packets_lost: u64,
    /// Data packets that arrived trimmed to their headers by a switch,
    /// and were NACKed (`trim_count` in the next ACK).
    pub rx_trimmed: u64,
    /// Data packets declared lost by a peer's trim NACK (resent at once;
    /// also in `data_packets_lost`).
    pub trim_nacks: u64,
    /// ACKs sent.
    pub ack_packets_sent: u64,
    /// ACKs sent only to carry a raised grant to a sender (admission's
    /// rule 5; also in `ack_packets_sent`).
    pub grants_pushed: u64,
    /// Repair packets sent after short messages while losing packets
    /// (counted in `data_packets_sent` too).
    pub repair_packets_sent: u64,
    /// Copies of cold connections' first packets (`cold_copies`; counted
    /// in `data_packets_sent`, not in `data_packets_retransmitted`).
    pub cold_copies_sent: u64,
    /// Capped (paced) senders' tail copies sent (`tail_copy_packets`;
    /// counted in `data_packets_retransmitted` too). An uncapped sender's
    /// tail copies are resends through its windows and show only there.
    pub tail_copies_sent: u64,
    /// Repair packets received whole.
    pub rx_repair_packets: u64,
    /// Data packets rebuilt from repair packets instead of waiting for
    /// their resend.
    pub rx_repaired_packets: u64,
    /// Tail-loss probes sent: resends of a silent path's newest segment
    /// (counted in retransmissions too), or, for a paced sender, its next
    /// new data packet on that path (not a retransmission).
    pub tail_probes: u64,
    /// Tail-loss probes the device's budget for speculative packets
    /// refused (asked again a probe timeout later).
    pub probes_deferred: u64,
    /// Path RTOs.
    pub rtos: u64,
    /// Connection retry timeouts.
    pub retry_timeouts: u64,
    /// Paths retired and replaced.
    pub paths_replaced: u64,
    /// Paths retired because they proved dead while others delivered.
    pub path_failovers: u64,
    /// Retired paths that were heard from afterwards (their packets had
    /// arrived; the silence was a stall): each raises the stall allowance.
    pub spurious_failovers: u64,
    /// Path RTOs proved spurious afterwards (a packet they gave up on
    /// arrived: the peer's host or a queue stalled), and undone. Each RTO
    /// counts once, so on a healthy run, where nothing is lost, it equals
    /// `rtos`.
    pub spurious_rtos: u64,
    /// Other timers that gave up on a path's packets (a retry round, an
    /// unanswered probe of a silent connection) proved spurious the same
    /// way (each raises the stall allowance as a spurious RTO does).
    pub spurious_give_ups: u64,
    /// Path RTOs whose packets were proved lost: a later packet of the
    /// path arrived while the first given up on had not (the PSN floor
    /// held below it). `rtos` less this and `spurious_rtos` were not
    /// decided (no ACK of the path came after them, or a floor had to
    /// move past them).
    pub rtos_proved_lost: u64,
    /// Packets given up on for a SACK gap that arrived after all: the
    /// fabric reorders within a route (each proof widens the connection's
    /// reordering window).
    pub spurious_gap_losses: u64,
    /// Suspect paths (cross-path RACK) whose packet from before their
    /// probe was acknowledged after it: late behind a queue, not lost
    /// (each widens the device's path skew).
    pub late_suspects: u64,
    /// Unanswered probes on silent connections (packets sent again elsewhere).
    pub probe_timeouts: u64,
    /// Losses not taken as congestion (no recent ECN on their path).
    pub random_losses: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// Fatal NAKs sent (remote access, invalid request).
    pub naks_sent: u64,
    /// Remote accesses refused by the memory checks (unknown or wrong rkey,
    /// other protection domain, missing right, out of bounds); each ends in
    /// a `RemAccessErr` NAK and no byte moves.
    pub rx_remote_access_denied: u64,
    /// Packets dropped because accepting them would pass a limit (a path
    /// slot at or above `max_peer_paths`, a READ or atomic while the
    /// connection holds `max_outstanding_ops_per_connection` messages, an
    /// incoming message scattered into more byte ranges than the core keeps).
    pub rx_over_limit: u64,
    /// With authentication configured: datagrams without the AUTHENTICATED
    /// flag (plain ICRC packets), dropped unread.
    pub rx_unauthenticated: u64,
    /// With authentication configured: datagrams whose tag did not verify
    /// under the connection's key (forged, modified, corrupted, wrong key).
    pub rx_auth_failed: u64,
    /// With authentication configured: datagrams whose packet number was
    /// seen before or fell below the anti-replay window.
    pub rx_replayed: u64,
}

/// Implements `fields()` for a counters struct: every counter by its name,
/// in declaration order. The names are what `metaroce perf --stats` prints
/// and the simulator's `counters.csv` heads its columns with.
macro_rules! named_counters {
    ($t:ty { $($f:ident),* $(,)? }) => {
        impl $t {
            /// Every counter as `(name, value)`, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), u64::from(self.$f))),*]
            }
        }
    };
}

impl EndpointStats {
    /// RTOs not yet decided either way: neither proved spurious by a later
    /// ACK nor proved lost.
    pub fn rtos_undecided(&self) -> u64 {
        self.rtos
            .saturating_sub(self.spurious_rtos)
            .saturating_sub(self.rtos_proved_lost)
    }

    /// What became of the timeouts and resends, in one line.
    pub fn timeout_fates(&self) -> String {
        format!(
            "rtos {} (proved spurious {}, proved lost {}, undecided {}), retry rounds {} (give-ups proved spurious {}), tail probes {}, resent {} of {} data packets, lost {}",
            self.rtos,
            self.spurious_rtos,
            self.rtos_proved_lost,
            self.rtos_undecided(),
            self.retry_timeouts,
            self.spurious_give_ups,
            self.tail_probes,
            self.data_packets_retransmitted,
            self.data_packets_sent,
            self.data_packets_lost
        )
    }
}

named_counters!(EndpointStats {
    rx_datagrams,
    rx_bytes,
    rx_ce_marked,
    tx_datagrams,
    tx_bytes,
    rx_malformed,
    rx_unknown_peer,
    rx_unknown_qp,
    rx_stale_path,
    rx_out_of_window,
    rx_duplicates,
    rx_duplicate_ops,
    rx_dropped_ops,
    data_packets_sent,
    data_packets_retransmitted,
    data_packets_lost,
    rx_trimmed,
    trim_nacks,
    ack_packets_sent,
    grants_pushed,
    repair_packets_sent,
    cold_copies_sent,
    tail_copies_sent,
    rx_repair_packets,
    rx_repaired_packets,
    tail_probes,
    probes_deferred,
    rtos,
    retry_timeouts,
    paths_replaced,
    path_failovers,
    spurious_failovers,
    spurious_rtos,
    spurious_give_ups,
    rtos_proved_lost,
    spurious_gap_losses,
    late_suspects,
    probe_timeouts,
    random_losses,
    rnr_naks_sent,
    naks_sent,
    rx_remote_access_denied,
    rx_over_limit,
    rx_unauthenticated,
    rx_auth_failed,
    rx_replayed,
});

named_counters!(ConnectionStats {
    data_packets_sent,
    data_packets_retransmitted,
    data_packets_lost,
    acks_sent,
    acks_received,
    payload_bytes_sent,
    wire_bytes_sent,
    wire_bytes_retransmitted,
    tail_probes,
    probes_deferred,
    data_packets_received,
    payload_bytes_received,
    duplicates_received,
    ce_marked_received,
    ce_marks_echoed,
    rtos,
    retry_timeouts,
    paths_replaced,
    path_failovers,
    spurious_failovers,
    spurious_rtos,
    spurious_give_ups,
    rtos_proved_lost,
    spurious_gap_losses,
    probe_timeouts,
    rnr_naks,
    rtt_samples,
    rtt_min_ns,
    srtt_ns,
    rtt_p99_ns,
    window_bytes,
    inflight_bytes,
});

named_counters!(PathStats {
    packets_sent,
    bytes_sent,
    packets_retransmitted,
    bytes_retransmitted,
    tail_probes,
    packets_acked,
    packets_lost,
    rtos,
    ce_marks,
    replacements,
    src_port,
    generation,
    rtt_min_ns,
    srtt_ns,
    window_bytes,
    inflight_bytes,
});

named_counters!(RxPathStats {
    generation,
    packets_received,
    payload_bytes_received,
    ce_marked,
    duplicates,
});

named_counters!(CcMetrics {
    rate_cap_bps,
    ecn_reductions,
    loss_reductions,
    rto_reductions,
    random_losses,
});

/// One connection's counters at one moment: its own, its congestion
/// controller's and each path's (by slot).
#[derive(Debug, Clone, PartialEq)]
pub struct PeerCounters {
    /// The peer device (IP and device port).
    pub peer: SocketAddr,
    /// The connection's counters and current RTT and window.
    pub connection: ConnectionStats,
    /// Its congestion controller's counters.
    pub cc: CcMetrics,
    /// Each path's counters and current state, by slot (empty until the
    /// connection first sends).
    pub paths: Vec<PathStats>,
    /// Each receive path's counters (the peer's paths toward this side),
    /// by the peer's slot; `None` for a slot the peer has not sent on.
    pub rx_paths: Vec<Option<RxPathStats>>,
}

/// Every counter of an endpoint at one moment: the device's and each open
/// connection's (by peer address). A connection's counters go when it
/// closes; the device's stay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// The device's counters.
    pub device: EndpointStats,
    /// The open connections, ordered by peer.
    pub connections: Vec<PeerCounters>,
}

impl Counters {
    /// Labelled lines, the way `ethtool -S` reads: the device's counters
    /// under their own names, then per connection `conn.<peer>.<name>`
    /// (the controller's as `conn.<peer>.cc_<name>`), then per sending
    /// path `path.<peer>.<slot>.<name>`, then per receive path (the peer's
    /// slot) `rxpath.<peer>.<slot>.<name>`.
    pub fn lines(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .device
            .fields()
            .into_iter()
            .map(|(n, v)| (n.to_owned(), v))
            .collect();
        for c in &self.connections {
            let peer = c.peer;
            out.extend(
                c.connection
                    .fields()
                    .into_iter()
                    .map(|(n, v)| (format!("conn.{peer}.{n}"), v)),
            );
            out.extend(
                c.cc.fields()
                    .into_iter()
                    .map(|(n, v)| (format!("conn.{peer}.cc_{n}"), v)),
            );
        }
        for c in &self.connections {
            let peer = c.peer;
            for (slot, p) in c.paths.iter().enumerate() {
                out.extend(
                    p.fields()
                        .into_iter()
                        .map(|(n, v)| (format!("path.{peer}.{slot}.{n}"), v)),
                );
            }
        }
        for c in &self.connections {
            let peer = c.peer;
            for (slot, rx) in c.rx_paths.iter().enumerate() {
                let Some(rx) = rx else { continue };
                out.extend(
                    rx.fields()
                        .into_iter()
                        .map(|(n, v)| (format!("rxpath.{peer}.{slot}.{n}"), v)),
                );
            }
        }
        out
    }
}

/// Write `lines` as `name value`, one a line, names padded to one column.
pub fn format_counter_lines(lines: &[(String, u64)]) -> String {
    let width = lines.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut s = String::new();
    for (n, v) in lines {
        s.push_str(&format!("{n:<width$} {v}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of a struct is listed in its `fields()` (a counter added
    /// to the struct but not to the list would not be printed).
    fn all_listed(debug: &str, fields: &[(&'static str, u64)]) {
        let declared = debug.matches(": ").count();
        assert_eq!(declared, fields.len(), "{debug}");
        for (name, _) in fields {
            assert!(debug.contains(&format!("{name}: ")), "{name} in {debug}");
        }
    }

    #[test]
    fn every_counter_is_named() {
        let e = EndpointStats::default();
        all_listed(&format!("{e:?}"), &e.fields());
        let c = ConnectionStats::default();
        all_listed(&format!("{c:?}"), &c.fields());
        let p = PathStats::default();
        all_listed(&format!("{p:?}"), &p.fields());
        let r = RxPathStats::default();
        all_listed(&format!("{r:?}"), &r.fields());
        let m = CcMetrics::default();
        // connection_window is the connection's window_bytes already.
        assert_eq!(format!("{m:?}").matches(": ").count(), m.fields().len() + 1);
    }

    #[test]
    fn lines_are_labelled_by_peer_and_slot() {
        let peer: SocketAddr = "10.0.0.2:4793".parse().unwrap();
        let counters = Counters {
            device: EndpointStats {
                rx_datagrams: 7,
                ..EndpointStats::default()
            },
            connections: vec![PeerCounters {
                peer,
                connection: ConnectionStats {
                    rtos: 3,
                    ..ConnectionStats::default()
                },
                cc: CcMetrics::default(),
                paths: vec![
                    PathStats::default(),
                    PathStats {
                        rtos: 2,
                        ..PathStats::default()
                    },
                ],
                rx_paths: vec![
                    None,
                    Some(RxPathStats {
                        packets_received: 5,
                        ..RxPathStats::default()
                    }),
                ],
            }],
        };
        let lines = counters.lines();
        let get = |n: &str| lines.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
        assert_eq!(get("rx_datagrams"), Some(7));
        assert_eq!(get("conn.10.0.0.2:4793.rtos"), Some(3));
        assert_eq!(get("path.10.0.0.2:4793.1.rtos"), Some(2));
        assert_eq!(get("conn.10.0.0.2:4793.cc_ecn_reductions"), Some(0));
        assert_eq!(get("rxpath.10.0.0.2:4793.1.packets_received"), Some(5));
        assert!(get("rxpath.10.0.0.2:4793.0.packets_received").is_none());
        let text = format_counter_lines(&lines);
        assert!(
            text.lines().all(|l| l.split_whitespace().count() == 2),
            "{text}"
        );
    }
}
