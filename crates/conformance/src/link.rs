//! How the suite's datagrams reach the target.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

/// A datagram channel to one target. The suite is written against this
/// trait so that its checks can be tested against canned responses.
pub trait Link {
    /// Send one datagram to the target's device port.
    fn send(&mut self, datagram: &[u8]) -> io::Result<()>;
    /// Wait up to `timeout` for a datagram from the target, returning its
    /// length in `buf`, or `None` if none came in time.
    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>>;
}

/// The real link: one UDP socket bound to the suite's device address.
///
/// Datagrams from any IP other than the target's are ignored (the target
/// sends from per-path source ports, so only the IP is compared).
#[derive(Debug)]
pub struct UdpLink {
    socket: UdpSocket,
    target: SocketAddr,
}

impl UdpLink {
    /// Bind `local` and aim at `target`.
    pub fn bind(local: SocketAddr, target: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(local)?;
        Ok(Self { socket, target })
    }

    /// Aim a socket already bound (at the address announced to the
    /// target, before the target's address was known) at `target`.
    pub fn from_socket(socket: UdpSocket, target: SocketAddr) -> Self {
        Self { socket, target }
    }
}

impl Link for UdpLink {
    fn send(&mut self, datagram: &[u8]) -> io::Result<()> {
        self.socket.send_to(datagram, self.target)?;
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        // A zero timeout means "block forever" to the socket.
        self.socket
            .set_read_timeout(Some(timeout.max(Duration::from_micros(100))))?;
        loop {
            match self.socket.recv_from(buf) {
                Ok((n, from)) if from.ip() == self.target.ip() => return Ok(Some(n)),
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
