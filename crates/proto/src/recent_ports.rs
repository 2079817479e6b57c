//! A small memory of source ports that recently failed.
//!
//! A route is a property of the 5-tuple: a port whose packets (or whose
//! ACKs) died on a failed link will die there again. Replacements and moved
//! ACK routes skip what is remembered here; the memory is bounded, the
//! oldest forgotten first, because a link may be repaired and avoiding a
//! healthy port costs one port of the span, nothing more (four ACK ports;
//! 64 retired data ports, see `replacement_ports.rs`).

/// The last `N` distinct ports noted (0: an empty entry, never a port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecentPorts<const N: usize> {
    ports: [u16; N],
    next: u8,
}

impl<const N: usize> RecentPorts<N> {
    /// Nothing remembered.
    pub(crate) const fn new() -> Self {
        Self {
            ports: [0; N],
            next: 0,
        }
    }

    /// Remember `port`, forgetting the oldest entry if full (a port held
    /// already is not taken twice; 0 is ignored).
    pub(crate) fn note(&mut self, port: u16) {
        if port == 0 || self.contains(port) {
            return;
        }
        self.ports[usize::from(self.next) % N] = port;
        self.next = self.next.wrapping_add(1);
    }

    /// Whether `port` is remembered.
    pub(crate) fn contains(&self, port: u16) -> bool {
        port != 0 && self.ports.contains(&port)
    }
}

#[cfg(test)]
mod tests {
    use super::RecentPorts;

    #[test]
    fn keeps_the_last_distinct_ports() {
        let mut m = RecentPorts::<2>::new();
        assert!(!m.contains(0));
        m.note(0);
        m.note(10);
        m.note(10);
        m.note(11);
        assert!(m.contains(10) && m.contains(11));
        m.note(12);
        assert!(!m.contains(10) && m.contains(11) && m.contains(12));
    }
}
