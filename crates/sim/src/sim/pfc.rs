//! Priority flow control (802.1Qbb) on the data priority, per ingress port.
//!
//! A switch counts the data bytes each ingress port has put in its buffer.
//! At XOFF it sends PAUSE to the port feeding that ingress; the frame takes
//! a link delay to land, and the bytes still in flight meanwhile fill the
//! headroom (beyond it they are dropped and counted). Once the ingress
//! drains to XON it sends RESUME. The thresholds are `fabric::PfcConfig`;
//! the signal is written once, in `pfc_signal`.

use super::Sim;
use crate::event::EventKind;
use crate::time::Ps;
use crate::transport::TransportFactory;

impl<F: TransportFactory> Sim<F> {
    /// Whether data of `bytes` arriving on switch `s`'s `in_port` overflows
    /// the PFC headroom (never, with PFC off).
    #[inline]
    pub(super) fn pfc_beyond_headroom(&self, s: u32, in_port: u16, bytes: u64) -> bool {
        self.cfg.pfc.is_some_and(|pfc| {
            let sw = &self.switches[s as usize];
            let i = in_port as usize;
            pfc.beyond_headroom(sw.ingress_bytes[i], bytes, sw.pfc_headroom[i])
        })
    }

    /// Data from `in_port` was queued at switch `s`: pause the upstream if
    /// the ingress reached XOFF.
    #[inline]
    pub(super) fn pfc_after_enqueue(&mut self, now: Ps, s: u32, in_port: u16) {
        let Some(pfc) = self.cfg.pfc else {
            return;
        };
        let sw = &self.switches[s as usize];
        let i = in_port as usize;
        if !sw.paused_upstream[i] && pfc.must_pause(sw.ingress_bytes[i]) {
            self.pfc_signal(now, s, in_port, true);
        }
    }

    /// Data from `in_port` left switch `s`: resume the upstream if it is
    /// paused and the ingress drained to XON.
    #[inline]
    pub(super) fn pfc_after_dequeue(&mut self, now: Ps, s: u32, in_port: u16) {
        let Some(pfc) = self.cfg.pfc else {
            return;
        };
        let sw = &self.switches[s as usize];
        let i = in_port as usize;
        if sw.paused_upstream[i] && pfc.may_resume(sw.ingress_bytes[i]) {
            self.pfc_signal(now, s, in_port, false);
        }
    }

    /// Send PAUSE (`pause`) or RESUME from switch `s`'s ingress `in_port`
    /// to the port feeding it; the frame lands one link delay later.
    fn pfc_signal(&mut self, now: Ps, s: u32, in_port: u16, pause: bool) {
        self.switches[s as usize].paused_upstream[in_port as usize] = pause;
        let (upstream, delay) = self.upstream_of(s, in_port);
        self.events.schedule(
            now + delay,
            EventKind::Pfc {
                port: upstream,
                prio: 0,
                pause,
            },
        );
    }

    /// A PAUSE (`pause`) or RESUME frame reaches port `p`: stop or restart
    /// its data, and account the time paused.
    pub(super) fn pfc_frame_arrives(&mut self, now: Ps, p: u32, pause: bool) {
        let port = &mut self.ports[p as usize];
        if port.paused == pause {
            return;
        }
        port.paused = pause;
        if pause {
            port.c.pauses += 1;
            port.paused_since = now;
        } else {
            port.c.paused_ps += now - port.paused_since;
            self.wake_port(now, p);
        }
    }

    /// The run ends: close the pause intervals still open, for the report.
    pub(super) fn close_pause_intervals(&mut self, now: Ps) {
        for p in &mut self.ports {
            if p.paused {
                p.c.paused_ps += now - p.paused_since;
                p.paused_since = now;
            }
        }
    }
}
