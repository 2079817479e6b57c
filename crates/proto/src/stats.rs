//! The endpoint's counters: every input it drops is counted under its cause,
//! every packet it sends under its kind.

/// Counters of an endpoint. Every dropped input is counted under its cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams handed to `handle_datagram`.
    pub rx_datagrams: u64,
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
    /// ACKs sent.
    pub ack_packets_sent: u64,
    /// Tail-loss probes sent (counted in retransmissions too).
    pub tail_probes: u64,
    /// Path RTOs.
    pub rtos: u64,
    /// Connection retry timeouts.
    pub retry_timeouts: u64,
    /// Paths retired and replaced.
    pub paths_replaced: u64,
    /// Paths retired because they proved dead while others delivered.
    pub path_failovers: u64,
    /// RTOs proved spurious afterwards, and undone.
    pub spurious_rtos: u64,
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
