//! Packets as parsed headers, without payload bytes: the form the fabric
//! simulator carries between endpoints. The same protocol code runs on it
//! as on real datagrams; only serialization, the ICRC and payload copies
//! are skipped.

use metaroce_wire as wire;

/// A packet as parsed headers, without payload bytes: what the fabric
/// simulator carries between endpoints (the endpoint's `poll_packet` and
/// `handle_packet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketRepr {
    /// A data packet; its payload is `repr.payload_len` bytes of nothing.
    Data(wire::DataRepr),
    /// An ACK.
    Ack(Box<wire::AckRepr>),
}

impl PacketRepr {
    /// Bytes the packet occupies on the wire (UDP payload, ICRC included).
    pub fn wire_len(&self) -> usize {
        match self {
            Self::Data(d) => d.buffer_len(),
            Self::Ack(a) => a.buffer_len(),
        }
    }
}

/// Where the endpoint's `poll_packet_into` writes a packet: it keeps the
/// box of the last ACK taken out, so a simulator polling millions of ACKs
/// allocates one box, not one per ACK.
#[derive(Debug, Default)]
pub struct PacketSlot {
    packet: Option<PacketRepr>,
    spare_ack: Option<Box<wire::AckRepr>>,
}

impl PacketSlot {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    /// The packet last written, until the next poll.
    pub fn packet(&self) -> Option<&PacketRepr> {
        self.packet.as_ref()
    }

    /// Take the packet out (its ACK box is then the caller's).
    pub fn take(&mut self) -> Option<PacketRepr> {
        self.packet.take()
    }

    /// Empty the slot, keeping an ACK's box for the next ACK.
    pub(crate) fn clear(&mut self) {
        if let Some(PacketRepr::Ack(ack)) = self.packet.take() {
            self.spare_ack = Some(ack);
        }
    }

    pub(crate) fn put_data(&mut self, repr: wire::DataRepr) {
        self.clear();
        self.packet = Some(PacketRepr::Data(repr));
    }

    pub(crate) fn put_ack(&mut self, repr: wire::AckRepr) {
        self.clear();
        let ack = match self.spare_ack.take() {
            Some(mut spare) => {
                *spare = repr;
                spare
            }
            None => Box::new(repr),
        };
        self.packet = Some(PacketRepr::Ack(ack));
    }
}
