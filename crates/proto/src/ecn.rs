//! The ECN codepoint a datagram carries (RFC 3168), the one IP-header field
//! the core reads and writes: drivers translate it to and from the TOS byte.

/// ECN codepoint of a datagram (RFC 3168).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Ecn {
    /// Not ECN-capable: a congested queue drops it rather than marking it.
    #[default]
    NotEct,
    /// ECN-capable, not marked: a congested queue may mark it `Ce`.
    Ect0,
    /// Congestion experienced.
    Ce,
}
