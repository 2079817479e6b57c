//! The test catalogue: the perftest-style tests, their names, titles and
//! perftest's defaults.

/// The tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// RDMA WRITE bandwidth.
    WriteBw,
    /// RDMA WRITE ping-pong latency (WRITE with immediate, RTT/2).
    WriteLat,
    /// RDMA READ bandwidth.
    ReadBw,
    /// RDMA READ latency (full round trip).
    ReadLat,
    /// SEND bandwidth.
    SendBw,
    /// SEND ping-pong latency (RTT/2).
    SendLat,
    /// FETCH_ADD bandwidth.
    AtomicBw,
    /// FETCH_ADD latency (full round trip).
    AtomicLat,
}

impl Test {
    /// Every test.
    pub const ALL: [Self; 8] = [
        Self::WriteBw,
        Self::WriteLat,
        Self::ReadBw,
        Self::ReadLat,
        Self::SendBw,
        Self::SendLat,
        Self::AtomicBw,
        Self::AtomicLat,
    ];

    /// The subcommand name.
    pub fn name(self) -> &'static str {
        match self {
            Self::WriteBw => "write-bw",
            Self::WriteLat => "write-lat",
            Self::ReadBw => "read-bw",
            Self::ReadLat => "read-lat",
            Self::SendBw => "send-bw",
            Self::SendLat => "send-lat",
            Self::AtomicBw => "atomic-bw",
            Self::AtomicLat => "atomic-lat",
        }
    }

    /// The test named `s`.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.name() == s)
    }

    /// perftest's title line.
    pub fn title(self) -> &'static str {
        match self {
            Self::WriteBw => "RDMA_Write BW Test",
            Self::WriteLat => "RDMA_Write Latency Test",
            Self::ReadBw => "RDMA_Read BW Test",
            Self::ReadLat => "RDMA_Read Latency Test",
            Self::SendBw => "Send BW Test",
            Self::SendLat => "Send Latency Test",
            Self::AtomicBw => "Atomic FETCH_AND_ADD BW Test",
            Self::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        }
    }

    /// A latency test.
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Self::WriteLat | Self::ReadLat | Self::SendLat | Self::AtomicLat
        )
    }

    /// An atomic test (size is always 8).
    pub fn is_atomic(self) -> bool {
        matches!(self, Self::AtomicBw | Self::AtomicLat)
    }

    /// perftest's default message size.
    pub fn default_size(self) -> u64 {
        if self.is_atomic() {
            8
        } else if self.is_lat() {
            2
        } else {
            65_536
        }
    }

    /// perftest's default iteration count.
    pub fn default_iters(self) -> u64 {
        if self == Self::WriteBw { 5000 } else { 1000 }
    }

    /// perftest's default inline size (`-I` not given): a latency test
    /// inlines WRITEs of up to 220 bytes and SENDs of up to 236, so that
    /// a small payload is copied when posted and not read from the
    /// registered buffer again; bandwidth tests inline nothing.
    pub fn default_inline_bytes(self) -> u32 {
        match self {
            Self::WriteLat => 220,
            Self::SendLat => 236,
            _ => 0,
        }
    }
}
